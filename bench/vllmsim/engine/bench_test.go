package engine

import (
	"math/rand/v2"
	"testing"
	"time"
)

// agentSession is a Claude-Code-like conversation: a shared system prompt, a long first
// message, then short follow-ups; every turn resends the whole history.
type agentSession struct {
	history []uint32
	turns   int
	rng     *rand.Rand
}

const (
	labSessions        = 32
	labEngines         = 4
	labTurns           = 6
	labSimulated       = 180 * time.Second
	labMaxOutputTokens = 256
)

func (s *agentSession) nextRequest(nextToken *uint32) *Request {
	newTokens := 400
	if s.turns == 0 {
		newTokens = 7000 + s.rng.IntN(4000) // with the system prompt: 11k-15k tokens
	}
	for range newTokens {
		*nextToken++
		s.history = append(s.history, *nextToken)
	}
	output := make([]uint32, 32+s.rng.IntN(labMaxOutputTokens-31))
	for i := range output {
		*nextToken++
		output[i] = *nextToken
	}
	s.turns++
	return &Request{Prompt: s.history, MaxTokens: labMaxOutputTokens, Output: output}
}

// simulateLab runs labSimulated of virtual time: labSessions closed-loop sessions pinned
// round-robin to labEngines engines of profile p, each sending its next turn as soon as the
// last ends. It returns the number of engine steps and the engines' counters added up.
func simulateLab(tb testing.TB, p Profile, seed uint64) (int, Stats) {
	system := seq(1, 3500)
	nextToken := uint32(1 << 20)
	steps := 0
	var total Stats
	for eng := range labEngines {
		e := newEngine(tb, p)
		owner := map[*Request]*agentSession{}
		for i := eng; i < labSessions; i += labEngines {
			s := &agentSession{history: append([]uint32(nil), system...), rng: rand.New(rand.NewPCG(seed, uint64(i)))}
			r := s.nextRequest(&nextToken)
			owner[r] = s
			if err := e.Add(r, 0); err != nil {
				tb.Fatal(err)
			}
		}
		for now := time.Duration(0); now < labSimulated; {
			dur, events := e.Step(now)
			if dur == 0 {
				break // every session has had all its turns
			}
			now += dur
			steps++
			for _, ev := range events {
				if !ev.Finished {
					continue
				}
				s := owner[ev.Req]
				delete(owner, ev.Req)
				s.history = append(s.history, ev.Req.Output[:ev.Req.Generated]...)
				if s.turns == labTurns {
					continue
				}
				r := s.nextRequest(&nextToken)
				owner[r] = s
				if err := e.Add(r, now); err != nil {
					tb.Fatal(err)
				}
			}
		}
		s := e.Stats()
		total.PrefixCacheQueries += s.PrefixCacheQueries
		total.PrefixCacheHits += s.PrefixCacheHits
		total.ExternalPrefixCacheHits += s.ExternalPrefixCacheHits
		total.GenerationTokens += s.GenerationTokens
	}
	return steps, total
}

// BenchmarkEngineClaudeCodeLab measures the CPU cost of simulating 180 s of 4 engines serving
// 32 Claude-Code-like sessions (prompts of 11k-15k tokens, 6 turns, up to 256 output tokens).
// One op is one whole 180 s simulation.
func BenchmarkEngineClaudeCodeLab(b *testing.B) {
	benchmarkLab(b, Profiles[DefaultProfile])
}

// BenchmarkEngineClaudeCodeLabHostTier is the same with a host tier 4x the GPU cache.
func BenchmarkEngineClaudeCodeLabHostTier(b *testing.B) {
	benchmarkLab(b, withHostTier(Profiles[DefaultProfile], 4))
}

func benchmarkLab(b *testing.B, p Profile) {
	steps := 0
	for i := 0; b.Loop(); i++ {
		steps, _ = simulateLab(b, p, uint64(i))
	}
	b.ReportMetric(float64(steps), "steps/op")
}
