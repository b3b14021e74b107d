package kvevents

import (
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/lmwarden/caddy-warden/internal/testnet"
	"github.com/lmwarden/caddy-warden/internal/testrun"
)

const topic = "kv-events"

// newTestSubscriber is a Subscriber fed by handle alone, with no socket.
func newTestSubscriber(maxBlocks int) *Subscriber {
	return &Subscriber{topic: topic, chains: NewChains(maxBlocks)}
}

func stored(hashes ...uint64) map[string]any {
	return map[string]any{"type": "BlockStored", "block_hashes": hashes, "parent_block_hash": nil,
		"token_ids": []uint32{1, 2}, "block_size": 16, "lora_id": nil, "medium": "GPU", "lora_name": nil, "group_idx": 0}
}

func removed(hashes ...uint64) map[string]any {
	return map[string]any{"type": "BlockRemoved", "block_hashes": hashes, "medium": "GPU"}
}

var cleared = map[string]any{"type": "AllBlocksCleared"}

// message builds the frames vLLM sends for one batch: [ts, events, dp_rank].
func message(t *testing.T, seq uint64, events ...any) [][]byte {
	t.Helper()
	payload, err := msgpack.Marshal([]any{1789095808.8, events, 0})
	if err != nil {
		t.Fatal(err)
	}
	return [][]byte{[]byte(topic), binary.BigEndian.AppendUint64(nil, seq), payload}
}

func TestStoredRemovedCleared(t *testing.T) {
	s := newTestSubscriber(100)
	s.handle(message(t, 0, stored(11, 12, 13), stored(14)))
	if got := s.Cached([]uint64{11, 12, 13, 14, 15}); got != 4 {
		t.Fatalf("Cached = %d, want 4", got)
	}
	s.handle(message(t, 1, removed(12)))
	if got := s.Cached([]uint64{11, 12, 13}); got != 1 {
		t.Fatalf("after removing block 2: Cached = %d, want 1 (a hit stops at the first miss)", got)
	}
	s.handle(message(t, 2, cleared, stored(99)))
	if got, st := s.Cached([]uint64{11}), s.Stats(); got != 0 || st.Blocks != 1 || st.Batches != 3 || st.Gaps != 0 || st.Garbage != 0 {
		t.Fatalf("after clear: Cached = %d, stats %+v", got, st)
	}
}

func TestLegacyArrayEventsAndByteHashes(t *testing.T) {
	s := newTestSubscriber(100)
	hash7 := []byte{0xaa, 0, 0, 0, 0, 0, 0, 0, 0, 7} // the last 8 bytes are the integer form
	s.handle(message(t, 0,
		[]any{"BlockStored", []any{uint64(1 << 63), -5, hash7}, nil, []uint32{1}, 16, nil, "GPU"},
		[]any{"BlockStored", []uint64{40}, nil, []uint32{1}, 16, nil, "CPU"}, // offloaded: not in GPU cache
		[]any{"BlockRemoved", []uint64{-5 & (1<<64 - 1)}, "GPU"},
		[]any{"SomeFutureEvent", 1, 2},
	))
	if st := s.Stats(); st.Garbage != 0 || st.Blocks != 2 {
		t.Fatalf("stats %+v, want 2 blocks and no garbage", st)
	}
	if got := s.Cached([]uint64{1 << 63, -5 & (1<<64 - 1), 7}); got != 1 {
		t.Fatalf("Cached = %d, want 1: block 7 is there but the chain breaks at the removed one", got)
	}
	if s.Cached([]uint64{7}) != 1 || s.Cached([]uint64{40}) != 0 {
		t.Fatal("a bytes hash must be read as its last 8 bytes, and a CPU block must not count")
	}
}

func TestSequenceGapsAndRestart(t *testing.T) {
	s := newTestSubscriber(100)
	s.handle(message(t, 0, stored(1)))
	s.handle(message(t, 1, stored(2)))
	s.handle(message(t, 3, stored(3))) // batch 2 was lost
	if st := s.Stats(); st.Gaps != 1 || st.Blocks != 3 {
		t.Fatalf("after a skipped batch: %+v", st)
	}
	s.handle(message(t, 0, stored(9))) // the publisher restarted with an empty cache
	if st := s.Stats(); st.Gaps != 2 || st.Blocks != 1 || s.Cached([]uint64{9}) != 1 {
		t.Fatalf("after a restart: %+v", st)
	}
	late := newTestSubscriber(100)
	late.handle(message(t, 5, stored(1)))
	if st := late.Stats(); st.Gaps != 1 {
		t.Fatalf("joining mid-stream must count as a gap: %+v", st)
	}
}

