package lab

import (
	"reflect"
	"testing"
	"time"
)

// Turns held past MaxWait are forced through at the same tick; forced in a
// map's order, the same run told another story from one time to the next.
func TestHeldTurnsForcedTogetherRunTheSameEveryTime(t *testing.T) {
	const hurried = "test-admission-hurried"
	hurry := farmAdmission
	hurry.MaxWait = 2 * time.Second // many turns overdue at each tick
	policyFactories[hurried] = newAdmissionPolicy(hurry)
	defer delete(policyFactories, hurried)
	cfg := DefaultConfig()
	cfg.Warmup, cfg.Duration = time.Minute, 2*time.Minute
	first, err := Run(cfg, hurried, 32, 1)
	if err != nil {
		t.Fatal(err)
	}
	for range 2 {
		again, err := Run(cfg, hurried, 32, 1)
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(again, first) {
			t.Fatalf("the same run gave another result:\n%+v\nthen\n%+v", first, again)
		}
	}
}
