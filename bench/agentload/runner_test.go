package agentload

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// fakeSim mimics the simulator's streaming endpoints on loopback. It checks
// what the client sends (history resent verbatim, session identity) and
// remembers what it reported so the test can compare with the Results.
type fakeSim struct {
	t          *testing.T
	ttfbDelay  time.Duration // after the response head, before the first text
	tokenDelay time.Duration // between text deltas
	deltas     int           // text deltas per reply, two tokens each
	failTurn   int           // turn answered with 500; -1 for none

	inFlight, maxInFlight atomic.Int64

	mu         sync.Mutex
	replies    map[string][]string // per session, the replies sent so far
	reported   map[string][2]int   // per "session/turn", the prompt and cached tokens reported
	violations []string
}

func newFakeSim(t *testing.T) *fakeSim {
	return &fakeSim{t: t, deltas: 5, failTurn: -1, replies: map[string][]string{}, reported: map[string][2]int{}}
}

// engineFor is the engine the fake says served a session: fixed per session.
func engineFor(sessionID string) string { return fmt.Sprintf("sim-%c/0", sessionID[0]) }

func (f *fakeSim) violate(format string, args ...any) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.violations = append(f.violations, fmt.Sprintf(format, args...))
}

// chatRequest is the part of either protocol's body the fake needs.
type chatRequest struct {
	system    string
	messages  []Message
	maxTokens int
	userID    string
}

func decodeChat(r *http.Request) (chatRequest, error) {
	type block struct{ Text string }
	var body struct {
		MaxTokens int             `json:"max_tokens"`
		Stream    bool            `json:"stream"`
		System    []block         `json:"system"`
		Messages  json.RawMessage `json:"messages"`
		Metadata  struct {
			UserID string `json:"user_id"`
		} `json:"metadata"`
	}
	if err := json.NewDecoder(r.Body).Decode(&body); err != nil {
		return chatRequest{}, err
	}
	if !body.Stream {
		return chatRequest{}, fmt.Errorf("not streaming")
	}
	req := chatRequest{maxTokens: body.MaxTokens, userID: body.Metadata.UserID}
	if strings.HasPrefix(r.URL.Path, "/v1/messages") {
		var messages []struct {
			Role    string
			Content []block
		}
		if err := json.Unmarshal(body.Messages, &messages); err != nil {
			return chatRequest{}, err
		}
		req.system = body.System[0].Text
		for _, m := range messages {
			req.messages = append(req.messages, Message{Role: m.Role, Content: m.Content[0].Text})
		}
		return req, nil
	}
	if err := json.Unmarshal(body.Messages, &req.messages); err != nil {
		return chatRequest{}, err
	}
	req.system, req.messages = req.messages[0].Content, req.messages[1:]
	return req, nil
}

