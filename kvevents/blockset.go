package kvevents

// blockSet is one replica's cached block hashes as its events tell them, never larger than max.
type blockSet struct {
	max       int
	blocks    map[uint64]struct{}
	overflows uint64 // stored hashes not kept because the set was full
}

func newBlockSet(max int) *blockSet {
	return &blockSet{max: max, blocks: map[uint64]struct{}{}}
}

func (s *blockSet) apply(ev event) {
	switch ev.kind {
	case blockStored:
		for _, h := range ev.hashes {
			if _, ok := s.blocks[h]; ok {
				continue
			}
			if len(s.blocks) >= s.max {
				s.overflows++
				continue
			}
			s.blocks[h] = struct{}{}
		}
	case blockRemoved:
		for _, h := range ev.hashes {
			delete(s.blocks, h)
		}
	case allBlocksCleared:
		s.clear()
	}
}

// clear empties the set and gives its memory back.
func (s *blockSet) clear() { s.blocks = map[uint64]struct{}{} }

// leading counts how many of chain's first blocks are in the set, stopping at the first miss,
// as vLLM's prefix cache does.
func (s *blockSet) leading(chain []uint64) int {
	for i, h := range chain {
		if _, ok := s.blocks[h]; !ok {
			return i
		}
	}
	return len(chain)
}
