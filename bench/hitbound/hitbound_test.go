package hitbound

import "testing"

func seq(from, n int) []uint32 {
	out := make([]uint32, n)
	for i := range out {
		out[i] = uint32(from + i)
	}
	return out
}

func TestBoundOnCraftedStream(t *testing.T) {
	b := New(4)
	system := seq(0, 8) // two blocks shared by everyone
	a := append(append([]uint32{}, system...), seq(100, 6)...)
	if hit, _ := b.Arrive(a); hit != 0 {
		t.Fatalf("first request hit %d", hit)
	}
	other := append(append([]uint32{}, system...), seq(200, 6)...)
	if hit, _ := b.Arrive(other); hit != 8 {
		t.Fatalf("second conversation hit %d, want the 8 system tokens", hit)
	}
	// a's next turn resends a (14 tokens) + its 5-token reply + 3 new tokens.
	hitA, chainA := b.Arrive(a) // the identical prompt again
	if hitA != 12 {
		t.Fatalf("repeated 14-token prompt hit %d, want its 3 full blocks", hitA)
	}
	reply := seq(300, 5)
	b.Finish(chainA, a, reply)
	next := append(append(append([]uint32{}, a...), reply...), seq(400, 3)...) // 22 tokens
	if hit, _ := b.Arrive(next); hit != 16 {
		t.Fatalf("next turn hit %d, want 16: prompt and reply but the last reply token", hit)
	}
}

func TestLastPromptTokenIsNeverAHit(t *testing.T) {
	b := New(4)
	p := seq(0, 8)
	b.Arrive(p)
	if hit, _ := b.Arrive(p); hit != 4 {
		t.Fatalf("8-token prompt seen before hit %d, want 4 (its last token is computed)", hit)
	}
}
