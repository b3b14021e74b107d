package hitbound

import (
	"slices"
	"testing"

	"github.com/lmwarden/caddy-warden/bench/vllmsim/engine"
)

const bs = 4

// tokens returns n distinct tokens starting at from.
func tokens(from, n int) []uint32 {
	out := make([]uint32, n)
	for i := range out {
		out[i] = uint32(from + i)
	}
	return out
}

// arrive feeds prompt to b, after the prompt of an earlier request (nil: none).
func arrive(b *Bound, prompt, after []uint32) int {
	var previous []uint64
	if after != nil {
		previous = engine.BlockHashes(after, bs)
	}
	return b.Arrive(engine.BlockHashes(prompt, bs), len(prompt), previous)
}

func TestBoundOnACraftedStream(t *testing.T) {
	b := New(bs)
	system := tokens(1000, 8) // two full blocks shared by every conversation

	first := append(slices.Clone(system), tokens(1, 6)...) // 14 tokens: 3 full blocks
	if hit := arrive(b, first, nil); hit != 0 {
		t.Fatalf("first request: bound hit %d, want 0", hit)
	}

	other := append(slices.Clone(system), tokens(500, 9)...) // shares the system prompt only
	if hit := arrive(b, other, nil); hit != 8 {
		t.Fatalf("second conversation: bound hit %d, want the 8 system tokens", hit)
	}

	// A prompt identical to a seen one leaves its last token to compute:
	// 14 tokens hold 3 full blocks, and (14-1)/4 = 3 may hit.
	if hit := arrive(b, first, nil); hit != 12 {
		t.Fatalf("repeat: bound hit %d, want 12", hit)
	}
	exact := system[:8]
	if hit := arrive(b, exact, nil); hit != 4 {
		t.Fatalf("a prompt of exactly two seen blocks: bound hit %d, want 4 ((8-1)/4 blocks)", hit)
	}

	// The first request finishes with 7 output tokens; its next turn resends
	// prompt + output and adds 5 tokens. Computed: the 14 prompt tokens and
	// the first 6 output tokens = 20 tokens = 5 full blocks.
	prompt := append(slices.Clone(system), tokens(1, 6)...)
	output := tokens(2000, 7)
	computed := engine.BlockHashes(slices.Concat(prompt, output[:6]), bs)
	b.Finish(computed[len(prompt)/bs:])
	next := slices.Concat(prompt, output, tokens(3000, 5)) // 26 tokens
	if hit := arrive(b, next, nil); hit != 20 {
		t.Fatalf("next turn: bound hit %d, want 20 (the last output token is never computed)", hit)
	}

	// A divergent block stops the run even if later blocks were seen.
	divergent := slices.Concat(system[:4], tokens(9000, 4), system[4:], tokens(1, 6))
	if hit := arrive(b, divergent, nil); hit != 4 {
		t.Fatalf("divergent prompt: bound hit %d, want 4", hit)
	}
}

// TestBoundIsTheSameAfterAnEarlierPrompt checks that naming the previous
// turn's prompt, which spares looking up the blocks both share, changes no
// hit: the same stream fed with and without it.
func TestBoundIsTheSameAfterAnEarlierPrompt(t *testing.T) {
	system := tokens(1000, 10)
	turn1 := slices.Concat(system, tokens(1, 9))
	turn2 := slices.Concat(turn1, tokens(2000, 7), tokens(3000, 5))
	compacted := slices.Concat(system, tokens(4000, 3)) // shares only the system prompt
	exact := turn1[:12]                                 // three full blocks, all seen: two may hit
	stream := []struct{ prompt, after []uint32 }{
		{turn1, nil}, {turn2, turn1}, {compacted, turn2}, {exact, turn1}, {turn2, turn2},
	}
	with, without := New(bs), New(bs)
	for i, s := range stream {
		got, want := arrive(with, s.prompt, s.after), arrive(without, s.prompt, nil)
		if got != want {
			t.Fatalf("request %d: bound hit %d after the earlier prompt, %d without", i, got, want)
		}
	}
	if got := arrive(with, exact, turn1); got != 8 {
		t.Fatalf("a prompt of three seen blocks after them: bound hit %d, want 8", got)
	}
}
