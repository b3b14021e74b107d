package e2e

import (
	"bytes"
	"io"
	"net/http"
	"sync"
	"time"

	"github.com/lmwarden/caddy-warden/bench/agentload"
	"github.com/lmwarden/caddy-warden/bench/hitbound"
	"github.com/lmwarden/caddy-warden/bench/vllmsim/server"
)

// boundRecorder sits in the load generator's HTTP client and computes
// hit_bound_percent over the requests a level sends: it tokenizes each body
// as the simulator does and feeds the stream to a hitbound.Bound, which
// lives as long as the replicas' caches do. A turn's reply is the stretch of
// the next turn's prompt after the previous prompt, as long as the reply's
// token count, so replies need not be captured.
type boundRecorder struct {
	header string

	mu       sync.Mutex
	bound    *hitbound.Bound
	last     map[string]*turnTokens // by session, until its last turn ends
	from     time.Time              // requests arriving before are not counted
	hits     int
	prompted int
}

type turnTokens struct {
	prompt []uint32
	chain  hitbound.Chain
	output int // reply tokens, once the turn ended
}

func newBoundRecorder(sessionHeader string, blockSize int) *boundRecorder {
	return &boundRecorder{header: sessionHeader, bound: hitbound.New(blockSize), last: map[string]*turnTokens{}}
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
	b.hits, b.prompted = 0, 0
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
		b.arrive(b.conversation(req), prompt)
	}
	return nil
}

func (b *boundRecorder) arrive(session string, prompt []uint32) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if prev := b.last[session]; prev != nil && prev.output > 0 && len(prompt) >= len(prev.prompt)+prev.output {
		b.bound.Finish(prev.chain, prev.prompt, prompt[len(prev.prompt):len(prev.prompt)+prev.output])
	}
	hit, chain := b.bound.Arrive(prompt)
	if !time.Now().Before(b.from) {
		b.hits += hit
		b.prompted += len(prompt)
	}
	if session != "" {
		b.last[session] = &turnTokens{prompt: prompt, chain: chain}
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

// percent is the bound over the measured requests.
func (b *boundRecorder) percent() float64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.prompted == 0 {
		return 0
	}
	return 100 * float64(b.hits) / float64(b.prompted)
}
