package selection

import (
	"strconv"
	"sync/atomic"
	"testing"

	"github.com/lmwarden/caddy-warden/loadcontrol"
)

const (
	benchReplicas      = 64
	benchConversations = 100_000
)

func benchRouter(b *testing.B) (testRouter, []string) {
	return benchRouterWith(b, Config{MaxSessions: 2 * benchConversations})
}

func benchRouterWith(b *testing.B, cfg Config) (testRouter, []string) {
	r := newTestRouter(benchReplicas, cfg)
	keys := make([]string, benchConversations)
	for i := range keys {
		keys[i] = "5f0c8e3a-0000-4000-8000-" + strconv.Itoa(100000000000+i)
		r.Pick(Request{Key: keys[i], Now: t0}).Release()
	}
	b.ReportAllocs()
	b.ResetTimer()
	return r, keys
}

// BenchmarkPinnedLookup is a turn of a known conversation: hash, table
// lookup, spill gate, in-flight count and its release.
func BenchmarkPinnedLookup(b *testing.B) {
	r, keys := benchRouter(b)
	i := 0
	for b.Loop() {
		r.Pick(Request{Key: keys[i%len(keys)], Now: t0}).Release()
		i++
	}
}

// BenchmarkPinnedLookupCosted is BenchmarkPinnedLookup with the replicas'
// KV caches and prefill rate known, so that each turn's stay is costed
// against the move it could make.
func BenchmarkPinnedLookupCosted(b *testing.B) {
	r := newTestRouter(benchReplicas, Config{MaxSessions: 2 * benchConversations})
	teachRate(r, 5000, kvLoad(1000))
	keys := make([]string, benchConversations)
	for i := range keys {
		keys[i] = "5f0c8e3a-0000-4000-8000-" + strconv.Itoa(100000000000+i)
		r.Pick(Request{Key: keys[i], PromptTokens: 10000, Now: t0}).End(t0, loadcontrol.Reply{})
	}
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		r.Pick(Request{Key: keys[i%len(keys)], PromptTokens: 10000, Now: t0}).Release()
		i++
	}
}

// BenchmarkPinnedLookupShared is BenchmarkPinnedLookup with a shared pin
// table configured, which a known conversation never consults.
func BenchmarkPinnedLookupShared(b *testing.B) {
	r, keys := benchRouterWith(b, Config{MaxSessions: 2 * benchConversations, Shared: newMemoryPins()})
	i := 0
	for b.Loop() {
		r.Pick(Request{Key: keys[i%len(keys)], Now: t0}).Release()
		i++
	}
}

func BenchmarkPinnedLookupParallel(b *testing.B) {
	r, keys := benchRouter(b)
	var next atomic.Uint64
	b.RunParallel(func(pb *testing.PB) {
		i := int(next.Add(7919))
		for pb.Next() {
			r.Pick(Request{Key: keys[i%len(keys)], Now: t0}).Release()
			i++
		}
	})
}

// BenchmarkPlaceNew is the first turn of a new conversation: a scan of the
// 64 replicas under the placement lock and a table insert.
func BenchmarkPlaceNew(b *testing.B) {
	r, _ := benchRouter(b)
	keys := newKeys(b.N)
	b.ResetTimer()
	for i := range b.N {
		r.Pick(Request{Key: keys[i], Now: t0}).Release()
	}
}

func BenchmarkPlaceNewParallel(b *testing.B) {
	r, _ := benchRouter(b)
	keys := newKeys(b.N)
	var next atomic.Int64
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			r.Pick(Request{Key: keys[next.Add(1)-1], Now: t0}).Release()
		}
	})
}

func newKeys(n int) []string {
	keys := make([]string, n)
	for i := range keys {
		keys[i] = "new-" + strconv.Itoa(i)
	}
	return keys
}

// BenchmarkPinnedLookupHashed is the same turn as the policy routes it: the
// key hashed by sessionkey from the headers (Request.Hash).
func BenchmarkPinnedLookupHashed(b *testing.B) {
	r, keys := benchRouter(b)
	hashes := make([]uint64, len(keys))
	for i, k := range keys {
		hashes[i] = HashKey(k)
	}
	i := 0
	for b.Loop() {
		r.Pick(Request{Hash: hashes[i%len(hashes)], Now: t0}).Release()
		i++
	}
}
