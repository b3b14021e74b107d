package caddymodule

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"testing"
	"testing/iotest"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/lmwarden/caddy-warden/internal/testrun"
	"github.com/lmwarden/caddy-warden/loadcontrol"
	"github.com/lmwarden/caddy-warden/metricsfeed"
	"github.com/lmwarden/caddy-warden/panel"
	"github.com/lmwarden/caddy-warden/promptprefix"
	"github.com/lmwarden/caddy-warden/readahead"
	"github.com/lmwarden/caddy-warden/selection"
)

// The admin JSON shows load control's settings with the defaults filled
// in, and each replica's KV capacity: the configured one, else its metrics'.
func TestLoadControlStatus(t *testing.T) {
	for _, c := range []struct {
		name       string
		lc         *LoadControlConfig
		want       panel.LoadControlStatus
		capacity   int
		noMetrics  bool
		noCapacity bool
	}{
		{name: "lc-off", want: panel.LoadControlStatus{
			Fill: loadcontrol.DefaultFill, LingerSeconds: loadcontrol.DefaultLinger.Seconds(),
			MaxWaitSeconds: loadcontrol.DefaultWait.Seconds(), MaxQueue: loadcontrol.DefaultQueue,
			Quantum: loadcontrol.DefaultQuantum, MinResidents: loadcontrol.DefaultMinResidents,
			SharedPrefixSource: "unknown", Replies: panel.ReplyUsageStatus{BytesPerToken: selection.BytesPerToken},
		}, capacity: 40000},
		{name: "lc-set", lc: &LoadControlConfig{Enabled: true, Fill: 0.8, Linger: caddy.Duration(3 * time.Second),
			MaxWait: caddy.Duration(time.Minute), MaxQueue: 8, CapacityTokens: 1000, Quantum: -1, MinResidents: 3,
			FillMin: 0.7, FillMax: 0.9, Touch: true, FlowHeader: "X-Team"},
			want: panel.LoadControlStatus{Enabled: true, Fill: 0.8, LingerSeconds: 3, MaxWaitSeconds: 60, MaxQueue: 8, CapacityTokens: 1000, Quantum: -1, MinResidents: 3,
				FillMin: 0.7, FillMax: 0.9, Touch: true, FlowHeader: "X-Team", SteppedAside: true,
				SharedPrefixSource: "unknown", Replies: panel.ReplyUsageStatus{BytesPerToken: selection.BytesPerToken}},
			capacity: 1000},
		{name: "lc-unknown", lc: &LoadControlConfig{Enabled: true}, noMetrics: true, noCapacity: true, want: panel.LoadControlStatus{
			Enabled: true, Fill: loadcontrol.DefaultFill, LingerSeconds: loadcontrol.DefaultLinger.Seconds(),
			MaxWaitSeconds: loadcontrol.DefaultWait.Seconds(), MaxQueue: loadcontrol.DefaultQueue,
			Quantum: loadcontrol.DefaultQuantum, MinResidents: loadcontrol.DefaultMinResidents,
			SteppedAside:       true, // no turn has lacked room yet
			SharedPrefixSource: "unknown", Replies: panel.ReplyUsageStatus{BytesPerToken: selection.BytesPerToken},
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			l := liveLoad(t, c.name, &ModelConfig{Replicas: []ReplicaConfig{{Address: addrA}}, LoadControl: c.lc})
			if !c.noMetrics {
				l.live.Model().Fleet().ObserveScrape(addrA, time.Now(), metricsfeed.Scrape{Engines: []metricsfeed.EngineStats{{
					BlockSize: 16, NumGPUBlocks: 2500,
					Present: metricsfeed.LoadFields | metricsfeed.FieldBlockSize | metricsfeed.FieldNumGPUBlocks,
				}}}, nil)
			}
			st := panel.Status(l.live, time.Now())
			// No flow yet: no turn was seen.
			c.want.Flows, c.want.OtherFlows = []panel.FlowStatus{}, panel.FlowStatus{Flow: "other"}
			if !reflect.DeepEqual(st.LoadControl, c.want) {
				t.Errorf("load_control %+v, want %+v", st.LoadControl, c.want)
			}
			// Until a reply reports its cached part, a replica's fill is
			// load control's, fill control or not.
			if got := st.Replicas[0].Fill; got != c.want.Fill {
				t.Errorf("the replica's fill %v, want %v", got, c.want.Fill)
			}
			got := st.Replicas[0].KVCapacityTokens
			switch {
			case c.noCapacity && got != nil:
				t.Errorf("kv_capacity_tokens %d without metrics or capacity_tokens, want null", *got)
			case !c.noCapacity && (got == nil || *got != c.capacity):
				t.Errorf("kv_capacity_tokens %v, want %d", got, c.capacity)
			}
		})
	}
}

