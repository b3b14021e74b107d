package selection_test

import (
	"fmt"
	"runtime"
	"strconv"
	"testing"
	"time"

	"github.com/lmwarden/caddy-warden/selection"
)

// Hostile input for the routing core: floods of session IDs and arbitrary
// sequences of requests and reconfigurations.

var floodStart = time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)

// floodRouter is a router and the view of its current config.
type floodRouter struct {
	*selection.Router
	view *selection.View
	cfg  selection.Config
}

func newFloodRouter(replicas, maxSessions int) *floodRouter {
	reps := make([]selection.Replica, replicas)
	for i := range reps {
		addr := "127.0.0.1:" + strconv.Itoa(8001+i)
		reps[i] = selection.Replica{ID: addr, Address: addr}
	}
	r := &floodRouter{Router: selection.NewRouter("m", floodStart)}
	r.reload(selection.Config{Affinity: true, MaxSessions: maxSessions}, reps)
	for _, rep := range reps {
		r.SetLoad(rep.ID, selection.Load{Known: true})
	}
	return r
}

// reload applies a config as a successful config load does.
func (r *floodRouter) reload(cfg selection.Config, replicas []selection.Replica) {
	r.cfg = cfg
	r.view = r.View(cfg, replicas)
	r.Apply(r.view)
}

func (r *floodRouter) Pick(req selection.Request) selection.Decision { return r.view.Pick(req) }
func (r *floodRouter) Status() selection.Status                      { return r.view.Status() }
func (r *floodRouter) Replicas() []selection.Replica                 { return r.view.Replicas() }

// tableBound is how many conversations the table may hold.
func tableBound(maxSessions int) int64 {
	return int64(max(maxSessions, selection.MinMaxSessions))
}

// A million new session IDs with max_sessions 100,000: the table holds
// exactly its bound, evicts the rest, and the heap it keeps stops growing
// once its maps have been churned through once (they never shrink, and
// deletions leave room that inserts reuse).
func TestMillionSessionFlood(t *testing.T) {
	if testing.Short() {
		t.Skip("a million placements")
	}
	const flood, maxSessions = 1_000_000, 100_000
	r := newFloodRouter(4, maxSessions)
	heap := func(collect bool) uint64 {
		if collect {
			runtime.GC()
		}
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		return ms.HeapAlloc
	}
	base := heap(true)
	var peak, atCapacity, churned uint64
	for i := range flood {
		key := fmt.Sprintf("%08x-flood-4000-8000-%012d", i, i) // UUID-sized, never repeated
		r.Pick(selection.Request{Key: key, Now: floodStart}).Release()
		switch n := i + 1; {
		case n == maxSessions:
			atCapacity = heap(true) - base
		case n == 3*maxSessions:
			churned = heap(true) - base
		case n%10_000 == 0:
			peak = max(peak, heap(false)-base)
		}
	}
	retained := heap(true) - base
	st := r.Status()
	t.Logf("%d new conversations, max_sessions %d: %d in the table, %d evicted; heap above the empty router: %.1f MiB at capacity, %.1f MiB after %d, %.1f MiB after the flood (%.0f B per conversation); peak %.1f MiB including garbage",
		flood, maxSessions, st.Sessions, st.Evicted, mib(atCapacity), mib(churned), 3*maxSessions, mib(retained), float64(retained)/float64(st.Sessions), mib(peak))
	if st.Sessions != tableBound(maxSessions) {
		t.Errorf("%d conversations in the table, want %d", st.Sessions, tableBound(maxSessions))
	}
	if st.Evicted != uint64(flood-st.Sessions) {
		t.Errorf("%d evicted, want %d", st.Evicted, flood-st.Sessions)
	}
	if retained > churned+churned/10 {
		t.Errorf("heap kept %.1f MiB after the flood, %.1f MiB after %d: it grows with the flood", mib(retained), mib(churned), 3*maxSessions)
	}
	if retained > 2*atCapacity {
		t.Errorf("heap kept %.1f MiB after the flood, more than twice the %.1f MiB at capacity", mib(retained), mib(atCapacity))
	}
	runtime.KeepAlive(r)
}

// inFleet counts the held requests whose replica is in the fleet (a
// removed replica's requests leave the counts with it).
func inFleet(held []selection.Decision, fleet []selection.Replica) int64 {
	n := int64(0)
	for _, d := range held {
		rep, _ := d.Replica()
		for _, f := range fleet {
			if f.ID == rep.ID {
				n++
			}
		}
	}
	return n
}

func mib(b uint64) float64 { return float64(b) / (1 << 20) }

