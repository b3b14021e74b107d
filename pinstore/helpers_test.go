package pinstore

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/lmwarden/caddy-warden/internal/redisproc"
	"github.com/lmwarden/caddy-warden/internal/testrun"
)

// fakeLocal is a map-based Local, as selection.Router would be.
type fakeLocal struct {
	mu     sync.Mutex
	pins   map[uint64]fakePin
	adopts int
}

type fakePin struct {
	replica string
	used    time.Time
}

func newLocal() *fakeLocal { return &fakeLocal{pins: map[uint64]fakePin{}} }

// use pins key to replica locally and marks it used now.
func (l *fakeLocal) use(key uint64, replica string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.pins[key] = fakePin{replica, time.Now()}
}

func (l *fakeLocal) get(key uint64) string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.pins[key].replica
}

func (l *fakeLocal) PinsUsedSince(t time.Time) []Pin {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []Pin
	for k, p := range l.pins {
		if !p.used.Before(t) {
			out = append(out, Pin{k, p.replica})
		}
	}
	return out
}

func (l *fakeLocal) Adopt(key uint64, replica string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	p, ok := l.pins[key]
	if ok && p.replica == replica {
		return false
	}
	if !ok {
		p.used = time.Now()
	}
	p.replica = replica
	l.pins[key] = p
	l.adopts++
	return true
}

// observed counts Observe calls by "op result".
type observed struct {
	mu sync.Mutex
	n  map[string]int
}

func (o *observed) hook(op, result string, _ time.Duration) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.n == nil {
		o.n = map[string]int{}
	}
	o.n[op+" "+result]++
}

func (o *observed) get(k string) int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.n[k]
}

// testTimeout is generous: a loaded 2-core machine under -race must not
// time out a healthy loopback call and open the breaker.
const testTimeout = 500 * time.Millisecond

// open opens a store on addr for model "m" (TTL 1 min, 1000 pins, no periodic sync during a test),
// closed when the test ends; edit adjusts the config and options first.
func open(t testing.TB, addr string, edit func(*Config, *Options)) *Store {
	t.Helper()
	c := Config{Address: addr, Timeout: testTimeout}
	o := Options{Model: "m", TTL: time.Minute, MaxPins: 1000, SyncInterval: 50 * time.Second}
	if edit != nil {
		edit(&c, &o)
	}
	s, err := Open(c, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// run runs s.Run until the test ends.
func run(t testing.TB, s *Store, l Local) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		s.Run(ctx, l)
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Error("Run did not return after its context ended")
		}
	})
}

// eventually polls cond every 10ms until it holds, failing after within.
func eventually(t testing.TB, within time.Duration, what string, cond func() bool) {
	t.Helper()
	testrun.Eventually(t, within, what, cond)
}

func pinKeyName(key uint64) string { return fmt.Sprintf("warden:m:pin:%016x", key) }

// info reads one integer field of INFO section.
func info(t testing.TB, srv *redisproc.TestServer, section, field string) int64 {
	t.Helper()
	for _, line := range strings.Split(srv.Do("INFO", section), "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), field+":"); ok {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				t.Fatalf("INFO %s %s: %q", section, field, v)
			}
			return n
		}
	}
	t.Fatalf("INFO %s has no %s", section, field)
	return 0
}

func atoi(t testing.TB, s string) int64 {
	t.Helper()
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		t.Fatalf("not a number: %q", s)
	}
	return n
}

// subscribers is how many clients listen on the model's re-pin channel.
func subscribers(t testing.TB, s *Store) int64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	n, err := s.rdb.PubSubNumSub(ctx, s.channel).Result()
	if err != nil {
		return -1
	}
	return n[s.channel]
}