// loadControlFixture is one replica whose cache holds one conversation
// (capacity 1 token, min_residents 1: a replica with nothing resident takes
// any one), with
// the given queue bound and max wait.
func loadControlFixture(t *testing.T, maxQueue int, maxWait time.Duration) *selectFixture {
	t.Helper()
	return newSelectFixture(t, &ModelConfig{
		Replicas: []ReplicaConfig{{Address: addrA}},
		LoadControl: &LoadControlConfig{Enabled: true, CapacityTokens: 1, Fill: 1, MinResidents: 1,
			Linger: caddy.Duration(time.Second), MaxWait: caddy.Duration(maxWait), MaxQueue: maxQueue},
	}, nil)
}

// selectResult is what a Select that may wait returned, once it returned.
type selectResult struct {
	upstream string // "" for none
	outcome  any
	queued   any
}

// selectAsync runs Select for a turn of conv in its own goroutine, as
// Caddy's request goroutine would, with the response writer w.
func (fx *selectFixture) selectAsync(t *testing.T, conv string, w http.ResponseWriter) (r *http.Request, end context.CancelFunc, done <-chan selectResult) {
	t.Helper()
	r, end = newProxyRequest(t, "X-Claude-Code-Session-Id", conv)
	out := make(chan selectResult, 1)
	go func() {
		var s selectResult
		if u := fx.p.Select(pool(addrA), r, w); u != nil {
			s.upstream = u.Dial
		}
		s.outcome, s.queued = caddyhttp.GetVar(r.Context(), varOutcome), caddyhttp.GetVar(r.Context(), varQueued)
		out <- s
	}()
	return r, end, out
}

func (fx *selectFixture) admission() loadcontrol.Status {
	return fx.plan.View().Status().Admission
}

// waitFor waits until cond holds, which it must before long.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	testrun.Eventually(t, 10*time.Second, what, cond)
}

// received is what a Select that must return (now, or once another
// goroutine's part has run) returned.
func received(t *testing.T, done <-chan selectResult) selectResult {
	t.Helper()
	var s selectResult
	waitFor(t, "Select to return", func() bool {
		select {
		case s = <-done:
			return true
		default:
			return false
		}
	})
	return s
}

// routeResident routes a turn of conversation "a", which runs, and so
// fills the replica, until the test ends.
func (fx *selectFixture) routeResident(t *testing.T) {
	t.Helper()
	_, end, done := fx.selectAsync(t, "a", nil)
	t.Cleanup(end)
	received(t, done)
}

// queue sends a turn of conv, which must wait, and returns once it waits.
func (fx *selectFixture) queue(t *testing.T, conv string) (r *http.Request, end context.CancelFunc, done <-chan selectResult) {
	t.Helper()
	r, end, done = fx.selectAsync(t, conv, nil)
	t.Cleanup(end)
	waitFor(t, conv+" queued", func() bool { return fx.admission().Waiting == 1 })
	return r, end, done
}

