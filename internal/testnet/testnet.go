// Package testnet holds the loopback helpers the tests of several packages
// share: free ports for servers they start, and waiting for one to listen.
package testnet

import (
	"net"
	"strconv"
	"testing"
	"time"
)

// Addr returns a loopback address whose port was free a moment ago.
func Addr(t testing.TB) string {
	t.Helper()
	return Addrs(t, 1)[0]
}

// Addrs returns n loopback addresses whose ports were free a moment ago,
// all different: each is held until all are taken. (Taken one at a time, a
// port closed after the first pick can come back as the second; Caddy
// listens with SO_REUSEPORT, so an admin and a site on one port would
// share connections.)
func Addrs(t testing.TB, n int) []string {
	t.Helper()
	out := make([]string, n)
	for i := range out {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		out[i] = ln.Addr().String()
	}
	return out
}

// Port returns a loopback port that was free a moment ago.
func Port(t testing.TB) int {
	t.Helper()
	_, port, _ := net.SplitHostPort(Addr(t))
	n, err := strconv.Atoi(port)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// WaitListening waits until addr accepts a connection, failing the test
// after within.
func WaitListening(t testing.TB, addr string, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			c.Close()
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s never listened: %v", addr, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
