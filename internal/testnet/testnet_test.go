package testnet

import (
	"net"
	"strconv"
	"testing"
	"time"
)

func TestPortIsFreeAndWaitSeesAListener(t *testing.T) {
	port := Port(t)
	ln, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(port))
	if err != nil {
		t.Fatalf("port %d was not free: %v", port, err)
	}
	defer ln.Close()
	WaitListening(t, ln.Addr().String(), time.Second)
}
