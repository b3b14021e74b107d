package caddymodule_test

import (
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/lmwarden/caddy-warden/internal/redisproc"
	"github.com/lmwarden/caddy-warden/internal/testrun"
	"github.com/lmwarden/caddy-warden/panel"
)

// sharedBlock is model m with its pins in the Redis at addr.
func sharedBlock(addr, syncInterval string) caddySetup {
	return caddySetup{
		modelBlock: fmt.Sprintf(`replicas {replicas}
			max_num_seqs 128
			pin_store redis {
				address %s
				password {env.WARDEN_TEST_REDIS_PASSWORD}
				timeout 200ms
			}`, addr),
		fields: map[string]any{"pin_store.redis.sync_interval": syncInterval},
	}
}

const redisPassword = "s3cret-never-shown"

// startShared runs n Caddy instances in front of the same replicas, sharing
// one Redis for their pins.
func startShared(t *testing.T, n int, syncInterval string, backends ...*fakeVLLM) (*redisproc.TestServer, []*fleet, []*testrun.Buffer) {
	t.Helper()
	redis := redisproc.StartTest(t, "--requirepass", redisPassword)
	t.Setenv("WARDEN_TEST_REDIS_PASSWORD", redisPassword) // Caddy inherits it
	var fleets []*fleet
	var logs []*testrun.Buffer
	for range n {
		f, log := runCaddy(t, sharedBlock(redis.Addr, syncInterval), addresses(backends)...)
		f.backends = backends
		fleets, logs = append(fleets, f), append(logs, log)
	}
	return redis, fleets, logs
}

// pinCommands counts the commands Redis has run that read or write pins:
// all but the connection's own (AUTH, HELLO, CLIENT, PING: the Pub/Sub
// connection's keep-alive) and this reading's INFO.
func pinCommands(t *testing.T, redis *redisproc.TestServer) int {
	t.Helper()
	total := 0
	for _, line := range strings.Split(redis.Do("INFO", "commandstats"), "\r\n") {
		name, stats, ok := strings.Cut(strings.TrimPrefix(line, "cmdstat_"), ":calls=")
		if !ok || slices.Contains([]string{"auth", "hello", "client|setinfo", "client|setname", "ping", "info"}, name) {
			continue
		}
		calls, _, _ := strings.Cut(stats, ",")
		n, err := strconv.Atoi(calls)
		if err != nil {
			t.Fatalf("INFO commandstats: %q", line)
		}
		total += n
	}
	return total
}

// Two Caddy instances sharing a Redis: a conversation placed by one is
// served on the same replica by the other, which has never seen it; once
// each knows it, its turns cost Redis nothing.
func TestSharedPinsKeepAConversationOnOneReplicaAcrossInstances(t *testing.T) {
	backends := []*fakeVLLM{startFakeVLLM(t, "a", 1), startFakeVLLM(t, "b", 1), startFakeVLLM(t, "c", 1)}
	redis, fleets, logs := startShared(t, 2, "10m", backends...)
	first, second := fleets[0], fleets[1]

	convs := testrun.Sessions("shared", 12)
	home := pinAll(t, first, convs)
	for _, c := range convs {
		if served := second.turn(t, c); served != home[c] {
			t.Errorf("%s: second instance served it on %s, pinned to %s by the first", c, served, home[c])
		}
	}
	// The second instance learnt each pin from the first's message, or,
	// had a turn outrun the message, lost its claim to it: never won one.
	st := second.status(t)
	if ps := st.PinStore; ps == nil || !ps.Up || ps.Claims != 0 || ps.Adopted+ps.ClaimsLost != uint64(len(convs)) {
		t.Fatalf("second instance's pin store: %+v", ps)
	}
	// (A lost claim naming the replica the second would have chosen anyway
	// counts as placed there.)
	var adopted, placedHere uint64
	for _, r := range st.Replicas {
		adopted, placedHere = adopted+r.Adopted, placedHere+r.Placed
	}
	if adopted+placedHere != uint64(len(convs)) || adopted == 0 {
		t.Errorf("second instance's replicas count %d adopted and %d placed conversations, want %d in all", adopted, placedHere, len(convs))
	}

	// Both know every conversation: no Redis call per turn.
	before := pinCommands(t, redis)
	for range 2 {
		for _, f := range fleets {
			for _, c := range convs {
				if served := f.turn(t, c); served != home[c] {
					t.Errorf("%s served on %s, pinned to %s", c, served, home[c])
				}
			}
		}
	}
	if calls := pinCommands(t, redis) - before; calls != 0 {
		t.Errorf("%d Redis commands for %d turns of known conversations; want none", calls, 4*len(convs))
	}

	t.Run("docs/metrics.md lists the pin store's series", func(t *testing.T) {
		checkMetricsDocumented(t, scrapeMetrics(t, second), func(name string) bool { return strings.HasPrefix(name, pinStoreSeries) })
	})

	// The password reaches neither the admin API, nor the config API (which
	// holds the placeholder), nor the logs.
	for _, path := range []string{"/warden/models/m", "/config/"} {
		var body any
		if err := first.caddy.Do(http.MethodGet, path, nil, &body); err != nil {
			t.Fatal(err)
		}
		if s := fmt.Sprint(body); strings.Contains(s, redisPassword) {
			t.Errorf("%s shows the Redis password", path)
		}
	}
	for i, log := range logs {
		if strings.Contains(log.String(), redisPassword) {
			t.Errorf("instance %d logged the Redis password", i)
		}
	}
}

// Redis down: requests never fail and conversations stay on their
// replicas; the store comes back by itself, and pins made meanwhile are
// claimed again (never overwriting another instance's).
func TestSharedPinsSurviveARedisOutage(t *testing.T) {
	backends := []*fakeVLLM{startFakeVLLM(t, "a", 1), startFakeVLLM(t, "b", 1)}
	redis, fleets, _ := startShared(t, 1, "500ms", backends...)
	f := fleets[0]
	before := testrun.Sessions("before", 4)
	home := pinAll(t, f, before)

	redis.Stop()
	during := testrun.Sessions("during", 4)
	start := time.Now()
	for c, b := range pinAll(t, f, during) { // pinAll fails the test on any error status
		home[c] = b
	}
	t.Logf("4 new conversations took %v with Redis down", time.Since(start))
	for _, c := range append(before, during...) {
		if served := f.turn(t, c); served != home[c] {
			t.Errorf("during the outage %s served on %s, pinned to %s", c, served, home[c])
		}
	}
	testrun.Eventually(t, 10*time.Second, "the store reported down", func() bool {
		ps := f.status(t).PinStore
		return ps != nil && !ps.Up
	})

	redis.Restart() // empty: every pin must be claimed again
	testrun.Eventually(t, 10*time.Second, "the store up again, the pins re-claimed", func() bool {
		ps := f.status(t).PinStore
		return ps != nil && ps.Up && ps.Reclaimed >= uint64(len(home))
	})
	for _, c := range append(before, during...) {
		if served := f.turn(t, c); served != home[c] {
			t.Errorf("after the outage %s served on %s, pinned to %s", c, served, home[c])
		}
	}
	var st panel.ModelStatus = f.status(t)
	t.Logf("pin store after the outage: %+v", *st.PinStore)
}
