package loadcontrol

import (
	"fmt"
	"time"

	"github.com/lmwarden/caddy-warden/promptprefix"
)

// t0 is the tests' start of time.
var t0 = time.Unix(1_700_000_000, 0)

// fakeBytesPerToken is the fake routing's bytes per prompt token.
const fakeBytesPerToken = 4

// fakeReplica is a replica of fakeRouting.
type fakeReplica struct {
	id      string
	healthy bool
}

func (r *fakeReplica) String() string { return r.id }

// fakeRouting is the least routing load control needs, to test it alone:
// pins in a map, the lightest replica the one fewest conversations are
// pinned to (the first of equals), capacity from the config only.
type fakeRouting struct {
	replicas []*fakeReplica
	pins     map[uint64]*fakeReplica
	shared   int // the shared prefix in tokens
}

func newFakeRouting(n int) *fakeRouting {
	f := &fakeRouting{pins: map[uint64]*fakeReplica{}}
	for i := range n {
		f.replicas = append(f.replicas, &fakeReplica{id: fmt.Sprint("r", i), healthy: true})
	}
	return f
}

// view is a gate of its own under cfg, over f.
func (f *fakeRouting) view(cfg Config) *View { return NewGate().View(cfg, true, f) }

func (f *fakeRouting) Replicas() []Replica {
	out := make([]Replica, len(f.replicas))
	for i, r := range f.replicas {
		out[i] = r
	}
	return out
}

func (f *fakeRouting) Pin(key uint64, _ int64) Replica {
	if r := f.pins[key]; r != nil {
		return r
	}
	return nil
}

func (f *fakeRouting) Settle(key uint64, rep Replica, _ int64) { f.pins[key] = rep.(*fakeReplica) }

func (f *fakeRouting) Usable(rep Replica, _ func(string) bool) bool {
	return rep.(*fakeReplica).healthy
}

func (f *fakeRouting) Healthy(rep Replica) bool { return rep.(*fakeReplica).healthy }

func (f *fakeRouting) AnyHealthy(func(string) bool) bool {
	for _, r := range f.replicas {
		if r.healthy {
			return true
		}
	}
	return false
}

func (f *fakeRouting) Lightest(_ func(string) bool, _ uint64, ok func(Replica) bool) Replica {
	pinned := map[*fakeReplica]int{}
	for _, r := range f.pins {
		pinned[r]++
	}
	var best *fakeReplica
	for _, needHealthy := range [2]bool{true, false} {
		for _, r := range f.replicas {
			if (needHealthy && !r.healthy) || (ok != nil && !ok(r)) {
				continue
			}
			if best == nil || pinned[r] < pinned[best] {
				best = r
			}
		}
		if best != nil {
			return best
		}
	}
	return nil
}

func (f *fakeRouting) KVTokens(Replica) int    { return 0 }
func (f *fakeRouting) GPUKVTokens(Replica) int { return 0 }

// EstimateTokens never learns, so that every turn is sized on the assumed
// bytes per token and may turn out underestimated.
func (f *fakeRouting) EstimateTokens(bodyBytes int64) (int, bool) {
	return int(bodyBytes / fakeBytesPerToken), false
}

func (f *fakeRouting) BytesPerToken() float64 { return fakeBytesPerToken }

func (f *fakeRouting) LearnTokenSize(int64, int) {}

func (f *fakeRouting) SharedPrefix() (int, SharedPrefixSource) { return f.shared, SharedFromReplies }

func (f *fakeRouting) NoteRequestPrefix(uint64, promptprefix.Prefix) {}

func (f *fakeRouting) NoteReplyPrefix(int) {}

func (f *fakeRouting) LastPrompt(uint64, int64) int { return 0 }
