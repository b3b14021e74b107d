package inflight

import (
	"fmt"
	"testing"
	"time"

	"github.com/lmwarden/caddy-warden/selection"
	"github.com/lmwarden/caddy-warden/sessionkey"
)

// A try's decision counts in flight until the next try's replaces it or
// the request ends; a decision set after the end is given back at once.
func TestSetAndRelease(t *testing.T) {
	now := time.Now()
	view := selection.NewRouter("m", now).View(selection.Config{Affinity: true}, []selection.Replica{{ID: "a", Address: "a"}})
	inFlight := func() int64 { return view.Status().InFlight }
	f := &Request{ID: sessionkey.Identity{Key: 1}}
	pick := func() selection.Decision { return view.Pick(selection.Request{Hash: f.ID.Key, Now: now}) }

	if !f.Set(pick()) || inFlight() != 1 {
		t.Fatalf("first try: %d in flight, want 1", inFlight())
	}
	if !f.Set(pick()) || inFlight() != 1 {
		t.Errorf("a retry: %d in flight, want the failed try's given back", inFlight())
	}
	f.Release(now)
	if !f.Over() || inFlight() != 0 {
		t.Errorf("after the end: over %v, %d in flight", f.Over(), inFlight())
	}
	if f.Set(pick()) || inFlight() != 0 {
		t.Errorf("a try after the end was kept: %d in flight", inFlight())
	}
}

// The identity's hints reach selection; the request renders as nothing.
func TestRoutingAndString(t *testing.T) {
	f := &Request{ID: sessionkey.Identity{Key: 7, Parent: 3, Hint: sessionkey.Compacted}}
	if req := f.Routing(); req.Hash != 7 || req.Parent != 3 || req.Compaction != selection.CompactedPrefix {
		t.Errorf("routing %+v", req)
	}
	if s := fmt.Sprint(f); s != "" {
		t.Errorf("renders %q", s)
	}
}
