package kvevents

import "testing"

// A fleet's shared system prompt is blocks 1-2; conversations' own blocks follow.
func newTestChains(max int) *Chains {
	c := NewChains(max)
	c.Stored(0, []uint64{1, 2})
	return c
}

func TestTailFollowsAConversationAmongOthers(t *testing.T) {
	c := newTestChains(0)
	first := c.Mark()
	c.Stored(2, []uint64{10, 11}) // C's first turn, in two steps
	c.Stored(2, []uint64{20})     // D's first turn, concurrent
	c.Stored(11, []uint64{12})
	c.Stored(20, []uint64{21, 22, 23, 24, 25})
	if tail, ok := c.Tail(first, c.Mark(), 0, 3); !ok || tail != 12 {
		t.Fatalf("C's first turn: Tail = %d, %v; want 12", tail, ok)
	}
	if tail, ok := c.Tail(first, c.Mark(), 0, 6); !ok || tail != 25 {
		t.Fatalf("D's first turn: Tail = %d, %v; want 25", tail, ok)
	}
	if _, ok := c.Tail(first, c.Mark(), 0, 40); ok {
		t.Fatal("a turn that stored 40 blocks matched a chain")
	}
	second := c.Mark()
	c.Stored(25, []uint64{26}) // D's second turn
	c.Stored(12, []uint64{13, 14})
	if tail, ok := c.Tail(second, c.Mark(), 12, 2); !ok || tail != 14 {
		t.Fatalf("C's second turn: Tail = %d, %v; want 14", tail, ok)
	}
	if tail, ok := c.Tail(second, c.Mark(), 25, 1); !ok || tail != 26 {
		t.Fatalf("D's second turn: Tail = %d, %v; want 26", tail, ok)
	}
}

func TestTailAfterEvictionAndAReplyRenderedOtherwise(t *testing.T) {
	c := newTestChains(0)
	c.Stored(2, []uint64{10, 11, 12, 13})
	c.Removed([]uint64{13, 12})
	mark := c.Mark()
	c.Stored(11, []uint64{12, 13, 14}) // evicted blocks stored again, then the new ones
	if tail, ok := c.Tail(mark, c.Mark(), 13, 0); !ok || tail != 14 {
		t.Fatalf("after an eviction: Tail = %d, %v; want 14", tail, ok)
	}
	mark = c.Mark()
	c.Stored(2, []uint64{30, 31, 32}) // a new conversation, same length
	c.Stored(13, []uint64{40, 41})    // the template rendered C's last reply otherwise: it leaves at 13
	if tail, ok := c.Tail(mark, c.Mark(), 14, 3); !ok || tail != 41 {
		t.Fatalf("a turn leaving the chain one block early: Tail = %d, %v; want 41", tail, ok)
	}
	mark = c.Mark()
	c.Stored(2, []uint64{50, 51})
	c.Stored(2, []uint64{60, 61})
	if _, ok := c.Tail(mark, c.Mark(), 0, 2); ok {
		t.Fatal("two new chains of the same length: Tail chose one")
	}
}

func TestEvictedCountsFromTheTail(t *testing.T) {
	c := newTestChains(0)
	c.Stored(2, []uint64{10, 11, 12})
	if n, ok := c.Evicted(12); !ok || n != 0 {
		t.Fatalf("all cached: Evicted = %d, %v", n, ok)
	}
	c.Removed([]uint64{12, 11})
	if n, ok := c.Evicted(12); !ok || n != 2 {
		t.Fatalf("tail evicted: Evicted = %d, %v; want 2", n, ok)
	}
	c.Removed([]uint64{10, 2, 1})
	if n, ok := c.Evicted(12); !ok || n != 5 {
		t.Fatalf("all evicted: Evicted = %d, %v; want 5", n, ok)
	}
	if _, ok := c.Evicted(99); ok {
		t.Fatal("an unknown tail was judged")
	}
	c.Cleared()
	if _, ok := c.Evicted(12); ok {
		t.Fatal("after a clear a tail was judged")
	}
}