// A second conversation waits in Select until the first one's residency
// ends (its request ended, then its linger), then is routed.
func TestSelectLoadControlHoldsUntilAdmitted(t *testing.T) {
	fx := loadControlFixture(t, 0, time.Minute)
	_, endA, doneA := fx.selectAsync(t, "a", nil)
	if s := received(t, doneA); s.upstream != addrA || s.queued != 0.0 {
		t.Fatalf("first conversation: %+v, want routed at once", s)
	}
	_, _, doneB := fx.queue(t, "b")
	endA()
	waitFor(t, "a's request to end", func() bool { total, _ := fx.inFlight(); return total == 0 })
	fx.f.Tick(fx.clock.Now()) // a's linger has not passed: b still waits
	if st := fx.admission(); st.Waiting != 1 || st.Admitted != 1 {
		t.Fatalf("b admitted while a lingers: %+v", st)
	}
	fx.clock.advance(2 * time.Second)
	fx.f.Tick(fx.clock.Now())
	s := received(t, doneB)
	// Admission pinned b where it made room for it: Pick finds that pin.
	if s.upstream != addrA || s.outcome != "sticky" {
		t.Errorf("b after a left: %+v, want sticky on %s", s, addrA)
	}
	if s.queued != 2.0 {
		t.Errorf("b's queued_s %v, want the 2 s it waited", s.queued)
	}
	if st := fx.admission(); st.Waiting != 0 || st.Queued != 1 || st.Admitted != 2 {
		t.Errorf("admission %+v, want 2 admitted, 1 of them queued", st)
	}
}

// A side call the agent names (Claude Code's request class "auxiliary", a
// title) goes through at once while the replica is full, and load control
// counts nothing of it.
func TestSelectLoadControlPassesAuxiliaryCalls(t *testing.T) {
	fx := loadControlFixture(t, 0, time.Minute)
	fx.routeResident(t)
	before := fx.admission()
	r, end := newProxyRequest(t, "X-Claude-Code-Session-Id", "b")
	defer end()
	r.Header.Set("X-Claude-Code-Request-Class", "auxiliary")
	if u := fx.p.Select(pool(addrA), r, nil); u == nil || u.Dial != addrA {
		t.Fatalf("auxiliary call routed to %v, want %s at once", u, addrA)
	}
	if after := fx.admission(); after != before {
		t.Fatalf("load control counted the auxiliary call: %+v, was %+v", after, before)
	}
}

// A waiting turn whose client leaves is taken out of the queue and leaves
// no trace; its retries are not admitted again.
func TestSelectLoadControlClientGone(t *testing.T) {
	fx := loadControlFixture(t, 0, time.Minute)
	fx.routeResident(t)
	r, endB, doneB := fx.queue(t, "b")
	endB()
	if s := received(t, doneB); s.upstream != "" || s.outcome != outcomeCancelled {
		t.Fatalf("b after its client left: %+v, want no upstream, outcome cancelled", s)
	}
	if u := fx.p.Select(pool(addrA), r, nil); u != nil {
		t.Errorf("a retry of the cancelled turn was routed to %s", u.Dial)
	}
	st := fx.plan.View().Status()
	if st.Admission.Waiting != 0 || st.Admission.Cancelled != 1 || st.Admission.Queued != 1 || st.InFlight != 1 || st.Requests != 1 {
		t.Errorf("after b left: admission %+v, in flight %d, requests %d; want only a's", st.Admission, st.InFlight, st.Requests)
	}
	if rs := st.Replicas[0]; rs.Residents != 1 {
		t.Errorf("%d residents, want a alone", rs.Residents)
	}
}

// A turn that waited max_wait is sent anyway.
func TestSelectLoadControlForcesAfterMaxWait(t *testing.T) {
	const maxWait = 50 * time.Millisecond
	fx := loadControlFixture(t, 0, maxWait)
	fx.routeResident(t)
	_, _, doneB := fx.queue(t, "b")
	waitFor(t, "b's wait to start", func() bool { return fx.clock.pending() == 1 })
	fx.clock.advance(maxWait - time.Millisecond)
	if st := fx.admission(); st.Waiting != 1 || st.Forced != 0 {
		t.Fatalf("admission %+v before max_wait, want b still waiting", st)
	}
	fx.clock.advance(time.Millisecond)
	s := received(t, doneB)
	if s.upstream != addrA || s.queued != maxWait.Seconds() {
		t.Errorf("b: %+v, want routed after max_wait, queued_s %v", s, maxWait.Seconds())
	}
	if st := fx.admission(); st.Forced != 1 || st.Waiting != 0 {
		t.Errorf("admission %+v, want 1 forced", st)
	}
}

