package kvevents

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/go-zeromq/zmq4"
)

// DefaultMaxBlocks is the default cap of the blocks kept of a replica: far above the blocks of any one GPU's
// KV cache at block size 16, and a few tens of MB at most.
const DefaultMaxBlocks = 1 << 20

// Options says which publisher to follow.
type Options struct {
	// Endpoint is the replica's publisher, tcp://host:port (vLLM's endpoint, with the host
	// to connect to; port + rank for DP rank > 0).
	Endpoint string
	// Topic is vLLM's "topic"; only messages whose topic frame is exactly this count.
	Topic string
	// MaxBlocks caps the blocks kept, cached or recently evicted; 0 means DefaultMaxBlocks.
	MaxBlocks int
}

// Stats says how well the events follow the replica.
type Stats struct {
	Blocks    int    `json:"blocks"`    // blocks cached
	Batches   uint64 `json:"batches"`   // batches applied
	Gaps      uint64 `json:"gaps"`      // times batches were missed or the publisher restarted: the view may be stale
	Garbage   uint64 `json:"garbage"`   // messages skipped because they were not well-formed batches of the topic
	Overflows uint64 `json:"overflows"` // stored blocks not kept because MaxBlocks were, all cached
}

// Subscriber follows one replica's KV cache events from its own goroutine until Close.
type Subscriber struct {
	topic  string
	sock   zmq4.Socket
	cancel context.CancelFunc
	done   chan struct{}
	clock  clock // paces the redials

	mu      sync.RWMutex
	chains  *Chains
	lastSeq uint64
	started bool // a message was seen, so lastSeq means something
	stats   Stats
}

// CheckEndpoint reports whether endpoint is one Subscribe can connect to: tcp://host:port.
func CheckEndpoint(endpoint string) error {
	addr, ok := strings.CutPrefix(endpoint, "tcp://")
	if !ok {
		return fmt.Errorf("kvevents: endpoint %q must be tcp://host:port", endpoint)
	}
	host, port, err := net.SplitHostPort(addr)
	n, perr := strconv.Atoi(port)
	switch {
	case err != nil || perr != nil || n < 1 || n > 65535:
		return fmt.Errorf("kvevents: endpoint %q must be tcp://host:port, the port in 1-65535", endpoint)
	case host == "" || host == "*":
		return fmt.Errorf("kvevents: endpoint %q is where vLLM binds; give the host to connect to, e.g. tcp://127.0.0.1:%s", endpoint, port)
	}
	return nil
}

// clock is the time the redials are paced by: the wall clock, or a test's.
type clock interface {
	Now() time.Time
	After(time.Duration) <-chan time.Time
}

type wallClock struct{}

func (wallClock) Now() time.Time                         { return time.Now() }
func (wallClock) After(d time.Duration) <-chan time.Time { return time.After(d) }

// Subscribe starts following the publisher at o.Endpoint. It returns at once: the connection
// is made, and remade, in the background.
func Subscribe(o Options) (*Subscriber, error) { return subscribe(o, wallClock{}) }

func subscribe(o Options, c clock) (*Subscriber, error) {
	if err := CheckEndpoint(o.Endpoint); err != nil {
		return nil, err
	}
	addr := strings.TrimPrefix(o.Endpoint, "tcp://")
	if o.MaxBlocks < 0 {
		return nil, errors.New("kvevents: MaxBlocks must not be negative")
	}
	if o.MaxBlocks == 0 {
		o.MaxBlocks = DefaultMaxBlocks
	}
	if err := registerLimitedTCP(); err != nil {
		return nil, err
	}
	lost := make(chan struct{}, 1)
	ctx, cancel := context.WithCancel(context.WithValue(context.Background(), lostKey{}, lost))
	// zmq4's own reconnection gives up after a failed handshake: run reconnects instead.
	sock := zmq4.NewSub(ctx, zmq4.WithDialerMaxRetries(-1), zmq4.WithDialerRetry(100*time.Millisecond))
	if err := sock.SetOption(zmq4.OptionSubscribe, o.Topic); err != nil {
		cancel()
		sock.Close()
		return nil, err
	}
	s := &Subscriber{topic: o.Topic, sock: sock, cancel: cancel, done: make(chan struct{}), clock: c, chains: NewChains(o.MaxBlocks)}
	go s.run(ctx, limitedTCP+"://"+addr, lost)
	return s, nil
}

