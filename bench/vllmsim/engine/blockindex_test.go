package engine

import (
	"math/rand/v2"
	"testing"
)

// TestBlockIndexAgreesWithAMap runs random adds, removes and gets against a Go map, on
// hashes drawn from a small set (so that the same hash comes back) whose top bits collide
// often (so that runs form, wrap round the table's end, and close after removals).
func TestBlockIndexAgreesWithAMap(t *testing.T) {
	const numBlocks = 64
	rng := rand.New(rand.NewPCG(1, 2))
	x := newBlockIndex(numBlocks)
	want := map[uint64]int32{}
	hashes := make([]uint64, 3*numBlocks)
	for i := range hashes {
		// The table has 256 slots, a hash's home its top 8 bits: 16 homes, 8 of them in the
		// table's last 8 slots, give long runs, many of which wrap round its end.
		home := uint64(rng.IntN(8)) << 5
		if i%2 == 0 {
			home = 248 + uint64(rng.IntN(8))
		}
		hashes[i] = home<<56 | rng.Uint64()>>8 | 1
	}
	for step := range 100_000 {
		h := hashes[rng.IntN(len(hashes))]
		b, cached := want[h]
		switch {
		case !cached && len(want) < numBlocks:
			b = int32(step % numBlocks)
			if !x.add(h, b) {
				t.Fatalf("step %d: add of %x refused, yet it is not cached", step, h)
			}
			want[h] = b
		case cached && rng.IntN(2) == 0:
			if x.add(h, b+1) {
				t.Fatalf("step %d: add of %x, already cached, accepted", step, h)
			}
		case cached:
			x.remove(h)
			delete(want, h)
		}
		probe := hashes[rng.IntN(len(hashes))]
		got, ok := x.get(probe)
		if wantBlock, wantOK := want[probe]; ok != wantOK || got != wantBlock {
			t.Fatalf("step %d: get(%x) = %d, %v; want %d, %v", step, probe, got, ok, wantBlock, wantOK)
		}
		if x.len() != len(want) {
			t.Fatalf("step %d: %d cached, want %d", step, x.len(), len(want))
		}
	}
}