func (f *fakeSim) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	// Counted until the final event is written: once the client sees it, it may
	// send its next turn before this handler has returned.
	f.updateInFlight(1)
	released := false
	release := func() {
		if !released {
			released = true
			f.updateInFlight(-1)
		}
	}
	defer release()

	req, err := decodeChat(r)
	if err != nil {
		f.violate("bad body: %v", err)
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	session := r.Header.Get(DefaultSessionHeader)
	if req.userID != "" && !strings.Contains(req.userID, `"session_id":"`+session+`"`) {
		f.violate("header session %q not in user_id %s", session, req.userID)
	}
	turn := len(req.messages) / 2
	tokens := len(req.system)
	for _, m := range req.messages {
		tokens += len(m.Content)
	}
	prompt, cached := tokens/BytesPerToken, 0
	if turn > 0 {
		cached = (tokens - len(req.messages[len(req.messages)-1].Content)) / BytesPerToken
	}
	reply := f.checkHistory(session, turn, req.messages)
	if turn == f.failTurn {
		http.Error(w, "engine failure", http.StatusInternalServerError)
		return
	}

	anthropic := strings.HasPrefix(r.URL.Path, "/v1/messages")
	send := func(event, data string) {
		if anthropic {
			fmt.Fprintf(w, "event: %s\n", event)
		}
		fmt.Fprintf(w, "data: %s\n\n", data)
		w.(http.Flusher).Flush()
	}
	wait := func(d time.Duration) bool {
		select {
		case <-time.After(d):
			return true
		case <-r.Context().Done():
			return false
		}
	}
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set(EngineHeader, engineFor(session))
	if anthropic {
		send("message_start", fmt.Sprintf(`{"type":"message_start","message":{"usage":{"input_tokens":%d,"output_tokens":1,"cache_read_input_tokens":%d}}}`, prompt-cached, cached))
	} else {
		send("", `{"object":"chat.completion.chunk","choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}`)
	}
	if !wait(f.ttfbDelay) {
		return
	}
	chunks := min(f.deltas, max(1, req.maxTokens/2))
	for i := range chunks {
		if i > 0 && !wait(f.tokenDelay) {
			return
		}
		text, _ := json.Marshal(reply[8*i : 8*i+8])
		if anthropic {
			send("content_block_delta", fmt.Sprintf(`{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":%s}}`, text))
		} else {
			send("", fmt.Sprintf(`{"object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":%s}}]}`, text))
		}
	}
	f.recordReply(session, turn, reply[:8*chunks], prompt, cached)
	release()
	if anthropic {
		send("message_delta", fmt.Sprintf(`{"type":"message_delta","delta":{"stop_reason":"max_tokens"},"usage":{"output_tokens":%d}}`, 2*chunks))
		send("message_stop", `{"type":"message_stop"}`)
	} else {
		send("", fmt.Sprintf(`{"object":"chat.completion.chunk","choices":[],"usage":{"prompt_tokens":%d,"completion_tokens":%d,"prompt_tokens_details":{"cached_tokens":%d}}}`, prompt, 2*chunks, cached))
		send("", "[DONE]")
	}
}

func (f *fakeSim) updateInFlight(delta int64) {
	n := f.inFlight.Add(delta)
	for {
		highest := f.maxInFlight.Load()
		if n <= highest || f.maxInFlight.CompareAndSwap(highest, n) {
			return
		}
	}
}

// checkHistory verifies that the messages resend every earlier reply of the
// session verbatim, and returns this turn's reply text (8 bytes per delta).
func (f *fakeSim) checkHistory(session string, turn int, messages []Message) string {
	f.mu.Lock()
	sent := f.replies[session]
	f.mu.Unlock()
	if len(messages) != 2*turn+1 || len(sent) != turn {
		f.violate("session %s turn %d: %d messages, %d replies sent", session, turn, len(messages), len(sent))
	} else {
		for i, reply := range sent {
			if messages[2*i+1] != (Message{Role: "assistant", Content: reply}) {
				f.violate("session %s turn %d: reply %d not resent verbatim", session, turn, i)
			}
		}
	}
	var b strings.Builder
	for i := range f.deltas {
		fmt.Fprintf(&b, "t%dd%04d ", turn%10, i%10000)
	}
	return b.String()
}

func (f *fakeSim) recordReply(session string, turn int, reply string, prompt, cached int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.replies[session] = append(f.replies[session], reply)
	f.reported[fmt.Sprintf("%s/%d", session, turn)] = [2]int{prompt, cached}
}

// smallWorkload keeps requests tiny so a test run makes many of them.
func smallWorkload(api API) Config {
	cfg := DefaultConfig()
	cfg.API = api
	cfg.SystemPromptTokens, cfg.FirstMessageTokens, cfg.TurnTokens, cfg.Turns = 50, 100, 20, 3
	cfg.ThinkTime = 0
	return cfg
}

