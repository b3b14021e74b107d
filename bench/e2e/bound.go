package e2e

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"slices"
	"sync"
	"time"

	"github.com/lmwarden/caddy-warden/bench/agentload"
	"github.com/lmwarden/caddy-warden/bench/hitbound"
	"github.com/lmwarden/caddy-warden/bench/vllmsim/engine"
	"github.com/lmwarden/caddy-warden/bench/vllmsim/server"
)

// boundRecorder sits in the load generator's HTTP client and computes
// hit_bound_percent over the requests a level sends: it tokenizes each body
// as the simulator does and feeds the stream to a hitbound.Bound, which
// lives as long as the replicas' caches do. A turn's reply is the stretch of
// the next turn's prompt after the previous prompt, as long as the reply's
// token count, so replies need not be captured.
type boundRecorder struct {
	header    string
	blockSize int

	mu    sync.Mutex
	bound *hitbound.Bound
	last  map[string]*turnTokens // by session, until its last turn ends
	from  time.Time              // requests arriving before are not counted
	// counts are the measured hits and prompt tokens by the model the
	// requests name: each model's replicas have their own caches.
	counts map[string]boundCount
}

type boundCount struct{ hits, prompted int }

type turnTokens struct {
	prompt []uint32
	hashes []uint64 // of the prompt's full blocks
	output int      // reply tokens, once the turn ended
}

func newBoundRecorder(sessionHeader string, blockSize int) *boundRecorder {
	return &boundRecorder{header: sessionHeader, blockSize: blockSize, bound: hitbound.New(blockSize), last: map[string]*turnTokens{}, counts: map[string]boundCount{}}
}

// through returns a RoundTripper that records each request's prompt, then
// sends it with next.
func (b *boundRecorder) through(next http.RoundTripper) http.RoundTripper {
	return roundTripperFunc(func(req *http.Request) (*http.Response, error) {
		if err := b.record(req); err != nil {
			return nil, err
		}
		return next.RoundTrip(req)
	})
}

type roundTripperFunc func(*http.Request) (*http.Response, error)

func (f roundTripperFunc) RoundTrip(req *http.Request) (*http.Response, error) { return f(req) }

// measureFrom starts counting afresh at t.
func (b *boundRecorder) measureFrom(t time.Time) {
	b.mu.Lock()
	b.from = t
	clear(b.counts)
	b.mu.Unlock()
}

// record reads the request's prompt, leaving its body intact.
func (b *boundRecorder) record(req *http.Request) error {
	if req.Body == nil {
		return nil
	}
	body, err := io.ReadAll(req.Body)
	req.Body.Close()
	if err != nil {
		return err
	}
	req.Body = io.NopCloser(bytes.NewReader(body))
	if prompt, err := server.PromptTokens(req.URL.Path, body); err == nil {
		var named struct {
			Model string `json:"model"`
		}
		_ = json.Unmarshal(body, &named) // a prompt was read: the body is JSON
		b.arrive(b.conversation(req), named.Model, prompt)
	}
	return nil
}

// arrive feeds a prompt of session to the bound. The models' prompts share
// no prefix, so one bound serves both, its counts kept by model.
func (b *boundRecorder) arrive(session, model string, prompt []uint32) {
	b.mu.Lock()
	defer b.mu.Unlock()
	hashes := engine.BlockHashes(prompt, b.blockSize)
	var after []uint64
	if prev := b.last[session]; prev != nil {
		after = prev.hashes
		if end := len(prev.prompt) + prev.output; prev.output > 1 && len(prompt) >= end {
			// The previous turn computed its prompt and its reply but the last token,
			// whose full blocks lead this prompt's.
			b.bound.Finish(hashes[len(prev.hashes) : (end-1)/b.blockSize])
		}
	}
	hit := b.bound.Arrive(hashes, len(prompt), after)
	if !time.Now().Before(b.from) {
		c := b.counts[model]
		c.hits += hit
		c.prompted += len(prompt)
		b.counts[model] = c
	}
	if session != "" {
		b.last[session] = &turnTokens{prompt: prompt, hashes: hashes}
	}
}

// conversation names the request's conversation: as the load generator
// knows it (which needs no ID on the wire), else by the session header.
func (b *boundRecorder) conversation(req *http.Request) string {
	if c := agentload.ConversationOf(req.Context()); c != "" {
		return c
	}
	return req.Header.Get(b.header)
}

// onResult notes how long a turn's reply was.
func (b *boundRecorder) onResult(r agentload.Result) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if r.LastTurn || r.Final || r.Err != nil {
		delete(b.last, r.Conversation())
		return
	}
	if t := b.last[r.Conversation()]; t != nil {
		t.output = r.OutputTokens
	}
}

// percent is the bound over the measured requests that name one of models
// (none: every request).
func (b *boundRecorder) percent(models ...string) float64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	var sum boundCount
	for model, c := range b.counts {
		if len(models) == 0 || slices.Contains(models, model) {
			sum.hits += c.hits
			sum.prompted += c.prompted
		}
	}
	if sum.prompted == 0 {
		return 0
	}
	return 100 * float64(sum.hits) / float64(sum.prompted)
}
