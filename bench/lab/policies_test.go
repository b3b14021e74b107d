package lab

import (
	"fmt"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"

	"github.com/lmwarden/caddy-warden/bench/agentload"
	"github.com/lmwarden/caddy-warden/bench/vllmsim/engine"
)

func testEnv(t *testing.T, replicas int) *Env {
	t.Helper()
	cfg := DefaultConfig()
	cfg.Replicas = replicas
	f, err := newFleet(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return newEnv(cfg, f, 3)
}

func caddyPool(env *Env) reverseproxy.UpstreamPool {
	pool := make(reverseproxy.UpstreamPool, env.Engines())
	for i := range pool {
		pool[i] = &reverseproxy.Upstream{Host: new(reverseproxy.Host), Dial: env.Address(i)}
	}
	return pool
}

func TestHeaderPolicyChoosesAsCaddy(t *testing.T) {
	env := testEnv(t, 4)
	policy, _ := newHeaderPolicy(env)
	pool := caddyPool(env)
	caddy := reverseproxy.HeaderHashSelection{Field: agentload.DefaultSessionHeader}
	used := map[int]bool{}
	for i := range 200 {
		key := fmt.Sprintf("5f0c8e3a-%04d-4000-8000-%012d", i, i*7919)
		req := httptest.NewRequest("POST", "/v1/messages", nil)
		req.Header.Set(agentload.DefaultSessionHeader, key)
		want := caddy.Select(pool, req, nil)
		got, release := policy.Pick(Arrival{Key: key})
		release()
		if pool[got] != want {
			t.Fatalf("key %s: lab chose %s, Caddy %s", key, pool[got].Dial, want.Dial)
		}
		used[got] = true
	}
	if len(used) != 4 {
		t.Fatalf("200 keys hashed onto %d of 4 upstreams", len(used))
	}
}

func TestRoundRobinPolicyChoosesAsCaddy(t *testing.T) {
	env := testEnv(t, 3)
	policy, _ := newRoundRobinPolicy(env)
	pool := caddyPool(env)
	var caddy reverseproxy.RoundRobinSelection
	for i := range 10 {
		got, _ := policy.Pick(Arrival{})
		if want := caddy.Select(pool, nil, nil); pool[got] != want {
			t.Fatalf("pick %d: lab chose %s, Caddy %s", i, pool[got].Dial, want.Dial)
		}
	}
}

func TestLeastConnPicksTheFewestInFlight(t *testing.T) {
	env := testEnv(t, 4)
	policy, _ := newLeastConnPolicy(env)
	var releases []func()
	counts := make([]int, 4)
	// Eight requests in flight spread two per engine.
	for range 8 {
		eng, release := policy.Pick(Arrival{})
		counts[eng]++
		releases = append(releases, release)
	}
	for i, n := range counts {
		if n != 2 {
			t.Fatalf("engine %d holds %d of 8 requests: %v", i, n, counts)
		}
	}
	releases[0]()
	releases[1]()
	// Now two engines have one request fewer; new requests go there first.
	lighter := map[int]bool{}
	for range 2 {
		eng, _ := policy.Pick(Arrival{})
		if counts[eng] != 2 {
			t.Fatalf("counts %v: chose engine %d", counts, eng)
		}
		lighter[eng] = true
	}
	// Ties are broken at random, not always by the first engine.
	seen := map[int]bool{}
	for range 64 {
		eng, release := policy.Pick(Arrival{})
		release()
		seen[eng] = true
	}
	if len(seen) < 2 {
		t.Fatalf("64 picks among tied engines all chose %v", seen)
	}
}

// TestWardenSeesLoadOnlyAtPolls checks that the warden policy places new
// conversations on the engines' metrics as of the last polls, as behind
// Caddy: traffic that did not come through it counts once two polls in a row
// have shown it.
func TestWardenSeesLoadOnlyAtPolls(t *testing.T) {
	env := testEnv(t, 2)
	policy, err := policyFactories[PolicyWarden](env)
	if err != nil {
		t.Fatal(err)
	}
	poll := env.tasks[0]
	if poll.interval != env.Config().MetricsInterval {
		t.Fatalf("first task runs every %v, want the metrics interval", poll.interval)
	}
	external := func(eng int) []*engine.Request {
		var reqs []*engine.Request
		for i := range 5 {
			r := &engine.Request{Prompt: tokens(100*i, 64), MaxTokens: 1, Output: []uint32{1}}
			if err := env.fleet.engines[eng].Add(r, 0); err != nil {
				t.Fatal(err)
			}
			reqs = append(reqs, r)
		}
		return reqs
	}
	onOne := external(1)
	poll.fn(0)
	poll.fn(0)
	if a, _ := policy.Pick(Arrival{Key: "a"}); a != 0 {
		t.Fatalf("engine 1 reported 5 waiting requests, yet conversation a went to %d", a)
	}
	// The external load moves to engine 0 between two polls: the router
	// still sees the old picture.
	for _, r := range onOne {
		env.fleet.engines[1].Abort(r)
	}
	external(0)
	if b, _ := policy.Pick(Arrival{Key: "b"}); b != 0 {
		t.Fatalf("before the next poll conversation b went to %d, want the stale choice 0", b)
	}
	poll.fn(time.Second)
	poll.fn(2 * time.Second)
	if c, _ := policy.Pick(Arrival{Key: "c", Now: 2 * time.Second}); c != 1 {
		t.Fatalf("after the poll conversation c went to %d, want 1", c)
	}
}

// tokens returns n distinct tokens starting at from.
func tokens(from, n int) []uint32 {
	out := make([]uint32, n)
	for i := range out {
		out[i] = uint32(from + i)
	}
	return out
}