func TestGarbageIsCountedAndSkipped(t *testing.T) {
	s := newTestSubscriber(100)
	s.handle(message(t, 0, stored(1)))
	good := message(t, 1, stored(2))
	bad := [][][]byte{
		{[]byte(topic), good[1]},                                                                              // two frames
		{[]byte("other"), good[1], good[2]},                                                                   // another topic
		{[]byte(topic), []byte{1, 2, 3}, good[2]},                                                             // short sequence
		{[]byte(topic), good[1], []byte("not msgpack at all")},                                                // garbage payload
		{[]byte(topic), good[1], good[2][:len(good[2])-3]},                                                    // truncated
		{[]byte(topic), good[1], append(append([]byte{}, good[2]...), 0xc0)},                                  // trailing bytes
		{[]byte(topic), good[1], {0xdd, 0xff, 0xff, 0xff, 0xff}},                                              // array of 4G elements, none sent
		{[]byte(topic), good[1], mustMarshal(t, []any{1.0, []any{map[string]any{"block_hashes": []int{5}}}})}, // no type
		{[]byte(topic), good[1], mustMarshal(t, []any{1.0, []any{map[string]any{"type": "BlockStored"}}})},    // no hashes
		{[]byte(topic), good[1], mustMarshal(t, []any{1.0, []any{stored(5), map[string]any{"type": "BlockStored", "block_hashes": []string{"x"}}}})}, // half bad
		{[]byte(topic), good[1], nested(1000)}, // ts nested 1,000 deep
		{[]byte(topic), good[1], mustMarshal(t, []any{1.0, []any{stored(make([]uint64, maxBatchHashes+1)...)}})}, // too many hashes
		{[]byte(topic), good[1], mustMarshal(t, []any{1.0, []any{stored(make([]uint64, maxBatchHashes/2)...), stored(make([]uint64, maxBatchHashes/2+1)...)}})},
	}
	for i, m := range bad {
		if len(m[1]) == 8 {
			m[1] = binary.BigEndian.AppendUint64(nil, uint64(1+i)) // in sequence: no restart
		}
		s.handle(m)
	}
	st := s.Stats()
	if st.Garbage != uint64(len(bad)) || st.Blocks != 1 || s.Cached([]uint64{5}) != 0 {
		t.Fatalf("after %d bad messages: %+v (a bad batch must apply nothing)", len(bad), st)
	}
	s.handle(message(t, uint64(len(bad)+1), stored(2)))
	if s.Cached([]uint64{1}) != 1 || s.Cached([]uint64{2}) != 1 {
		t.Fatal("a good batch after garbage must still apply")
	}
}

// nested is a batch whose ts is an array nested depth deep, then nil: msgpack's own Skip
// recursed once per level, and a publisher's 4 MiB of it overflowed the stack.
func nested(depth int) []byte {
	b := []byte{0x93} // [ts, events, rank]
	b = append(b, strings.Repeat("\x91", depth)...)
	return append(b, 0xc0, 0x90, 0x00) // nil]]], [], 0
}