// runAgainst runs sessions against sim for d and returns the report and how
// many times OnResult was called.
func runAgainst(t *testing.T, sim *fakeSim, cfg Config, sessions int, d time.Duration) (Report, int) {
	t.Helper()
	server := httptest.NewServer(sim)
	t.Cleanup(server.Close)
	var seen atomic.Int64
	runner := &Runner{
		Generator: mustGenerator(t, cfg),
		BaseURL:   server.URL,
		Sessions:  sessions,
		Duration:  d,
		OnResult:  func(Result) { seen.Add(1) },
	}
	report, err := runner.Run(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if took := report.End.Sub(report.Start); took < d || took > d+time.Second {
		t.Errorf("run took %v for a %v duration", took, d)
	}
	sim.mu.Lock()
	defer sim.mu.Unlock()
	for _, v := range sim.violations {
		t.Error(v)
	}
	return report, int(seen.Load())
}

func testClosedLoop(t *testing.T, api API) {
	const sessions = 4
	sim := newFakeSim(t)
	sim.ttfbDelay, sim.tokenDelay = 30*time.Millisecond, 2*time.Millisecond
	report, seen := runAgainst(t, sim, smallWorkload(api), sessions, time.Second)

	if seen != len(report.Results) {
		t.Errorf("OnResult saw %d results, report has %d", seen, len(report.Results))
	}
	if got := sim.maxInFlight.Load(); got != sessions {
		t.Errorf("at most %d requests in flight, want exactly %d", got, sessions)
	}
	turnsSeen := map[string][]int{}
	for _, r := range report.Results {
		turnsSeen[r.SessionID] = append(turnsSeen[r.SessionID], r.Turn)
		if r.Err != nil {
			t.Errorf("session %d turn %d: %v", r.SessionIndex, r.Turn, r.Err)
			continue
		}
		if r.Cut { // may be cut before the response headers, so before the engine is known
			continue
		}
		if r.Engine != engineFor(r.SessionID) {
			t.Errorf("engine %q, want %q", r.Engine, engineFor(r.SessionID))
		}
		ttfb, ok := r.TTFB()
		if !ok || ttfb < sim.ttfbDelay || ttfb > r.End.Sub(r.Start) {
			t.Errorf("TTFB %v (ok %v) outside [%v, %v]", ttfb, ok, sim.ttfbDelay, r.End.Sub(r.Start))
		}
		// Two tokens per delta: the count comes from usage, not from deltas.
		if r.OutputTokens != 2*sim.deltas || r.Status != http.StatusOK {
			t.Errorf("output tokens %d status %d", r.OutputTokens, r.Status)
		}
		sim.mu.Lock()
		want := sim.reported[fmt.Sprintf("%s/%d", r.SessionID, r.Turn)]
		sim.mu.Unlock()
		if r.PromptTokens != want[0] || r.CachedTokens != want[1] || !r.CacheReported {
			t.Errorf("prompt %d cached %d, server reported %v", r.PromptTokens, r.CachedTokens, want)
		}
	}
	// Each session runs its turns in order and is replaced after its last.
	for id, turns := range turnsSeen {
		for i, turn := range turns {
			if turn != i {
				t.Fatalf("session %s ran turns %v", id, turns)
			}
		}
	}
	s := report.Summary
	if len(turnsSeen) <= 2*sessions || s.SessionsCompleted < sessions {
		t.Errorf("%d sessions seen, %d completed: finished sessions not replaced", len(turnsSeen), s.SessionsCompleted)
	}
	if s.Errors != 0 || s.Cut > sessions || s.Requests != len(report.Results) {
		t.Errorf("summary: %d errors, %d cut, %d requests", s.Errors, s.Cut, s.Requests)
	}
	if s.StayedPercent != 100 || s.TTFBP50 < sim.ttfbDelay {
		t.Errorf("stayed %v%%, TTFB p50 %v", s.StayedPercent, s.TTFBP50)
	}
}

func TestRunnerAnthropic(t *testing.T) { testClosedLoop(t, APIAnthropic) }

func TestRunnerOpenAI(t *testing.T) { testClosedLoop(t, APIOpenAI) }

func TestRunnerCutsRequestsInFlight(t *testing.T) {
	const sessions = 3
	sim := newFakeSim(t)
	sim.ttfbDelay, sim.tokenDelay, sim.deltas = 50*time.Millisecond, 100*time.Millisecond, 100
	cfg := smallWorkload(APIAnthropic)
	report, _ := runAgainst(t, sim, cfg, sessions, 400*time.Millisecond)
	if len(report.Results) != sessions {
		t.Fatalf("%d results, want one cut request per session", len(report.Results))
	}
	for _, r := range report.Results {
		if !r.Cut || r.Err != nil || r.Turn != 0 {
			t.Errorf("cut %v err %v turn %d", r.Cut, r.Err, r.Turn)
		}
		// Cut before usage arrived: the text deltas received are the count.
		if _, ok := r.TTFB(); !ok || r.OutputTokens < 1 || r.OutputTokens > 5 {
			t.Errorf("TTFB seen %v, %d output tokens after 400 ms", ok, r.OutputTokens)
		}
	}
	if s := report.Summary; s.Cut != sessions || s.Errors != 0 || s.SessionsCompleted != 0 {
		t.Errorf("summary: cut %d errors %d completed %d", s.Cut, s.Errors, s.SessionsCompleted)
	}
}

func TestRunnerReplacesFailedSession(t *testing.T) {
	const sessions = 2
	sim := newFakeSim(t)
	sim.ttfbDelay, sim.failTurn = 5*time.Millisecond, 1
	report, _ := runAgainst(t, sim, smallWorkload(APIAnthropic), sessions, 500*time.Millisecond)
	failed := 0
	requests := map[string]int{}
	for _, r := range report.Results {
		if requests[r.SessionID]++; requests[r.SessionID] > 2 {
			t.Fatalf("session %d was retried after its failure", r.SessionIndex)
		}
		switch {
		case r.Turn > 1:
			t.Fatalf("session %d went on to turn %d after its failure", r.SessionIndex, r.Turn)
		case r.Turn == 1 && !r.Cut:
			failed++
			if r.Err == nil || r.Status != http.StatusInternalServerError || !strings.Contains(r.Err.Error(), "engine failure") {
				t.Errorf("failed turn: status %d err %v", r.Status, r.Err)
			}
		}
	}
	if failed < 4*sessions || report.Summary.Errors != failed {
		t.Errorf("%d failures, summary counts %d: the loop stalled", failed, report.Summary.Errors)
	}
}

func TestRunnerRejectsBadSettings(t *testing.T) {
	g := mustGenerator(t, DefaultConfig())
	for name, r := range map[string]*Runner{
		"no generator": {BaseURL: "http://127.0.0.1:1", Sessions: 1, Duration: time.Second},
		"no sessions":  {Generator: g, BaseURL: "http://127.0.0.1:1", Duration: time.Second},
		"no duration":  {Generator: g, BaseURL: "http://127.0.0.1:1", Sessions: 1},
		"bad URL":      {Generator: g, BaseURL: "127.0.0.1:1", Sessions: 1, Duration: time.Second},
	} {
		if _, err := r.Run(context.Background()); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

func TestRunnerStopsWithContext(t *testing.T) {
	sim := newFakeSim(t)
	sim.ttfbDelay = time.Hour
	server := httptest.NewServer(sim)
	defer server.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	runner := &Runner{Generator: mustGenerator(t, smallWorkload(APIAnthropic)), BaseURL: server.URL, Sessions: 2, Duration: time.Minute}
	report, err := runner.Run(ctx)
	if err == nil || report.End.Sub(report.Start) > 2*time.Second {
		t.Fatalf("err %v after %v", err, report.End.Sub(report.Start))
	}
	if report.Summary.Cut != 2 {
		t.Errorf("%d requests cut, want 2", report.Summary.Cut)
	}
}

func TestRunnerPausesBeforeEachTurn(t *testing.T) {
	cfg := smallWorkload(APIAnthropic)
	cfg.ThinkTime, cfg.ThinkSpread = 150*time.Millisecond, 0
	rep, _ := runAgainst(t, newFakeSim(t), cfg, 1, time.Second)
	var ok []Result
	for _, r := range rep.Results {
		if r.OK() {
			ok = append(ok, r)
		}
	}
	if len(ok) < 2 || len(ok) > 7 {
		t.Fatalf("%d requests in 1 s with 150 ms pauses", len(ok))
	}
	if ok[0].Start.Sub(rep.Start) < 150*time.Millisecond {
		t.Errorf("first turn sent %v after the start, before its pause", ok[0].Start.Sub(rep.Start))
	}
	for i := 1; i < len(ok); i++ {
		if gap := ok[i].Start.Sub(ok[i-1].End); gap < 150*time.Millisecond {
			t.Errorf("turn %d sent %v after the previous ended, want >= 150ms", i, gap)
		}
	}
}
