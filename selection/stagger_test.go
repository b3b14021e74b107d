package selection

import (
	"testing"
	"time"

	"github.com/lmwarden/caddy-warden/loadcontrol"
)

// A replica filling from empty takes a new conversation at most once per
// Stagger; the one it holds then keeps coming, and once a resident has
// left, or the replica has emptied, newcomers are taken as room frees.
func TestStaggerPacesAFillingReplica(t *testing.T) {
	r := holding(newTestRouter(1, Config{Admission: loadcontrol.Config{
		Enabled: true, CapacityTokens: 1000, Fill: 1, Linger: time.Minute, Quantum: -1, Stagger: 15 * time.Second,
	}}))
	var ready []string
	admit := func(key string, at time.Duration) *loadcontrol.Ticket {
		return r.admitKey(HashKey(key), loadcontrol.Body{Bytes: 100 * BytesPerToken}, nil, t0.Add(at), func() { ready = append(ready, key) })
	}
	a := admit("a", 0)
	mustState(t, a, loadcontrol.Admitted) // an empty replica takes one at once
	if got, want := r.Status().Replicas[0].NextNewcomer, t0.Add(15*time.Second); !got.Equal(want) {
		t.Fatalf("next newcomer at %v, want %v", got, want)
	}
	b := admit("b", time.Second)
	mustState(t, b, loadcontrol.Waiting) // room enough, but too soon after a
	a.Done(t0.Add(2 * time.Second))
	mustState(t, admit("a", 3*time.Second), loadcontrol.Admitted) // a resident is not a newcomer
	r.Sweep(t0.Add(14 * time.Second))
	mustState(t, b, loadcontrol.Waiting)
	r.Sweep(t0.Add(15 * time.Second))
	mustState(t, b, loadcontrol.Admitted)
	c, d := admit("c", 16*time.Second), admit("d", 17*time.Second)
	mustState(t, c, loadcontrol.Waiting)
	b.End(t0.Add(20*time.Second), loadcontrol.Reply{TaskEnded: true}) // a resident left: no more staggering
	if got := r.Status().Replicas[0].NextNewcomer; !got.IsZero() {
		t.Fatalf("next newcomer at %v once a resident left, want none", got)
	}
	mustState(t, c, loadcontrol.Admitted)
	mustState(t, d, loadcontrol.Admitted)
	if want := []string{"b", "c", "d"}; len(ready) != len(want) || ready[0] != want[0] || ready[1] != want[1] || ready[2] != want[2] {
		t.Fatalf("admitted from the queue in the order %v, want %v", ready, want)
	}
}

// Without Stagger, newcomers fill a replica's room at once.
func TestNoStaggerFillsAtOnce(t *testing.T) {
	r := newTestRouter(1, Config{Admission: loadcontrol.Config{
		Enabled: true, CapacityTokens: 1000, Fill: 1, Linger: time.Minute, Quantum: -1,
	}})
	for _, key := range []string{"a", "b", "c"} {
		mustState(t, r.admitKey(HashKey(key), loadcontrol.Body{Bytes: 100 * BytesPerToken}, nil, t0, nil), loadcontrol.Admitted)
	}
}

// A replica that emptied fills anew: staggered again, its first newcomer
// at once.
func TestStaggerAgainAfterAReplicaEmptied(t *testing.T) {
	r := holding(newTestRouter(1, Config{Admission: loadcontrol.Config{
		Enabled: true, CapacityTokens: 1000, Fill: 1, Linger: time.Minute, Quantum: -1, Stagger: 15 * time.Second,
	}}))
	a := r.admitKey(HashKey("a"), loadcontrol.Body{Bytes: 400}, nil, t0, nil)
	r.Sweep(t0.Add(15 * time.Second))
	b := r.admitKey(HashKey("b"), loadcontrol.Body{Bytes: 400}, nil, t0.Add(15*time.Second), nil)
	mustState(t, b, loadcontrol.Admitted)
	a.End(t0.Add(16*time.Second), loadcontrol.Reply{TaskEnded: true}) // settled: b still there
	b.End(t0.Add(17*time.Second), loadcontrol.Reply{TaskEnded: true}) // empty again
	at := t0.Add(18 * time.Second)
	mustState(t, r.admitKey(HashKey("c"), loadcontrol.Body{Bytes: 400}, nil, at, nil), loadcontrol.Admitted)
	mustState(t, r.admitKey(HashKey("d"), loadcontrol.Body{Bytes: 400}, nil, at, nil), loadcontrol.Waiting)
}

// staggeredReplica is one replica with room for ten 100-token prompts and
// a stagger of 15 s, a clock in seconds, and a way to send a turn of key at
// second s.
func staggeredReplica() (testRouter, func(s int) time.Time, func(key string, s int) *loadcontrol.Ticket) {
	r := holding(newTestRouter(1, Config{Admission: loadcontrol.Config{
		Enabled: true, CapacityTokens: 1000, Fill: 1, Linger: time.Minute, Quantum: -1, Stagger: 15 * time.Second,
	}}))
	at := func(s int) time.Time { return t0.Add(time.Duration(s) * time.Second) }
	admit := func(key string, s int) *loadcontrol.Ticket {
		return r.admitKey(HashKey(key), loadcontrol.Body{Bytes: 100 * BytesPerToken}, nil, at(s), nil)
	}
	return r, at, admit
}

// A turn going to its own replica, with room, passes a head that waits for
// a stagger alone: only conversations that would take a replica anew wait
// behind it.
func TestStaggeredHeadHoldsBackOnlyNewcomers(t *testing.T) {
	r, at, admit := staggeredReplica()
	c := admit("c", 0)
	c.End(at(1), loadcontrol.Reply{TaskEnded: true}) // the replica empties; c keeps its pin
	mustState(t, admit("a", 2), loadcontrol.Admitted)
	b := admit("b", 3)
	mustState(t, b, loadcontrol.Waiting)
	c2 := admit("c", 4)
	mustState(t, c2, loadcontrol.Admitted) // to its own replica: it passes b
	d := admit("d", 5)
	mustState(t, d, loadcontrol.Waiting) // a newcomer: behind b
	r.Sweep(at(16))
	mustState(t, b, loadcontrol.Waiting)
	r.Sweep(at(17))
	mustState(t, b, loadcontrol.Admitted)
	mustState(t, d, loadcontrol.Waiting)
}

// A turn forced over capacity onto a replica that is not its pin counts as
// that replica's newcomer: the next one is paced from it.
func TestStaggerCountsAForcedNewcomer(t *testing.T) {
	_, at, admit := staggeredReplica()
	mustState(t, admit("a", 0), loadcontrol.Admitted)
	b := admit("b", 1)
	mustState(t, b, loadcontrol.Waiting)
	if !b.Force(at(10)) {
		t.Fatal("b was not waiting")
	}
	mustState(t, admit("c", 16), loadcontrol.Waiting) // 6 s after b, though 16 s after a
}
