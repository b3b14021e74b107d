package hitbound

import (
	"slices"
	"testing"
)

// tokens returns n distinct tokens starting at from.
func tokens(from, n int) []uint32 {
	out := make([]uint32, n)
	for i := range out {
		out[i] = uint32(from + i)
	}
	return out
}

func TestBoundOnACraftedStream(t *testing.T) {
	const bs = 4
	b := New(bs)
	system := tokens(1000, 8) // two full blocks shared by every conversation

	first := append(slices.Clone(system), tokens(1, 6)...) // 14 tokens: 3 full blocks
	if hit, _ := b.Arrive(first); hit != 0 {
		t.Fatalf("first request: bound hit %d, want 0", hit)
	}

	other := append(slices.Clone(system), tokens(500, 9)...) // shares the system prompt only
	if hit, _ := b.Arrive(other); hit != 8 {
		t.Fatalf("second conversation: bound hit %d, want the 8 system tokens", hit)
	}

	// A prompt identical to a seen one leaves its last token to compute:
	// 14 tokens hold 3 full blocks, and (14-1)/4 = 3 may hit.
	if hit, _ := b.Arrive(first); hit != 12 {
		t.Fatalf("repeat: bound hit %d, want 12", hit)
	}
	exact := system[:8]
	if hit, _ := b.Arrive(exact); hit != 4 {
		t.Fatalf("a prompt of exactly two seen blocks: bound hit %d, want 4 ((8-1)/4 blocks)", hit)
	}

	// The first request finishes with 7 output tokens; its next turn resends
	// prompt + output and adds 5 tokens. Computed: the 14 prompt tokens and
	// the first 6 output tokens = 20 tokens = 5 full blocks.
	prompt := append(slices.Clone(system), tokens(1, 6)...)
	hit, c := b.Arrive(prompt)
	if hit != 12 || c.tokens != 12 {
		t.Fatalf("resent prompt: hit %d, chain covers %d tokens; want 12, 12", hit, c.tokens)
	}
	output := tokens(2000, 7)
	b.Finish(c, prompt, output)
	next := slices.Concat(prompt, output, tokens(3000, 5)) // 26 tokens
	if hit, _ := b.Arrive(next); hit != 20 {
		t.Fatalf("next turn: bound hit %d, want 20 (the last output token is never computed)", hit)
	}

	// A divergent block stops the run even if later blocks were seen.
	divergent := slices.Concat(system[:4], tokens(9000, 4), system[4:], tokens(1, 6))
	if hit, _ := b.Arrive(divergent); hit != 4 {
		t.Fatalf("divergent prompt: bound hit %d, want 4", hit)
	}
}