func TestChainsAreBounded(t *testing.T) {
	c := NewChains(4)
	c.Stored(0, []uint64{1, 2, 3})
	c.Removed([]uint64{3, 2})
	c.Stored(1, []uint64{4, 5, 6}) // forgets the removed 3 and 2 to make room
	c.Stored(6, []uint64{7})       // finds none: every block kept is cached
	if len(c.nodes) != 4 || c.Overflows != 1 || c.Leading([]uint64{1, 4, 5, 6}) != 4 {
		t.Fatalf("nodes %d, overflows %d, leading %d", len(c.nodes), c.Overflows, c.Leading([]uint64{1, 4, 5, 6}))
	}
}

func TestEvictedBlocksAreForgottenInProportionToTheCache(t *testing.T) {
	c := NewChains(0)
	for i := range uint64(3 * remembered) {
		c.Stored(0, []uint64{i + 1}) // a block stored, then evicted, again and again
		c.Removed([]uint64{i + 1})
		c.Stored(0, []uint64{1})
		c.Removed([]uint64{1})
	}
	if len(c.nodes) > remembered+1 || len(c.uncached) > remembered {
		t.Fatalf("%d nodes, %d uncached kept: evicted blocks must not pile up", len(c.nodes), len(c.uncached))
	}
}

func TestTailOfATurnThatFilledNoBlockIsTheLastOne(t *testing.T) {
	c := newTestChains(0)
	c.Stored(2, []uint64{10, 11})
	mark := c.Mark()
	c.Stored(2, []uint64{30, 31, 32, 33}) // another conversation's, leaving C's chain at 2
	if tail, ok := c.Tail(mark, c.Mark(), 11, 0); !ok || tail != 11 {
		t.Fatalf("Tail = %d, %v; want 11: the turn stored nothing new", tail, ok)
	}
}

func TestCopiesOfABlockAreCounted(t *testing.T) {
	c := newTestChains(0)
	c.Stored(2, []uint64{10}) // two requests computed block 10 at once
	c.Stored(2, []uint64{10})
	c.Removed([]uint64{10})
	if n, ok := c.Evicted(10); !ok || n != 0 {
		t.Fatalf("one copy of two evicted: Evicted = %d, %v; want 0", n, ok)
	}
	c.Removed([]uint64{10})
	if n, ok := c.Evicted(10); !ok || n != 1 {
		t.Fatalf("both copies evicted: Evicted = %d, %v; want 1", n, ok)
	}
}

func TestForgottenAndLoopingChainsAreNotJudged(t *testing.T) {
	c := NewChains(3)
	c.Stored(0, []uint64{1, 2, 3})
	c.Removed([]uint64{1})
	c.Removed([]uint64{3, 2})
	c.Stored(0, []uint64{9}) // forgets 1, removed first
	if n, ok := c.Evicted(3); ok {
		t.Fatalf("Evicted = %d, true: block 1 was forgotten, how much is gone is unknown", n)
	}
	c = NewChains(0)
	c.Stored(6, []uint64{5}) // parents that cycle, from a broken publisher
	c.Stored(5, []uint64{6})
	mark := c.Mark()
	c.Stored(5, []uint64{8})
	c.Removed([]uint64{5, 6})
	if _, ok := c.Evicted(6); ok {
		t.Fatal("a looping chain was judged")
	}
	if _, ok := c.Tail(mark-2, c.Mark(), 0, 3); ok {
		t.Fatal("a looping chain was singled out")
	}
}

// A chain begun after the turn ended is another request's, a fork extending the same chain
// among them; one begun before is the turn's, however late its last blocks arrive.
func TestTailLooksAtChainsBegunBeforeTheEnd(t *testing.T) {
	c := newTestChains(0)
	c.Stored(2, []uint64{10, 11})
	mark := c.Mark()
	c.Stored(11, []uint64{12, 13})
	end := c.Mark() // the reply ended; its last block's event is late
	c.Stored(13, []uint64{14})
	if tail, ok := c.Tail(mark, end, 11, 3); !ok || tail != 14 {
		t.Fatalf("a late last block: Tail = %d, %v; want 14", tail, ok)
	}
	mark = c.Mark()
	c.Stored(14, []uint64{15, 16})
	end = c.Mark()
	c.Stored(16, []uint64{17, 18, 19}) // a fork of the conversation, sent after the reply
	if tail, ok := c.Tail(mark, end, 14, 2); ok && tail != 16 {
		t.Fatalf("Tail = %d: the fork's chain was taken for the turn's", tail)
	}
}
