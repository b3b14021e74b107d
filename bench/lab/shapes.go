package lab

import (
	"cmp"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"runtime"
	"slices"
	"sync"
	"time"

	"github.com/lmwarden/caddy-warden/bench/report"
)

// Shape is one workload drawn at random for `wardenbench shapes`: the
// conversations, how many run at once, and the fleet they run on. A rule is
// kept only if it loses on none of them, so the ranges are wide on purpose.
type Shape struct {
	// Index is the shape's place in its draw; shape i of a seed is the same
	// whatever the count, so one shape can be run alone.
	Index int `json:"index"`

	SystemTokens    int           `json:"system_tokens"`
	FirstTokens     int           `json:"first_tokens"`
	Turns           int           `json:"turns"`
	TurnsSpread     float64       `json:"turns_spread"`
	TurnTokens      int           `json:"turn_tokens"`
	MaxOutputTokens int           `json:"max_output_tokens"`
	OutputSpread    float64       `json:"output_spread"`
	ThinkTime       time.Duration `json:"think_ns"`

	Replicas     int `json:"replicas"`
	Sessions     int `json:"sessions"`
	MaxNumSeqs   int `json:"max_num_seqs"`
	NumGPUBlocks int `json:"num_gpu_blocks"`
	MaxModelLen  int `json:"max_model_len"`
	// Fit is the fleet's KV cache over the working set: the shared prompt
	// on every replica plus every conversation at its mean final length.
	// Below 1 the conversations cannot all stay cached.
	Fit float64 `json:"fit"`

	Warmup           time.Duration `json:"warmup_ns"`
	Duration         time.Duration `json:"duration_ns"`
	ConversationTail time.Duration `json:"conversation_tail_ns"`
}

// Name labels the shape's rows (report.Row.Workload).
func (s Shape) Name() string { return fmt.Sprintf("shape-%03d", s.Index) }

// Ranges a shape is drawn from. Sizes are log-uniform, so that small and
// large are drawn as often; the KV cache is drawn as a multiple of the
// working set so that both fitting and overflowing fleets are common.
const (
	minSystemTokens, maxSystemTokens = 500, 30_000
	minFirstTokens, maxFirstTokens   = 200, 20_000
	minTurns, maxTurns               = 2, 30
	minTurnTokens, maxTurnTokens     = 50, 4_000
	minOutputTokens, maxOutputTokens = 32, 2_048
	maxThinkTime                     = time.Minute
	minReplicas, maxReplicas         = 2, 8
	minPerReplica, maxPerReplica     = 0.5, 16.0
	minFit, maxFit                   = 0.25, 4.0
	// maxConversation bounds a conversation's length (and so max_model_len):
	// a draw past it is drawn again.
	maxConversation = 131_072
)

var maxNumSeqsChoices = []int{16, 32, 64, 128, 256}

// DrawShapes draws count shapes from seed; shape i depends only on seed and i.
func DrawShapes(seed int64, count int, blockSize int) []Shape {
	out := make([]Shape, count)
	for i := range out {
		out[i] = drawShape(seed, i, blockSize)
	}
	return out
}

func drawShape(seed int64, index, blockSize int) Shape {
	rng := rand.New(rand.NewPCG(uint64(seed), uint64(index)))
	logUniform := func(lo, hi float64) float64 { return lo * math.Pow(hi/lo, rng.Float64()) }
	logInt := func(lo, hi int) int { return int(math.Round(logUniform(float64(lo), float64(hi)))) }
	for {
		s := Shape{
			Index:           index,
			SystemTokens:    logInt(minSystemTokens, maxSystemTokens),
			FirstTokens:     logInt(minFirstTokens, maxFirstTokens),
			Turns:           logInt(minTurns, maxTurns),
			TurnsSpread:     round2(rng.Float64() * 0.5),
			TurnTokens:      logInt(minTurnTokens, maxTurnTokens),
			MaxOutputTokens: logInt(minOutputTokens, maxOutputTokens),
			OutputSpread:    round2(0.1 + 0.8*rng.Float64()),
			Replicas:        minReplicas + rng.IntN(maxReplicas-minReplicas+1),
			MaxNumSeqs:      maxNumSeqsChoices[rng.IntN(len(maxNumSeqsChoices))],
		}
		// One shape in five has no pause at all: a pure closed loop.
		if rng.Float64() >= 0.2 {
			s.ThinkTime = time.Duration(logUniform(0.5, maxThinkTime.Seconds()) * float64(time.Second)).Round(100 * time.Millisecond)
		}
		perReplica := logUniform(minPerReplica, maxPerReplica)
		s.Sessions = max(1, int(math.Round(perReplica*float64(s.Replicas))))
		longest := s.longestConversation()
		if longest > maxConversation {
			continue
		}
		s.MaxModelLen = roundUp(longest+blockSize, 1024)
		// The cache is drawn as a multiple of the shared prompt once plus
		// the conversations, spread over the replicas, as it always was,
		// so that a seed still draws the same shapes; Fit counts the shared
		// prompt on every replica.
		drawn := round2(logUniform(minFit, maxFit))
		perEngine := max(float64(s.MaxModelLen), drawn*(float64(s.SystemTokens)+s.conversations())/float64(s.Replicas))
		s.NumGPUBlocks = int(math.Ceil(perEngine / float64(blockSize)))
		s.Fit = round2(float64(s.NumGPUBlocks*blockSize*s.Replicas) / s.workingSet())
		s.Warmup, s.Duration, s.ConversationTail = s.windows()
		return s
	}
}