// max_wait counts a waiting turn's upload: a body sent slowly does not
// stretch the wait by another max_wait.
func TestSelectLoadControlMaxWaitCountsTheUpload(t *testing.T) {
	fx := loadControlFixture(t, 0, time.Second)
	fx.routeResident(t)
	body, upload := io.Pipe()
	r, _ := newProxyRequest(t, "X-Claude-Code-Session-Id", "b")
	r.Body, r.ContentLength = body, -1
	r.Header.Set("Content-Type", "application/octet-stream") // not read for its prefix before it queues
	done := make(chan selectResult, 1)
	go func() {
		var s selectResult
		if u := fx.p.Select(pool(addrA), r, nil); u != nil {
			s.upstream = u.Dial
		}
		done <- s
	}()
	waitFor(t, "b queued, its wait started", func() bool { return fx.admission().Waiting == 1 && fx.clock.pending() == 1 })
	fx.clock.advance(1200 * time.Millisecond) // past max_wait, still uploading
	_, _ = upload.Write([]byte(`{"messages":[]}`))
	upload.Close()
	// The clock stands still from here: only a wait that counted the
	// upload ends.
	if s := received(t, done); s.upstream != addrA {
		t.Errorf("b after its upload ended past max_wait: %+v, want sent", s)
	}
	if st := fx.admission(); st.Forced != 1 {
		t.Errorf("admission %+v, want b forced", st)
	}
}

// A full queue refuses a turn at once: no upstream, so that Caddy answers
// 503, with Retry-After of one linger; its retries are refused too without
// asking again.
func TestSelectLoadControlRefusesWhenTheQueueIsFull(t *testing.T) {
	fx := loadControlFixture(t, 1, time.Minute)
	fx.routeResident(t)
	fx.queue(t, "b")
	w := httptest.NewRecorder()
	r, endC, doneC := fx.selectAsync(t, "c", w)
	defer endC()
	if s := received(t, doneC); s.upstream != "" || s.outcome != outcomeRefused {
		t.Fatalf("c with the queue full: %+v, want refused", s)
	}
	if got := w.Header().Get("Retry-After"); got != "1" {
		t.Errorf("Retry-After %q, want 1 (the linger)", got)
	}
	if u := fx.p.Select(pool(addrA), r, w); u != nil {
		t.Errorf("a retry of the refused turn was routed to %s", u.Dial)
	}
	if st := fx.admission(); st.Refused != 1 || st.Waiting != 1 {
		t.Errorf("admission %+v, want 1 refused, 1 waiting", st)
	}
}

// Off, or for an unkeyed turn, nothing is held or counted.
func TestSelectLoadControlOff(t *testing.T) {
	fx := newSelectFixture(t, &ModelConfig{Replicas: []ReplicaConfig{{Address: addrA}},
		LoadControl: &LoadControlConfig{CapacityTokens: 1}}, nil)
	for _, conv := range []string{"a", "b", "c"} {
		_, end, done := fx.selectAsync(t, conv, nil)
		defer end()
		if s := received(t, done); s.upstream != addrA || s.queued != nil {
			t.Errorf("%s with load control off: %+v, want routed, no queued_s", conv, s)
		}
	}
	on := loadControlFixture(t, 0, time.Minute)
	for range 3 {
		if addr, _ := on.selected(t, pool(addrA)); addr != addrA {
			t.Errorf("an unkeyed turn: %q, want routed", addr)
		}
	}
	if st := on.admission(); st != (loadcontrol.Status{Enabled: true, BytesPerToken: selection.BytesPerToken, SteppedAside: true}) {
		t.Errorf("unkeyed turns counted: %+v", st)
	}
}

