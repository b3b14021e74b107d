package agentload

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"sync"
	"time"
)

// EngineHeader is the response header in which the simulator names the
// engine that served a request, as "<server-id>/<rank>".
const EngineHeader = "X-Vllmsim-Engine"

// Result is the client's record of one request.
type Result struct {
	// SessionID and SessionIndex identify the session (see Session).
	SessionID    string
	SessionIndex int
	// Turn is the request's index in its conversation (see Turn.Index);
	// LastTurn marks the session's final turn.
	Turn     int
	LastTurn bool
	// Agent is a sub-agent's AgentID ("" for the session's main agent);
	// Segment counts the conversation's compactions before this request;
	// Kind says whether it summarised its conversation or was the first on
	// a summarised prefix; Final marks the last request of its conversation
	// (see Conversation).
	Agent   string
	Segment int
	Kind    TurnKind
	Final   bool
	// Side marks a side call to the small model (Session.SideCall).
	Side bool
	// Start is when the request was sent, FirstToken when the first text
	// delta arrived (zero if none did), End when the response finished or
	// was abandoned.
	Start      time.Time
	FirstToken time.Time
	End        time.Time
	// OutputTokens is the server's usage count; for a stream cut before its
	// usage arrived, the number of text deltas received.
	OutputTokens int
	// PromptTokens is the prompt size the server reported (0 if none).
	PromptTokens int
	// CachedTokens is how many prompt tokens the server served from cache;
	// CacheReported tells whether the server said so at all.
	CachedTokens  int
	CacheReported bool
	// Stop is the reply's stop_reason (Anthropic) or finish_reason (OpenAI):
	// tool_use or tool_calls while the agent works, end_turn or stop when
	// its reply ends the task; "" if none arrived.
	Stop string
	// Status is the HTTP status (0 if no response arrived).
	Status int
	// Engine is the EngineHeader value ("" if absent).
	Engine string
	// Header is the response's header (nil if no response arrived), for
	// callers that look at more than the engine (which proxy answered).
	Header http.Header
	// Cut is true when the run ended while the request was in flight; such
	// a request is not an error.
	Cut bool
	// Err is why the request failed; nil on success and on cut requests.
	Err error
}

// Conversation names the conversation the request belongs to, as a
// replica's cache sees it: the session's, or a sub-agent's within it, and a
// compacted conversation's new prefix apart from its old one. Without
// sub-agents and compaction it is SessionID. A session's side calls are a
// conversation of their own, on the small model's replicas.
func (r Result) Conversation() string {
	name := ConversationName(r.SessionID, r.Agent, r.Segment)
	if r.Side {
		name += "/side"
	}
	return name
}

// ConversationName is Result.Conversation for a session ID, an agent ID
// ("" for the main agent) and a compaction count.
func ConversationName(session, agent string, segment int) string {
	name := session
	if agent != "" {
		name += "/" + agent
	}
	if segment > 0 {
		name += "#" + strconv.Itoa(segment)
	}
	return name
}

type conversationKey struct{}

// ConversationOf returns the Conversation name of the request whose context
// ctx is ("" for one the Runner did not send), so that an http.RoundTripper
// placed in the Runner's Client can tell conversations apart without any ID
// on the wire.
func ConversationOf(ctx context.Context) string {
	name, _ := ctx.Value(conversationKey{}).(string)
	return name
}

// TTFB returns the client-side time to the first streamed token, and false
// when no token arrived.
func (r Result) TTFB() (time.Duration, bool) {
	if r.FirstToken.IsZero() {
		return 0, false
	}
	return r.FirstToken.Sub(r.Start), true
}

// OK reports whether the request completed without error.
func (r Result) OK() bool { return r.Err == nil && !r.Cut }

// SessionDone reports whether this request completed its session.
func (r Result) SessionDone() bool { return r.LastTurn && r.OK() }

// Runner plays a Generator's sessions against an endpoint in a closed loop:
// Sessions sessions are always in flight, each sending its next turn as soon
// as the last one ended; a finished or failed session is replaced by the
// generator's next one. It does not retry: a caller wanting timeouts sets
// them on Client.
type Runner struct {
	// Generator supplies the sessions and the workload's protocol settings.
	Generator *Generator
	// BaseURL is the endpoint's root, e.g. "http://127.0.0.1:8080".
	BaseURL string
	// Sessions is how many sessions run concurrently.
	Sessions int
	// Duration is how long the run lasts; requests still in flight then are cut.
	Duration time.Duration
	// Client sends the requests; nil uses a client with one idle connection
	// per session and no proxy.
	Client *http.Client
	// OnResult, if set, sees each Result as it is recorded, for live
	// progress. Calls are serialized; keep them short, they hold up the loop.
	OnResult func(Result)
}

// Report is the outcome of a run.
type Report struct {
	// Start and End bound the run; every Result ended within them.
	Start time.Time
	End   time.Time
	// Results holds one entry per request, in the order they ended.
	Results []Result
	// Summary is Summarize(Results, Start, End).
	Summary Summary
}

