package pinstore

import (
	"context"
	"os"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/lmwarden/caddy-warden/internal/redisproc"
	"github.com/redis/go-redis/v9"
)

// TestFloodMemory measures Redis memory after a large flood of distinct
// sessions, with the bound (MaxPins 1000) and without one (MaxPins = the
// flood). Too slow for CI: PINSTORE_FLOOD=1000000 go test -run FloodMemory -v ./pinstore/
func TestFloodMemory(t *testing.T) {
	n, _ := strconv.Atoi(os.Getenv("PINSTORE_FLOOD"))
	if n <= 0 {
		t.Skip("set PINSTORE_FLOOD=<claims> to measure")
	}
	for _, maxPins := range []int{1000, n} {
		srv := redisproc.StartTest(t)
		s := open(t, srv.Addr, func(_ *Config, o *Options) { o.MaxPins = maxPins; o.TTL = 30 * time.Minute })
		base := info(t, srv, "memory", "used_memory")
		start := time.Now()
		flood(t, s, n)
		d := time.Since(start)
		used := info(t, srv, "memory", "used_memory")
		t.Logf("MaxPins %d: %d claims in %v (%.0f/s pipelined); DBSIZE %s; used_memory %d → %d (+%.1f MiB, %.0f B/pin)",
			maxPins, n, d.Round(time.Millisecond), float64(n)/d.Seconds(), srv.Do("DBSIZE"),
			base, used, float64(used-base)/(1<<20), float64(used-base)/float64(min(n, maxPins)))
		if maxPins < n && atoi(t, srv.Do("DBSIZE")) > int64(maxPins)+1 {
			t.Fatalf("DBSIZE %s beyond MaxPins %d", srv.Do("DBSIZE"), maxPins)
		}
		srv.Stop()
	}
}

// flood claims n distinct keys, pipelined 1000 at a time (the scripts are
// those Claim runs; one call each would take minutes).
func flood(t testing.TB, s *Store, n int) {
	t.Helper()
	ctx := context.Background()
	if err := claimScript.Load(ctx, s.rdb).Err(); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < n; i += 1000 {
		pipe := s.rdb.Pipeline()
		for j := i; j < min(n, i+1000); j++ {
			keys, args := s.args(hexKey(spread(j)), "10.0.0.1:8000#0")
			pipe.EvalSha(ctx, claimScript.Hash(), keys, args...)
		}
		if _, err := pipe.Exec(ctx); err != nil && err != redis.Nil {
			t.Fatal(err)
		}
	}
}

// Claim latency on loopback: a won claim (new key) and a lost one.
func BenchmarkClaim(b *testing.B) {
	srv := redisproc.StartTest(b)
	var lat []time.Duration // round trips of the "won" claims
	s := open(b, srv.Addr, func(_ *Config, o *Options) {
		o.MaxPins = 100_000
		o.Observe = func(op, _ string, d time.Duration) {
			if op == "claim" {
				lat = append(lat, d)
			}
		}
	})
	b.Run("won", func(b *testing.B) {
		lat = lat[:0]
		for i := 0; b.Loop(); i++ {
			if _, ok := s.Claim(spread(i), "10.0.0.1:8000#0"); !ok {
				b.Fatal(s.Status())
			}
		}
		slices.Sort(lat)
		b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "p50-µs")
		b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "p99-µs")
	})
	b.Run("lost", func(b *testing.B) {
		s.Claim(1, "a")
		for b.Loop() {
			if p, ok := s.Claim(1, "b"); !ok || p != "a" {
				b.Fatal(s.Status())
			}
		}
	})
	b.Run("repin", func(b *testing.B) {
		from, to := "a", "b"
		for b.Loop() {
			if p, ok := s.Repin(1, from, to); !ok || p != to {
				b.Fatal(p, s.Status())
			}
			from, to = to, from
		}
	})
}

// One sync batch of 1000 local pins.
func BenchmarkSync1000(b *testing.B) {
	srv := redisproc.StartTest(b)
	s := open(b, srv.Addr, nil)
	l := newLocal()
	for i := range 1000 {
		l.use(spread(i), "r")
	}
	for b.Loop() {
		s.sync(l, time.Time{})
	}
}