func mustMarshal(t *testing.T, v any) []byte {
	t.Helper()
	b, err := msgpack.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestSetIsCapped(t *testing.T) {
	s := newTestSubscriber(3)
	s.handle(message(t, 0, stored(1, 2, 3, 4, 5)))
	if st := s.Stats(); st.Blocks != 3 || st.Overflows != 2 {
		t.Fatalf("stats %+v, want 3 blocks and 2 overflows", st)
	}
	s.handle(message(t, 1, removed(1), stored(6)))
	if s.Cached([]uint64{6}) != 1 {
		t.Fatal("room made by a removal must be usable")
	}
}

// frame encodes one ZMTP frame header for a body of size bytes.
func frame(more bool, size uint64) []byte {
	flags := byte(0)
	if more {
		flags |= 0x01
	}
	if size <= 255 {
		return []byte{flags, byte(size)}
	}
	return binary.BigEndian.AppendUint64([]byte{flags | 0x02}, size)
}

func TestFrameLimit(t *testing.T) {
	greeting := make([]byte, zmtpGreetingBytes)
	greeting[0], greeting[9] = 0xFF, 0x7F // ZMTP 3's signature
	http := &frameLimitConn{greeting: zmtpGreetingBytes}
	if err := http.watch([]byte("HTTP/1.1 400 Bad Request\r\n")); err == nil {
		t.Fatal("a peer that does not speak ZMTP must fail the connection")
	}
	ok := &frameLimitConn{greeting: zmtpGreetingBytes}
	stream := append(append([]byte{}, greeting...), frame(true, 3)...)
	stream = append(stream, "abc"...)
	stream = append(stream, frame(false, 1000)...)
	stream = append(stream, make([]byte, 1000)...)
	for i := range stream { // byte by byte: headers may split across reads
		if err := ok.watch(stream[i : i+1]); err != nil {
			t.Fatalf("a small message was refused: %v", err)
		}
	}
	huge := &frameLimitConn{greeting: zmtpGreetingBytes}
	if err := huge.watch(append(greeting, frame(false, 1<<40)...)); err == nil {
		t.Fatal("a 1 TB frame header must fail the connection")
	}
	many := &frameLimitConn{greeting: zmtpGreetingBytes}
	stream = greeting
	for range maxFrames + 1 {
		stream = append(stream, frame(true, 0)...)
	}
	if err := many.watch(stream); err == nil {
		t.Fatal("a message of endless empty frames must fail the connection")
	}
}

// TestSubscribeOverZMQ runs a real PUB socket on loopback and checks that a Subscriber gets its
// batches, and that Close stops it.
func TestSubscribeOverZMQ(t *testing.T) {
	endpoint := fmt.Sprintf("tcp://127.0.0.1:%d", testnet.Port(t))
	pub := zmq4.NewPub(context.Background())
	defer pub.Close()
	if err := pub.Listen(endpoint); err != nil {
		t.Fatal(err)
	}
	s, err := Subscribe(Options{Endpoint: endpoint, Topic: topic})
	if err != nil {
		t.Fatal(err)
	}
	// PUB drops messages until the subscription arrives: resend batch 0 until it lands.
	testrun.Eventually(t, 10*time.Second, "a batch", func() bool {
		if s.Cached([]uint64{1}) != 0 {
			return true
		}
		if err := pub.Send(zmq4.NewMsgFrom(message(t, 0, stored(1))...)); err != nil {
			t.Fatal(err)
		}
		return false
	})
	closeWithin(t, s, hangLimit, "Close did not stop the subscriber")
	if s.Cached([]uint64{1}) != 1 {
		t.Fatal("the view must stay readable after Close")
	}
}

func TestSubscribeRejectsBadOptions(t *testing.T) {
	for _, o := range []Options{{Endpoint: "127.0.0.1:5557"}, {Endpoint: "ipc:///tmp/x"}, {Endpoint: "tcp://127.0.0.1:5557", MaxBlocks: -1}} {
		if _, err := Subscribe(o); err == nil {
			t.Fatalf("%+v accepted", o)
		}
	}
}

func TestParentsLinkTheChains(t *testing.T) {
	s := newTestSubscriber(100)
	child := stored(12, 13)
	child["parent_block_hash"] = uint64(11)
	mark := s.Mark()
	s.handle(message(t, 0, stored(10, 11), child,
		[]any{"BlockStored", []uint64{14}, 13, []uint32{1}, 16, nil, "GPU"}, // the array form
		removed(14, 13)))
	if tail, ok := s.Tail(mark, s.Mark(), 0, 5); !ok || tail != 14 {
		t.Fatalf("Tail = %d, %v; want 14", tail, ok)
	}
	if n, ok := s.Evicted(14); !ok || n != 2 {
		t.Fatalf("Evicted = %d, %v; want 2: the parents link 14 to 13, 12 and 11", n, ok)
	}
}

// A peer that accepts and never speaks ZMTP (an HTTP port given by mistake) holds neither the
// subscriber's Close nor, once it hangs up, its retries.
func TestCloseIsPromptWhileAPeerNeverGreets(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan net.Conn, 4)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			accepted <- c // held open, silent
		}
	}()
	s, err := Subscribe(Options{Endpoint: "tcp://" + ln.Addr().String(), Topic: topic})
	if err != nil {
		t.Fatal(err)
	}
	select {
	case c := <-accepted:
		defer c.Close()
		// Into the handshake: the subscriber's greeting has come.
		_ = c.SetReadDeadline(time.Now().Add(hangLimit))
		if _, err := io.ReadFull(c, make([]byte, 10)); err != nil {
			t.Fatalf("no greeting from the subscriber: %v", err)
		}
	case <-time.After(hangLimit):
		t.Fatal("the subscriber did not connect")
	}
	// Half the handshake's deadline: a Close that waited for it would miss this.
	closeWithin(t, s, handshakeTimeout/2, "Close waited on a silent peer")
}

// hangLimit is how long a step that ends at once, or never, may take before
// the test calls it hung.
const hangLimit = 10 * time.Second

// closeWithin closes s, failing with msg if that takes longer than d.
func closeWithin(t *testing.T, s *Subscriber, d time.Duration, msg string) {
	t.Helper()
	closed := make(chan error)
	go func() { closed <- s.Close() }()
	select {
	case <-closed:
	case <-time.After(d):
		t.Fatal(msg)
	}
}

// stepClock is a clock for the subscriber's redials that stands still: each wait it asks for
// is handed to the test, which ends it.
type stepClock struct{ waits chan stepWait }

