package engine

import (
	"math/rand/v2"
	"testing"
	"time"
)

// TestKVEventsReplayToTheCache checks that applying every step's KV events, in order, to an
// empty set gives exactly the engine's prefix cache, through overlapping conversations on a
// cache small enough to evict, and that each stored run is a valid piece of a hash chain.
func TestKVEventsReplayToTheCache(t *testing.T) {
	const blockSize = 4
	e := newEngine(t, smallProfile(blockSize, 64))
	e.EnableKVEvents()
	rng := rand.New(rand.NewPCG(3, 4))
	system := seq(1, 10)
	replayed := map[uint64]bool{}
	var now time.Duration
	removed := 0
	for i := range 40 {
		prompt := concat(system, seq(1000*(i%7+1), 8+rng.IntN(40)))
		if err := e.Add(request(prompt, 1+rng.IntN(12)), now); err != nil {
			t.Fatal(err)
		}
		for range 3 + rng.IntN(4) { // let requests overlap
			dur, _ := e.Step(now)
			now += dur
			for _, ev := range e.TakeKVEvents() {
				switch ev.Kind {
				case BlockStored:
					checkStoredRun(t, ev, blockSize)
					for _, h := range ev.BlockHashes {
						if replayed[h] {
							t.Fatalf("block %x stored twice without removal", h)
						}
						replayed[h] = true
					}
				case BlockRemoved:
					if !replayed[ev.BlockHashes[0]] {
						t.Fatalf("block %x removed but never stored", ev.BlockHashes[0])
					}
					delete(replayed, ev.BlockHashes[0])
					removed++
				}
			}
		}
	}
	if removed == 0 {
		t.Fatal("the cache never evicted: the test does not cover removals")
	}
	if len(replayed) != e.pool.cached.len() {
		t.Fatalf("events say %d cached blocks, the engine has %d", len(replayed), e.pool.cached.len())
	}
	for _, h := range e.pool.hashes {
		if h != 0 && !replayed[h] {
			t.Fatalf("block %x is cached but no event says so", h)
		}
	}
}

// checkStoredRun checks that a stored run's hashes chain from its parent over its tokens.
func checkStoredRun(t *testing.T, ev KVEvent, blockSize int) {
	t.Helper()
	if len(ev.TokenIDs) != len(ev.BlockHashes)*blockSize {
		t.Fatalf("%d tokens for %d blocks of %d", len(ev.TokenIDs), len(ev.BlockHashes), blockSize)
	}
	parent := ev.ParentBlockHash
	for b, h := range ev.BlockHashes {
		want := chainHash(parent, b*blockSize, blockSize, func(i int) uint32 { return ev.TokenIDs[i] })
		if h != want {
			t.Fatalf("block %d of a stored run: hash %x, its tokens and parent give %x", b, h, want)
		}
		parent = h
	}
}

func TestBlockHashesIsTheChainTheEngineCaches(t *testing.T) {
	e := newEngine(t, smallProfile(4, 64))
	e.EnableKVEvents()
	prompt := seq(7, 18) // 4 full blocks and 2 tokens
	serve(t, e, request(prompt, 1), 0)
	var stored []uint64
	for _, ev := range e.TakeKVEvents() {
		stored = append(stored, ev.BlockHashes...)
	}
	chain := BlockHashes(prompt, 4)
	if len(chain) != 4 || len(stored) < 4 {
		t.Fatalf("chain %x, stored %x", chain, stored)
	}
	for i, h := range chain {
		if stored[i] != h {
			t.Fatalf("block %d: BlockHashes gives %x, the engine stored %x", i, h, stored[i])
		}
	}
}

func TestNoKVEventsUnlessEnabled(t *testing.T) {
	e := newEngine(t, smallProfile(4, 64))
	serve(t, e, request(seq(1, 30), 3), 0)
	if ev := e.TakeKVEvents(); ev != nil {
		t.Fatalf("events without EnableKVEvents: %v", ev)
	}
}