// Run drives the closed loop until Duration has passed or ctx is done, and
// returns what happened. On cancellation of ctx it returns the partial
// report together with ctx's error.
func (r *Runner) Run(ctx context.Context) (Report, error) {
	if err := r.check(); err != nil {
		return Report{}, err
	}
	client := r.Client
	if client == nil {
		transport := http.DefaultTransport.(*http.Transport).Clone()
		transport.Proxy = nil
		transport.MaxIdleConnsPerHost = r.Sessions
		defer transport.CloseIdleConnections()
		client = &http.Client{Transport: transport}
	}

	start := time.Now()
	runCtx, cancel := context.WithDeadline(ctx, start.Add(r.Duration))
	defer cancel()

	var (
		mu      sync.Mutex
		results []Result
	)
	record := func(res Result) {
		mu.Lock()
		defer mu.Unlock()
		results = append(results, res)
		if r.OnResult != nil {
			r.OnResult(res)
		}
	}
	var wg sync.WaitGroup
	for range r.Sessions {
		wg.Go(func() { r.loop(runCtx, client, record) })
	}
	wg.Wait()
	end := time.Now()
	return Report{Start: start, End: end, Results: results, Summary: Summarize(results, start, end)}, ctx.Err()
}

func (r *Runner) check() error {
	var errs []error
	if r.Generator == nil {
		errs = append(errs, errors.New("no generator"))
	}
	if r.Sessions < 1 {
		errs = append(errs, fmt.Errorf("sessions must be at least 1, got %d", r.Sessions))
	}
	if r.Duration <= 0 {
		errs = append(errs, fmt.Errorf("duration must be positive, got %v", r.Duration))
	}
	if u, err := url.Parse(r.BaseURL); err != nil || u.Host == "" || (u.Scheme != "http" && u.Scheme != "https") {
		errs = append(errs, fmt.Errorf("base URL %q is not an http(s) URL", r.BaseURL))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("agentload runner: %w", err)
	}
	return nil
}

// loop is one closed-loop slot: it keeps a session busy until ctx ends.
func (r *Runner) loop(ctx context.Context, client *http.Client, record func(Result)) {
	var session *Session
	for ctx.Err() == nil {
		if session == nil || session.Done() {
			session = r.Generator.NewSession()
		}
		turn, _ := session.Next()
		if !sleep(ctx, turn.Think) {
			return
		}
		var side sync.WaitGroup
		if call, ok := session.SideCall(turn); ok {
			// Sent with the turn, not before it: the agent does not wait for a title.
			side.Go(func() {
				res, _ := r.send(ctx, client, session, call)
				record(res)
			})
		}
		res, reply := r.send(ctx, client, session, turn)
		record(res)
		side.Wait()
		switch {
		case res.Cut:
			return
		case res.Err != nil:
			session = nil // a failed session is abandoned so the slot keeps working
		default:
			session.Reply(reply)
			if turn.Spawns > 0 {
				r.runAgents(ctx, client, session.Spawn(), record)
			}
		}
	}
}

// runAgents runs sub-agents in parallel until each is done, fails or ctx
// ends: the spawning agent waits for them all.
func (r *Runner) runAgents(ctx context.Context, client *http.Client, agents []*Session, record func(Result)) {
	var wg sync.WaitGroup
	for _, a := range agents {
		wg.Go(func() {
			for ctx.Err() == nil {
				turn, ok := a.Next()
				if !ok || !sleep(ctx, turn.Think) {
					return
				}
				res, reply := r.send(ctx, client, a, turn)
				record(res)
				if !res.OK() {
					return // a failed sub-agent is abandoned; its parent goes on
				}
				a.Reply(reply)
			}
		})
	}
	wg.Wait()
}

// send makes one request and returns its Result and the reply text.
func (r *Runner) send(ctx context.Context, client *http.Client, s *Session, t Turn) (Result, string) {
	res := Result{
		SessionID: s.ID, SessionIndex: s.Index, Turn: t.Index, LastTurn: t.Last,
		Agent: s.AgentID, Segment: t.Segment, Kind: t.Kind, Final: t.Final, Side: t.Side, Start: time.Now(),
	}
	out, err := r.exchange(ctx, client, s, t, &res)
	res.End = time.Now()
	res.FirstToken, res.OutputTokens = out.firstToken, out.outputTokens
	res.PromptTokens, res.CachedTokens, res.CacheReported = out.promptTokens, out.cachedTokens, out.cacheReported
	res.Stop = out.stop
	switch {
	case err == nil:
	case ctx.Err() != nil:
		res.Cut = true
	default:
		res.Err = err
	}
	return res, out.text
}

// exchange sends the request and reads the stream, filling the response
// fields of res (status, engine).
func (r *Runner) exchange(ctx context.Context, client *http.Client, s *Session, t Turn, res *Result) (streamOutcome, error) {
	cfg := r.Generator.Config()
	ctx = context.WithValue(ctx, conversationKey{}, res.Conversation())
	req, err := newRequest(ctx, r.BaseURL, cfg, s, t)
	if err != nil {
		return streamOutcome{}, err
	}
	resp, err := client.Do(req)
	if err != nil {
		return streamOutcome{}, err
	}
	defer resp.Body.Close()
	res.Status = resp.StatusCode
	res.Engine = resp.Header.Get(EngineHeader)
	res.Header = resp.Header
	if resp.StatusCode != http.StatusOK {
		detail, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return streamOutcome{}, fmt.Errorf("status %d: %s", resp.StatusCode, detail)
	}
	return readStream(cfg.API, resp.Body)
}

// sleep waits d or until ctx ends; it reports whether d passed.
func sleep(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}
