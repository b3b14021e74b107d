package dplb

import (
	"slices"
	"testing"
)

func choices(b *Balancer, n int) []int {
	out := make([]int, n)
	for i := range out {
		out[i] = b.Choose()
	}
	return out
}

func TestDenseV026RotatesWhateverTheLoad(t *testing.T) {
	b, err := New(V026Dense, 4)
	if err != nil {
		t.Fatal(err)
	}
	b.Publish([]EngineLoad{{Running: 30}, {}, {}, {}}) // never published for dense models
	if got := choices(b, 8); !slices.Equal(got, []int{0, 1, 2, 3, 0, 1, 2, 3}) {
		t.Fatalf("choices %v, want a rotation", got)
	}
	if b.PublishesStats() {
		t.Fatal("dense v0.26 ranks publish no stats")
	}
}

func TestV026ScoresPublishedQueuesPlusBumps(t *testing.T) {
	b, _ := New(V026, 3)
	b.Publish([]EngineLoad{{Running: 5}, {Running: 1}, {Waiting: 1}})
	// Scores 5, 1, 4: engine 1 (its bump makes it 5), then engine 2 (4, bumped to 8), then
	// engine 0, the first of the two 5s.
	if got := choices(b, 3); !slices.Equal(got, []int{1, 2, 0}) {
		t.Fatalf("choices %v, want [1 2 0]", got)
	}
	b.Publish([]EngineLoad{{}, {Running: 2}, {Running: 1}})
	if got := b.Choose(); got != 0 {
		t.Fatalf("after a publication the bumps are gone: chose %d, want 0", got)
	}
}

func TestV027RotatesTiesAndWeighsKVUsage(t *testing.T) {
	b, _ := New(V027, 3)
	if got := choices(b, 3); !slices.Equal(got, []int{0, 1, 2}) {
		t.Fatalf("idle engines: choices %v, want a rotation", got)
	}
	for rank := range 3 {
		b.Done(rank)
	}
	// Engine 0: 1 waiting at full KV scores 1 + 1*6*0.5 = 4; engine 1: 3 running scores 3;
	// engine 2: 4 requests in flight from this server score 4.
	b.Publish([]EngineLoad{{Waiting: 1, KVUsage: 1}, {Running: 3}, {}})
	for range 4 {
		b.Pin(2)
	}
	if got := b.Choose(); got != 1 {
		t.Fatalf("chose %d, want 1", got)
	}
}

func TestParseMode(t *testing.T) {
	for _, m := range Modes {
		if got, err := ParseMode(string(m)); err != nil || got != m {
			t.Fatalf("ParseMode(%q) = %q, %v", m, got, err)
		}
	}
	if _, err := ParseMode("random"); err == nil {
		t.Fatal("accepted an unknown mode")
	}
	if _, err := New(V026, 0); err == nil {
		t.Fatal("accepted zero engines")
	}
}
