package lab

import (
	"math"
	"reflect"
	"testing"
)

// Shape i of a seed is the same whatever the count, so that one shape can
// be run alone; another seed draws other shapes.
func TestDrawShapesIsReproducible(t *testing.T) {
	bs := DefaultConfig().Profile.BlockSize
	few, many := DrawShapes(7, 5, bs), DrawShapes(7, 50, bs)
	if !reflect.DeepEqual(few, many[:5]) {
		t.Fatal("the first 5 of 50 shapes differ from 5 drawn alone")
	}
	if reflect.DeepEqual(few, DrawShapes(8, 5, bs)) {
		t.Fatal("seeds 7 and 8 drew the same shapes")
	}
}

// Every shape is in its ranges, can run (its conversations fit in the
// model's length, which fits in the KV cache), and says how much of its
// working set the fleet's caches hold; the draw covers the ranges.
func TestShapesAreRunnableAndCoverTheirRanges(t *testing.T) {
	base := DefaultConfig()
	shapes := DrawShapes(1, 500, base.Profile.BlockSize)
	var fits, overflows, pauseless, twoReplicas, eight int
	for _, s := range shapes {
		if err := s.Config(base).Validate(); err != nil {
			t.Fatalf("%s: %v", s.Name(), err)
		}
		switch {
		case s.SystemTokens < minSystemTokens || s.SystemTokens > maxSystemTokens,
			s.Turns < minTurns || s.Turns > maxTurns,
			s.Replicas < minReplicas || s.Replicas > maxReplicas,
			s.ThinkTime < 0 || s.ThinkTime > maxThinkTime,
			s.longestConversation() > s.MaxModelLen,
			s.MaxModelLen > s.NumGPUBlocks*base.Profile.BlockSize:
			t.Fatalf("%s out of range: %+v", s.Name(), s)
		}
		perReplica := float64(s.Sessions) / float64(s.Replicas)
		if perReplica < minPerReplica/2 || perReplica > maxPerReplica*1.1 {
			t.Fatalf("%s: %.1f conversations per replica", s.Name(), perReplica)
		}
		if want := float64(s.NumGPUBlocks*base.Profile.BlockSize*s.Replicas) / s.workingSet(); math.Abs(s.Fit-want) > 0.01 {
			t.Fatalf("%s: fit %.2f, the caches hold %.2f of the working set", s.Name(), s.Fit, want)
		}
		if s.Fits() {
			fits++
		} else {
			overflows++
		}
		if s.ThinkTime == 0 {
			pauseless++
		}
		switch s.Replicas {
		case minReplicas:
			twoReplicas++
		case maxReplicas:
			eight++
		}
	}
	for what, n := range map[string]int{"fit": fits, "overflow": overflows, "have no pause": pauseless, "run on 2 replicas": twoReplicas, "run on 8": eight} {
		if n < 25 {
			t.Errorf("only %d of 500 shapes %s", n, what)
		}
	}
}

// Every replica holds the shared prompt beside its conversations: two
// replicas of 12k tokens cannot keep two 5k conversations beside a 10k
// prompt each, though counted once for the fleet it would seem to fit.
func TestFitCountsTheSharedPromptOnEveryReplica(t *testing.T) {
	s := Shape{Replicas: 2, Sessions: 2, SystemTokens: 10_000, FirstTokens: 5_000, Turns: 1}
	if fleet := 2 * 12_000.0; fleet >= s.workingSet() {
		t.Fatalf("working set %.0f tokens fits caches of %.0f", s.workingSet(), fleet)
	}
}

// A shape's run is the lab's run of its configuration, labelled with it,
// whatever the workers.
func TestRunShapesLabelsTheLabsRows(t *testing.T) {
	base := DefaultConfig()
	shapes := DrawShapes(3, 2, base.Profile.BlockSize)
	for i := range shapes { // short, so that the test is
		shapes[i].Warmup, shapes[i].Duration, shapes[i].ConversationTail = 0, 30e9, 0
	}
	policies := []string{PolicyWarden, PolicyHeader}
	rows, err := RunShapes(base, shapes, policies, []int64{1}, 2, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != 4 {
		t.Fatalf("%d rows, want 4", len(rows))
	}
	serial, err := RunShapes(base, shapes, policies, []int64{1}, 1, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(rows, serial) {
		t.Fatal("rows depend on the workers")
	}
	alone, err := Run(shapes[1].Config(base), PolicyHeader, shapes[1].Sessions, 1)
	if err != nil {
		t.Fatal(err)
	}
	alone.Workload, alone.ThinkTimeS = shapes[1].Name(), shapes[1].ThinkTime.Seconds()
	if !reflect.DeepEqual(rows[3], alone) {
		t.Fatalf("shape 1's header row:\n%+v\nalone:\n%+v", rows[3], alone)
	}
}