func TestRequestBody(t *testing.T) {
	cfg := &ModelConfig{BodyScanBytes: 1000}
	chunked := func(size int) *http.Request {
		r := httptest.NewRequestWithContext(t.Context(), http.MethodPost, "/", strings.NewReader(strings.Repeat("x", size)))
		r.ContentLength = -1
		return r
	}
	for _, c := range []struct {
		name string
		r    *http.Request
		want loadcontrol.Body
	}{
		{"Content-Length", httptest.NewRequest(http.MethodPost, "/", strings.NewReader(strings.Repeat("x", 4000))), loadcontrol.Body{Bytes: 4000}},
		{"unknown length, scanned to its end", chunked(800), loadcontrol.Body{Bytes: 800}},
		{"unknown length, longer than the scan", chunked(4000), loadcontrol.Body{Bytes: 1000, Partial: true}},
		{"unknown length, not scanned", chunked(800), loadcontrol.Body{}},
	} {
		if c.name != "unknown length, not scanned" {
			sessionKey(c.r, cfg)
		}
		if got := requestBody(c.r); !reflect.DeepEqual(got, c.want) {
			t.Errorf("%s: %+v, want %+v", c.name, got, c.want)
		}
	}
	// A waiting turn's body, read whole, is exact.
	r := chunked(4000)
	sessionKey(r, cfg)
	readBody(r)
	if got := requestBody(r); !reflect.DeepEqual(got, loadcontrol.Body{Bytes: 4000}) {
		t.Errorf("read whole while waiting: %+v, want 4000 bytes, exact", got)
	}
}

// A waiting turn's body is read, so that HTTP/1 notices its client leave,
// and handed on intact.
func TestReadBodyHandsItOnIntact(t *testing.T) {
	body := strings.Repeat("0123456789", 1000)
	r := httptest.NewRequestWithContext(t.Context(), http.MethodPost, "/", strings.NewReader(body))
	readBody(r)
	if n, _, ok := readahead.Ahead(r); !ok || n != len(body) {
		t.Fatalf("body not read ahead: %T", r.Body)
	}
	got, err := io.ReadAll(r.Body)
	if err != nil || string(got) != body {
		t.Errorf("body handed on: %d bytes, %v; want the %d sent", len(got), err, len(body))
	}
}

// readPrefix hands the body on intact: read whole, with its size and prefix
// parts; past maxPrefixBody, as far as it was read then the rest, sized as
// a lower bound; after a read error, what came then the same error; not
// at all when it is no JSON.
func TestReadPrefix(t *testing.T) {
	chat := `{"messages":[{"role":"user","content":"hi"}],"system":"Be brief.","tools":[{"name":"Bash"}]}`
	huge := `{"messages":"` + strings.Repeat("x", maxPrefixBody) + `"}`
	readErr := errors.New("client reset")
	for _, c := range []struct {
		name        string
		body        io.Reader
		length      int64
		contentType string
		want        loadcontrol.Body
		sent        string
		err         error
	}{
		{"whole", strings.NewReader(chat), int64(len(chat)), "application/json",
			loadcontrol.Body{Bytes: int64(len(chat)), Prefix: promptprefix.Read([]byte(chat))}, chat, nil},
		{"unknown length, past the bound", strings.NewReader(huge), -1, "",
			loadcontrol.Body{Bytes: maxPrefixBody + 1, Partial: true}, huge, nil},
		{"read error", io.MultiReader(strings.NewReader(chat[:20]), iotest.ErrReader(readErr)), -1, "",
			loadcontrol.Body{Bytes: 20, Partial: true}, chat[:20], readErr},
		{"not JSON", strings.NewReader(chat), int64(len(chat)), "multipart/form-data", loadcontrol.Body{}, chat, nil},
	} {
		r := httptest.NewRequestWithContext(t.Context(), http.MethodPost, "/v1/messages", c.body)
		r.ContentLength = c.length
		if c.contentType != "" {
			r.Header.Set("Content-Type", c.contentType)
		}
		var got loadcontrol.Body
		readPrefix(r, &got)
		if !reflect.DeepEqual(got, c.want) {
			t.Errorf("%s: %+v, want %+v", c.name, got, c.want)
		}
		if len(got.Prefix) == 0 && c.name == "whole" {
			t.Errorf("%s: no prefix parts read", c.name)
		}
		sent, err := io.ReadAll(r.Body)
		if string(sent) != c.sent || !errors.Is(err, c.err) {
			t.Errorf("%s: handed on %d bytes and %v, want %d bytes and %v", c.name, len(sent), err, len(c.sent), c.err)
		}
	}
}
