package faults

import (
	"testing"
	"time"
)

func TestPinsStickinessAndReturn(t *testing.T) {
	t0 := time.Unix(1000, 0)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	req := func(conv string, start int, engine, instance string) request {
		return request{conv: conv, start: at(start), end: at(start + 5), engine: engine, instance: instance, ok: true}
	}
	reqs := []request{
		req("a", 0, "r0/0", "i0"),
		req("b", 0, "r1/0", "i2"),
		// outage from 100 to 200
		req("a", 110, "r0/0", "i1"),
		req("b", 120, "r2/0", "i0"), // off its replica
		req("c", 130, "r2/0", "i1"), // new: its home
		req("c", 140, "r2/0", "i2"),
		// after 200
		req("a", 210, "r0/0", "i2"),
		req("b", 220, "r2/0", "i2"),
		req("b", 230, "r1/0", "i1"), // moved back: the last off-final turn is b's at 220
	}
	spill := req("a", 240, "r2/0", "i1") // moved off its pin for load: its pin now
	spill.outcome = "spilled"
	reqs = append(reqs, spill)
	homes := pinsAt(reqs, at(100))
	if len(homes) != 2 || homes["a"] != "r0" || homes["b"] != "r1" {
		t.Fatalf("pins at the kill: %v", homes)
	}
	if on, all := stickiness(reqs, window{at(100), at(200)}, homes); on != 2 || all != 3 {
		t.Errorf("during: %d of %d on their replica, want 2 of 3", on, all)
	}
	if last, ok := lastOffFinal(reqs, at(200), at(300)); !ok || !last.Equal(at(220)) {
		t.Errorf("last off-final turn %v %v, want +220ms", last.Sub(t0), ok)
	}
	if got := servedThrough(reqs, "i2", at(100)); len(got) != 1 || got[0] != "b" {
		t.Errorf("served through i2 before the kill: %v", got)
	}
	if back, checked := returned(reqs, []string{"a", "b"}, homes, at(200), "i2"); back != 1 || checked != 2 {
		t.Errorf("through i2 after: %d of %d back, want 1 of 2", back, checked)
	}
	if back, checked := returned(reqs, []string{"a", "b"}, homes, at(200), "i1"); back != 2 || checked != 2 {
		t.Errorf("through i1 after: %d of %d back, want 2 of 2 (b came back to r1, a was moved by a spill)", back, checked)
	}
}
