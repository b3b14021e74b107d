package kvevents

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/go-zeromq/zmq4/transport"
)

// MaxMessageBytes bounds one ZMQ message from a publisher. vLLM's batches are one engine
// step's cache changes, at most a few thousand block hashes of 9 bytes, far below this; zmq4
// itself would allocate whatever size a frame header announces.
const MaxMessageBytes = 4 << 20

// maxFrames bounds the frames of one message (vLLM sends 3), each of which zmq4 keeps.
const maxFrames = 16

// zmtpGreetingBytes is the size of ZMTP 3's greeting, which precedes the first frame.
const zmtpGreetingBytes = 64

// limitedTCP is zmq4's TCP transport with each connection wrapped in a frameLimitConn. It is
// registered under its own scheme so that other zmq4 users keep the plain one.
const limitedTCP = "kvevents-tcp"

var registerLimitedTCP = sync.OnceValue(func() error {
	return zmq4.RegisterTransport(limitedTCP, frameLimitTransport{transport.New("tcp")})
})

type frameLimitTransport struct{ transport.Transport }

func (t frameLimitTransport) Dial(ctx context.Context, dialer transport.Dialer, addr string) (net.Conn, error) {
	c, err := t.Transport.Dial(ctx, dialer, addr)
	if err != nil {
		return nil, err
	}
	// zmq4's handshake has no deadline and is not ended by closing the socket: a peer that
	// accepts and never speaks ZMTP would hold Dial, and so Close, for as long as it likes.
	if err := c.SetDeadline(time.Now().Add(handshakeTimeout)); err != nil {
		c.Close()
		return nil, err
	}
	lost, _ := ctx.Value(lostKey{}).(chan struct{})
	fc := &frameLimitConn{Conn: c, greeting: zmtpGreetingBytes, handshaking: true, lost: lost}
	fc.stop = context.AfterFunc(ctx, func() { c.Close() })
	return fc, nil
}

// handshakeTimeout bounds the greeting and the first command (READY) from the publisher.
const handshakeTimeout = 10 * time.Second

// frameLimitConn reads ZMTP frame headers as they pass and fails the connection when a
// message would exceed MaxMessageBytes or maxFrames, before zmq4 allocates for it.
type frameLimitConn struct {
	net.Conn
	greeting     int    // greeting bytes still to pass
	header       []byte // the current frame header, as far as read
	body         uint64 // body bytes of the current frame still to pass
	more         bool   // the current frame is not its message's last
	messageBytes uint64
	frames       int
	// handshaking: the deadline set at dial holds until the first message (READY) has passed.
	handshaking bool
	// lost is signalled when the connection fails after its handshake, for the subscriber
	// to dial again; stop cancels closing the connection with the socket.
	lost chan struct{}
	stop func() bool
}

// Close closes the connection and forgets it.
func (c *frameLimitConn) Close() error {
	c.stop()
	return c.Conn.Close()
}

func (c *frameLimitConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	verr := c.watch(p[:n])
	switch {
	case c.handshaking && (verr != nil || err != nil):
		// Closed here, and not an io.EOF, which would make zmq4 dial again at once, in a loop
		// as fast as a peer that accepts and hangs up: Dial fails, and run tries a second later.
		c.Close()
		return 0, fmt.Errorf("kvevents: ZMTP handshake: %v", errors.Join(verr, err))
	case verr != nil:
		c.Close()
		c.signalLost()
		return 0, verr
	case err != nil:
		c.signalLost()
		return n, err
	}
	if c.handshaking && c.greeting == 0 && c.frames > 0 && !c.more && c.body == 0 && len(c.header) == 0 {
		c.handshaking = false
		if derr := c.Conn.SetDeadline(time.Time{}); derr != nil && err == nil {
			err = derr
		}
	}
	return n, err
}

// signalLost tells the subscriber, if it listens, that the connection failed.
func (c *frameLimitConn) signalLost() {
	select {
	case c.lost <- struct{}{}:
	default:
	}
}

func (c *frameLimitConn) watch(b []byte) error {
	for len(b) > 0 {
		switch {
		case c.greeting > 0:
			// ZMTP 3's greeting opens with its signature: 0xFF, 8 bytes, 0x7F.
			at := zmtpGreetingBytes - c.greeting
			if (at == 0 && b[0] != 0xFF) || (at == 9 && b[0] != 0x7F) {
				return errors.New("kvevents: the peer does not speak ZMTP")
			}
			c.greeting--
			b = b[1:]
		case c.body > 0:
			k := min(c.body, uint64(len(b)))
			c.body -= k
			b = b[k:]
			continue
		default:
			c.header = append(c.header, b[0])
			b = b[1:]
			const flagMore, flagLong = 0x01, 0x02
			want := 2
			if c.header[0]&flagLong != 0 {
				want = 9
			}
			if len(c.header) < want {
				continue
			}
			size := uint64(c.header[1])
			if want == 9 {
				size = binary.BigEndian.Uint64(c.header[1:9])
			}
			if !c.more { // a new message starts
				c.messageBytes, c.frames = 0, 0
			}
			c.more = c.header[0]&flagMore != 0
			c.header = c.header[:0]
			c.frames++
			if size > MaxMessageBytes-c.messageBytes || c.frames > maxFrames {
				return fmt.Errorf("kvevents: publisher sent a message over %d bytes or %d frames", MaxMessageBytes, maxFrames)
			}
			c.messageBytes += size
			c.body = size
		}
	}
	return nil
}