// meanOutput is the mean reply: max_tokens is drawn from
// [max×(1-spread), max] and the simulator generates all of it.
func (s Shape) meanOutput() float64 {
	return float64(s.MaxOutputTokens) * (1 - s.OutputSpread/2)
}

// longestConversation bounds a conversation's last prompt and reply, with
// every spread at its top.
func (s Shape) longestConversation() int {
	turns := math.Ceil(float64(s.Turns) * (1 + s.TurnsSpread))
	return int(math.Ceil(float64(s.SystemTokens) + 1.1*float64(s.FirstTokens) +
		(turns-1)*(1.1*float64(s.TurnTokens)+float64(s.MaxOutputTokens)) + float64(s.MaxOutputTokens)))
}

// workingSet is what the fleet must hold for no conversation to lose its
// cache: the shared prompt on every replica, as each serves new
// conversations, plus every conversation.
func (s Shape) workingSet() float64 {
	return float64(s.Replicas*s.SystemTokens) + s.conversations()
}

// conversations is every conversation's own part at its mean final length.
func (s Shape) conversations() float64 {
	own := float64(s.FirstTokens) + float64(s.Turns-1)*(float64(s.TurnTokens)+s.meanOutput()) + s.meanOutput()
	return float64(s.Sessions) * own
}

// Fits reports whether every conversation can stay cached at once.
func (s Shape) Fits() bool { return s.Fit >= 1 }

// lifetime estimates how long a conversation lives at light load: its
// pauses, its prefills (DESIGN §5: ~0.19 ms a token) and its replies (~30 ms
// a token).
func (s Shape) lifetime() time.Duration {
	const prefill, decode = 190 * time.Microsecond, 30 * time.Millisecond
	turn := s.ThinkTime + time.Duration(s.TurnTokens)*prefill + time.Duration(s.meanOutput()*float64(decode))
	return time.Duration(s.Turns)*turn + time.Duration(s.SystemTokens+s.FirstTokens)*prefill
}

// measuredTurns is about how many turns a shape's window measures at
// least, at light load: fewer, and a few slow turns decide its percentiles.
const measuredTurns = 400

// windows sizes a run's warm-up, measured window and conversation tail by
// the conversations' lifetime at light load, so that every shape measures
// several generations of conversations: a warm-up of one lifetime (1 to 15
// minutes), a window of two that holds at least measuredTurns turns (3 to
// 30 minutes), and a tail long enough for the conversations sent in the
// window to end even under heavy load (the run stops as soon as they
// have), so that the time per conversation is not that of the short ones
// only.
func (s Shape) windows() (warmup, duration, tail time.Duration) {
	life := s.lifetime()
	perTurn := life / time.Duration(s.Turns)
	enough := measuredTurns * perTurn / time.Duration(s.Sessions)
	clamp := func(d, lo, hi time.Duration) time.Duration { return min(max(d, lo), hi).Round(time.Second) }
	return clamp(life, time.Minute, 15*time.Minute), clamp(max(2*life, enough), 3*time.Minute, 30*time.Minute), max(10*life, time.Hour).Round(time.Second)
}

// cost is the shape's simulated work, roughly: sessions times simulated time.
func (s Shape) cost() float64 {
	return float64(s.Sessions) * (s.Warmup + s.Duration + s.lifetime()).Seconds()
}