type stepWait struct {
	d    time.Duration
	done chan time.Time
}

func (stepClock) Now() time.Time { return time.Time{} }

func (c stepClock) After(d time.Duration) <-chan time.Time {
	w := stepWait{d, make(chan time.Time, 1)}
	c.waits <- w
	return w.done
}

// A peer that hangs up, at once (a proxy whose backend is down) or once it has completed ZMQ's
// handshake, is dialled again only after a wait of a second, not in a loop as fast as it
// answers.
func TestAPeerThatHangsUpIsRetriedCalmly(t *testing.T) {
	greeting := make([]byte, 64) // ZMTP 3.0, NULL mechanism, as a server
	greeting[0], greeting[9], greeting[10] = 0xff, 0x7f, 3
	copy(greeting[12:], "NULL")
	ready := "\x05READY\x0bSocket-Type\x00\x00\x00\x03PUB"
	handshake := append(greeting, append([]byte{0x04, byte(len(ready))}, ready...)...)
	for _, peer := range []struct {
		name  string
		serve func(net.Conn)
	}{
		{"at once", func(net.Conn) {}},
		{"after its handshake", func(c net.Conn) {
			theirs := make([]byte, 64)
			if _, err := io.ReadFull(c, theirs); err == nil {
				_, _ = c.Write(handshake)
				_, _ = io.ReadFull(c, theirs[:2]) // their READY's header
			}
		}},
	} {
		t.Run(peer.name, func(t *testing.T) {
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			defer ln.Close()
			var accepted atomic.Int64
			go func() {
				for {
					c, err := ln.Accept()
					if err != nil {
						return
					}
					accepted.Add(1)
					go func() {
						defer c.Close()
						peer.serve(c)
					}()
				}
			}()
			clock := stepClock{waits: make(chan stepWait, 16)}
			s, err := subscribe(Options{Endpoint: "tcp://" + ln.Addr().String(), Topic: topic}, clock)
			if err != nil {
				t.Fatal(err)
			}
			defer closeWithin(t, s, hangLimit, "Close hung")
			for dials := int64(1); dials <= 3; dials++ {
				var w stepWait
				select {
				case w = <-clock.waits:
				case <-time.After(hangLimit):
					t.Fatalf("after %d connections the subscriber neither waited nor dialled again", accepted.Load())
				}
				if n := accepted.Load(); n != dials || w.d < time.Second {
					t.Fatalf("a wait of %v after %d connections, want a second after %d", w.d, n, dials)
				}
				w.done <- time.Time{}
			}
		})
	}
}

// A publisher that restarts on the same port is followed again, even when something else
// answered there meanwhile and failed every handshake.
func TestARestartedPublisherIsFollowedAgain(t *testing.T) {
	endpoint := fmt.Sprintf("tcp://127.0.0.1:%d", testnet.Port(t))
	publish := func(pub zmq4.Socket, s *Subscriber, block uint64) {
		t.Helper()
		testrun.Eventually(t, 10*time.Second, fmt.Sprintf("block %d", block), func() bool {
			if s.Cached([]uint64{block}) != 0 {
				return true
			}
			if err := pub.Send(zmq4.NewMsgFrom(message(t, 0, stored(block))...)); err != nil {
				t.Fatal(err)
			}
			return false
		})
	}
	first := zmq4.NewPub(context.Background())
	if err := first.Listen(endpoint); err != nil {
		t.Fatal(err)
	}
	s, err := Subscribe(Options{Endpoint: endpoint, Topic: topic})
	if err != nil {
		t.Fatal(err)
	}
	defer closeWithin(t, s, hangLimit, "Close hung")
	publish(first, s, 1)
	first.Close()
	// Meanwhile something else answers on the port, and fails every handshake.
	addr := strings.TrimPrefix(endpoint, "tcp://")
	var bogus net.Listener
	// The port frees as the first socket's goroutines end.
	testrun.Eventually(t, 5*time.Second, "the port freed", func() bool {
		bogus, err = net.Listen("tcp", addr)
		return err == nil
	})
	var failed atomic.Int64
	go func() {
		for {
			c, err := bogus.Accept()
			if err != nil {
				return
			}
			c.Write([]byte("HTTP/1.1 400 Bad Request\r\n\r\n"))
			c.Close()
			failed.Add(1)
		}
	}()
	// The subscriber failed a handshake, waited and tried again.
	testrun.Eventually(t, hangLimit, "the subscriber dialling the bogus peer twice", func() bool { return failed.Load() >= 2 })
	bogus.Close()
	second := zmq4.NewPub(context.Background())
	defer second.Close()
	testrun.Eventually(t, 5*time.Second, "the port freed again", func() bool { return second.Listen(endpoint) == nil })
	publish(second, s, 2)
}