// lostKey carries, in the socket's context, the channel the transport signals a lost
// connection on (framelimit.go).
type lostKey struct{}

func (s *Subscriber) run(ctx context.Context, endpoint string, lost <-chan struct{}) {
	defer close(s.done)
	received := make(chan struct{})
	go func() {
		defer close(received)
		for {
			msg, err := s.sock.Recv()
			if ctx.Err() != nil {
				return
			}
			if err == nil {
				s.handle(msg.Frames)
			}
		}
	}()
	wait := func(d time.Duration) bool {
		select {
		case <-ctx.Done():
			<-received
			return false
		case <-s.clock.After(d):
			return true
		}
	}
	for {
		// Dial retries a refused connection itself, and fails on a failed handshake (a peer
		// that is not a ZMQ publisher, or one restarting): try again a second later.
		for s.sock.Dial(endpoint) != nil {
			if !wait(time.Second) {
				return
			}
		}
		connected := s.clock.Now()
		select {
		case <-ctx.Done():
			<-received
			return
		case <-lost: // the connection dropped: dial again, at once unless it had just begun
		}
		if s.clock.Now().Sub(connected) < time.Second && !wait(time.Second) {
			return
		}
	}
}

// handle applies one message: [topic, 8-byte big-endian sequence, msgpack KVEventBatch]. It
// decodes the batch before it takes the lock that routing's Mark and Tail wait on.
func (s *Subscriber) handle(frames [][]byte) {
	wellFramed := len(frames) == 3 && string(frames[0]) == s.topic && len(frames[1]) == 8
	var events []event
	var err error
	if wellFramed {
		events, err = decodeBatch(frames[2])
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if !wellFramed {
		s.stats.Garbage++
		return
	}
	seq := binary.BigEndian.Uint64(frames[1])
	switch {
	case !s.started && seq != 0: // joined late: what was stored before is unknown
		s.stats.Gaps++
	case s.started && seq <= s.lastSeq: // a new publisher, so a new, empty cache
		s.stats.Gaps++
		s.chains.Cleared()
	case s.started && seq != s.lastSeq+1:
		s.stats.Gaps++
	}
	s.started, s.lastSeq = true, seq
	if err != nil {
		s.stats.Garbage++
		return
	}
	for _, ev := range events {
		switch ev.kind {
		case blockStored:
			s.chains.Stored(ev.parent, ev.hashes)
		case blockRemoved:
			s.chains.Removed(ev.hashes)
		case allBlocksCleared:
			s.chains.Cleared()
		}
	}
	s.stats.Batches++
}

// Cached returns how many leading blocks of a prompt's block-hash chain the replica holds, by
// its events so far.
func (s *Subscriber) Cached(hashes []uint64) int {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.chains.Leading(hashes)
}

// Mark is Chains.Mark on the events so far: call it when a turn is sent.
func (s *Subscriber) Mark() uint64 {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.chains.Mark()
}

// Tail is Chains.Tail on the events so far.
func (s *Subscriber) Tail(mark, end, prev uint64, blocks int) (uint64, bool) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.chains.Tail(mark, end, prev, blocks)
}

// Evicted is Chains.Evicted on the events so far.
func (s *Subscriber) Evicted(tail uint64) (int, bool) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.chains.Evicted(tail)
}

// Stats returns the cache's size and counters.
func (s *Subscriber) Stats() Stats {
	s.mu.RLock()
	defer s.mu.RUnlock()
	st := s.stats
	st.Blocks = s.chains.blocks
	st.Overflows = s.chains.Overflows
	return st
}

// Close disconnects and stops the goroutine; the last view stays readable.
func (s *Subscriber) Close() error {
	s.cancel()
	err := s.sock.Close()
	<-s.done
	return err
}