// Config is base with the shape's workload, fleet and windows.
func (s Shape) Config(base Config) Config {
	cfg := base
	w := &cfg.Workload
	w.SystemPromptTokens, w.SystemPromptSpread = s.SystemTokens, 0
	w.FirstMessageTokens, w.FirstMessageSpread = s.FirstTokens, 0.1
	w.Turns, w.TurnsSpread = s.Turns, s.TurnsSpread
	w.TurnTokens, w.TurnTokensSpread = s.TurnTokens, 0.1
	w.MaxOutputTokens, w.MaxOutputSpread = s.MaxOutputTokens, s.OutputSpread
	w.ThinkTime, w.ThinkSpread = s.ThinkTime, 1
	cfg.Profile.MaxNumSeqs, cfg.Profile.NumGPUBlocks, cfg.Profile.MaxModelLen = s.MaxNumSeqs, s.NumGPUBlocks, s.MaxModelLen
	cfg.Replicas = s.Replicas
	cfg.Warmup, cfg.Duration, cfg.ConversationTail = s.Warmup, s.Duration, s.ConversationTail
	return cfg
}

// LabArgs are the `wardenbench lab` flags that run the shape alone.
func (s Shape) LabArgs() []string {
	return []string{
		fmt.Sprintf("--replicas=%d", s.Replicas), fmt.Sprintf("--sessions=%d", s.Sessions),
		fmt.Sprintf("--system-tokens=%d", s.SystemTokens), "--system-spread=0",
		fmt.Sprintf("--first-tokens=%d", s.FirstTokens), "--first-spread=0.1",
		fmt.Sprintf("--turns=%d", s.Turns), fmt.Sprintf("--turns-spread=%g", s.TurnsSpread),
		fmt.Sprintf("--turn-tokens=%d", s.TurnTokens), "--turn-spread=0.1",
		fmt.Sprintf("--max-output-tokens=%d", s.MaxOutputTokens), fmt.Sprintf("--output-spread=%g", s.OutputSpread),
		fmt.Sprintf("--think-time=%v", s.ThinkTime), "--think-spread=1",
		fmt.Sprintf("--max-num-seqs=%d", s.MaxNumSeqs), fmt.Sprintf("--num-gpu-blocks=%d", s.NumGPUBlocks),
		fmt.Sprintf("--max-model-len=%d", s.MaxModelLen),
		fmt.Sprintf("--warmup=%v", s.Warmup), fmt.Sprintf("--duration=%v", s.Duration),
		fmt.Sprintf("--conversation-tail=%v", s.ConversationTail),
	}
}

// RunShapes runs every policy on every shape for every seed, one run per
// job on up to workers goroutines (0: one per CPU), the costliest shapes
// first, and returns the rows labelled with their shape (Workload), in
// shape, seed, policy order. The rows do not depend on workers. progress is
// Sweep's.
func RunShapes(base Config, shapes []Shape, policies []string, seeds []int64, workers int, progress func()) ([]report.Row, error) {
	if len(shapes) == 0 || len(policies) == 0 || len(seeds) == 0 {
		return nil, errors.New("lab: shapes need at least one shape, policy and seed")
	}
	if err := CheckPolicies(policies); err != nil {
		return nil, err
	}
	type job struct{ shape, seed, policy int }
	jobs := make([]job, 0, len(shapes)*len(seeds)*len(policies))
	for i := range shapes {
		for j := range seeds {
			for k := range policies {
				jobs = append(jobs, job{i, j, k})
			}
		}
	}
	rows := make([]report.Row, len(jobs))
	errs := make([]error, len(jobs))
	order := make([]int, len(jobs))
	for i := range order {
		order[i] = i
	}
	slices.SortStableFunc(order, func(a, b int) int {
		return cmp.Compare(shapes[jobs[b].shape].cost(), shapes[jobs[a].shape].cost())
	})
	if workers <= 0 {
		workers = runtime.NumCPU()
	}
	var progressMu sync.Mutex
	next := make(chan int)
	var wg sync.WaitGroup
	for range min(workers, len(jobs)) {
		wg.Go(func() {
			for i := range next {
				j, s := jobs[i], shapes[jobs[i].shape]
				row, err := Run(s.Config(base), policies[j.policy], s.Sessions, seeds[j.seed])
				if err != nil {
					errs[i] = fmt.Errorf("%s: %w", s.Name(), err)
				}
				row.Workload, row.ThinkTimeS = s.Name(), s.ThinkTime.Seconds()
				rows[i] = row
				if progress != nil {
					progressMu.Lock()
					progress()
					progressMu.Unlock()
				}
			}
		})
	}
	for _, i := range order {
		next <- i
	}
	close(next)
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return rows, nil
}

func round2(x float64) float64 { return math.Round(x*100) / 100 }

func roundUp(n, unit int) int { return (n + unit - 1) / unit * unit }