// FuzzRouter plays arbitrary sequences of requests, releases, health and
// fleet changes, reloads (applied or rejected) and sweeps. Whatever the sequence, the
// router must not panic, must count exactly the requests still in flight,
// must keep the table within its bound, and must give every in-flight
// count back once all requests end.
func FuzzRouter(f *testing.F) {
	f.Add([]byte{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15})
	f.Add([]byte{0, 0, 0, 0, 48, 48, 48, 16, 32, 64, 80, 96, 112, 128, 144, 160, 176, 192, 208, 224, 240})
	f.Add([]byte("flood flood flood of keys and releases"))
	f.Fuzz(func(t *testing.T, ops []byte) {
		const maxSessions = 8
		r := newFloodRouter(3, maxSessions)
		replicas := r.Replicas()
		var held []selection.Decision
		fleet := len(replicas) // the fleet is replicas[:fleet]
		now := floodStart
		for i, op := range ops {
			arg := int(op >> 4)
			switch op & 0x0f {
			case 0, 1, 2, 3, 4: // a request of one of 16 conversations
				d := r.Pick(selection.Request{Key: "conv-" + strconv.Itoa(arg), Now: now})
				if _, ok := d.Replica(); ok {
					held = append(held, d)
				}
			case 5: // a request without a session
				if d := r.Pick(selection.Request{Now: now}); d.Outcome != selection.NoReplica {
					held = append(held, d)
				}
			case 6, 7: // the oldest request ends
				if len(held) > 0 {
					held[0].Release()
					held = held[1:]
				}
			case 8:
				r.SetHealthy(replicas[arg%len(replicas)].ID, arg&4 == 0)
			case 9:
				r.SetLoad(replicas[arg%len(replicas)].ID, selection.Load{Known: arg&4 == 0, Running: float64(arg), KVUsage: float64(arg) / 16})
			case 10: // the fleet shrinks or comes back whole
				fleet = 1 + arg%len(replicas)
				r.reload(r.cfg, replicas[:fleet])
			case 11:
				r.reload(selection.Config{Affinity: arg&1 == 0, MaxSessions: 1 + arg, SessionTTL: time.Minute}, replicas[:fleet])
			case 12: // a rejected reload: a view made and dropped
				r.View(selection.Config{MaxSessions: 1 + arg}, replicas[:1+arg%len(replicas)])
			case 13:
				cfg := r.cfg
				cfg.SpillThreshold = arg % 4
				r.reload(cfg, replicas[:fleet])
			case 14:
				now = now.Add(time.Duration(arg) * 10 * time.Second)
				r.view.Sweep(now)
			case 15: // a client picks a replica
				d := r.Pick(selection.Request{Key: "conv-" + strconv.Itoa(arg), ClientReplica: replicas[arg%len(replicas)].ID, Now: now})
				if _, ok := d.Replica(); ok {
					held = append(held, d)
				}
			}
			st := r.Status()
			if want := inFleet(held, replicas[:fleet]); st.InFlight != want {
				t.Fatalf("op %d (%#x): %d in flight, %d requests held by the fleet", i, op, st.InFlight, want)
			}
			if st.Sessions < 0 || st.Sessions > tableBound(16) {
				t.Fatalf("op %d (%#x): %d sessions", i, op, st.Sessions)
			}
			for _, rs := range st.Replicas {
				if rs.InFlight < 0 || rs.Sessions < 0 || rs.ActiveSessions < 0 || rs.ActiveSessions > rs.Sessions {
					t.Fatalf("op %d (%#x): replica %s: %+v", i, op, rs.ID, rs)
				}
			}
		}
		for _, d := range held {
			d.Release()
		}
		r.reload(r.cfg, replicas)
		if st := r.Status(); st.InFlight != 0 {
			t.Fatalf("%d still in flight after every request ended", st.InFlight)
		}
	})
}

// A replica dropped by one config and listed again by the next (two
// reloads while its streams run) is the same replica: it must still count
// the requests it is serving and keep its sessions. FuzzRouter found it.
func TestReaddedReplicaKeepsItsState(t *testing.T) {
	r := newFloodRouter(2, 100)
	all := r.Replicas()
	streaming := r.Pick(selection.Request{Key: "conv", Now: floodStart})
	rep, _ := streaming.Replica()
	var without []selection.Replica
	for _, x := range all {
		if x.ID != rep.ID {
			without = append(without, x)
		}
	}
	r.reload(r.cfg, without)
	r.reload(r.cfg, all)
	for _, rs := range r.Status().Replicas {
		if rs.ID == rep.ID && (rs.InFlight != 1 || rs.Sessions != 1 || rs.Placed != 1) {
			t.Errorf("%s back in the fleet: in flight %d, conversations %d, placed %d; want 1, 1, 1", rs.ID, rs.InFlight, rs.Sessions, rs.Placed)
		}
	}
	next := r.Pick(selection.Request{Key: "conv", Now: floodStart})
	if got, _ := next.Replica(); got.ID != rep.ID || next.Outcome != selection.Sticky {
		t.Errorf("next turn: %s on %s, want sticky on %s", next.Outcome, got.ID, rep.ID)
	}
	next.Release()
	streaming.Release()
}
