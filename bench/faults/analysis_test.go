package faults

import (
	"strings"
	"testing"
	"time"
)

var t0 = time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)

// at is t0 plus n tenths of a second.
func at(n int) time.Time { return t0.Add(time.Duration(n) * 100 * time.Millisecond) }

// served is a successful request of conv from tenth a to tenth b on engine.
func served(conv string, a, b int, engine string) request {
	return request{conv: conv, origin: fromProbe, start: at(a), end: at(b), engine: engine, status: 200, ok: true}
}

func TestFollowPins(t *testing.T) {
	phase := window{at(10), at(100)}
	kill := pinFault{server: "r1", during: window{at(20), at(40)}}
	cases := []struct {
		name        string
		reqs        []request
		fault       pinFault
		affinityOff []window
		want        pins
	}{
		{"stays", []request{served("a", 0, 5, "r0/0"), served("a", 11, 12, "r0/0"), served("a", 50, 51, "r0/0")}, pinFault{}, nil, pins{checked: 1}},
		{"placed in the phase, then stays", []request{served("a", 11, 12, "r2/0"), served("a", 13, 14, "r2/0")}, pinFault{}, nil, pins{checked: 1}},
		{"a single request checks nothing", []request{served("a", 11, 12, "r2/0")}, pinFault{}, nil, pins{}},
		{"moves without cause", []request{served("a", 0, 5, "r0/0"), served("a", 11, 12, "r1/0")}, pinFault{}, nil, pins{checked: 1, lost: 1}},
		{"moves off the failed replica", []request{served("a", 0, 5, "r1/0"), served("a", 25, 26, "r0/0"), served("a", 60, 61, "r0/0")}, kill, nil, pins{checked: 1, moved: 1}},
		{"moves off it before it failed", []request{served("a", 0, 5, "r1/0"), served("a", 15, 16, "r0/0")}, kill, nil, pins{checked: 1, lost: 1}},
		{"sent just before it failed, retried elsewhere after", []request{served("a", 0, 5, "r1/0"), served("a", 19, 21, "r0/0")}, kill, nil, pins{checked: 1, moved: 1}},
		{"moves back after it recovered", []request{served("a", 0, 5, "r1/0"), served("a", 25, 26, "r0/0"), served("a", 60, 61, "r1/0")}, kill, nil, pins{checked: 1, lost: 1}},
		{"moves off another replica during the fault", []request{served("a", 0, 5, "r0/0"), served("a", 25, 26, "r2/0")}, kill, nil, pins{checked: 1, lost: 1}},
		{"served elsewhere while affinity is off", []request{served("a", 0, 5, "r0/0"), unpinned(served("a", 15, 16, "r2/0")), served("a", 30, 31, "r0/0")}, pinFault{}, []window{{at(14), at(20)}}, pins{checked: 1}},
		{"routed by load after affinity came back", []request{served("a", 0, 5, "r0/0"), unpinned(served("a", 21, 22, "r2/0")), served("a", 30, 31, "r0/0")}, pinFault{}, []window{{at(14), at(20)}}, pins{checked: 1, lost: 1}},
		{"spilled as affinity came back", []request{served("a", 0, 5, "r0/0"), spilled(served("a", 19, 21, "r2/0")), served("a", 30, 31, "r2/0")}, pinFault{}, []window{{at(14), at(20)}}, pins{checked: 1}},
		{"placed elsewhere while affinity was going off", []request{served("a", 0, 5, "r0/0"), served("a", 13, 15, "r2/0")}, pinFault{}, []window{{at(14), at(20)}}, pins{checked: 1, lost: 1}},
		{"a spill moves the pin", []request{served("a", 0, 5, "r0/0"), spilled(served("a", 11, 12, "r2/0")), served("a", 13, 14, "r2/0")}, pinFault{}, nil, pins{checked: 1}},
		{"a re-homing moves the pin", []request{served("a", 0, 5, "r0/0"), outcome(served("a", 11, 12, "r2/0"), "rehomed"), served("a", 13, 14, "r2/0")}, pinFault{}, nil, pins{checked: 1}},
		{"back off the spill's replica without cause", []request{served("a", 0, 5, "r0/0"), spilled(served("a", 11, 12, "r2/0")), served("a", 13, 14, "r0/0")}, pinFault{}, nil, pins{checked: 1, lost: 1}},
		{"failures and cut requests do not count", []request{served("a", 0, 5, "r0/0"), {conv: "a", start: at(11), end: at(12), engine: "r2/0", status: 502}, served("a", 13, 14, "r0/0")}, pinFault{}, nil, pins{checked: 1}},
	}
	for _, c := range cases {
		got := followPins(c.reqs, phase, pinRules{fault: c.fault, affinityOff: c.affinityOff})
		if got.checked != c.want.checked || got.lost != c.want.lost || got.moved != c.want.moved || len(got.lostPaths) != got.lost {
			t.Errorf("%s: got %+v, want %+v", c.name, got, c.want)
		}
	}
}

// A lost pin's path names the request that lost it, with the spans of
// affinity off, so that a failure can be told from a window too tight.
func TestLostPathNamesTheRequestThatLostThePin(t *testing.T) {
	phase := window{at(10), at(100)}
	reqs := []request{served("a", 0, 5, "r0/0"), unpinned(served("a", 15, 16, "r2/0")), unpinned(served("a", 21, 22, "r2/0")), served("a", 30, 31, "r0/0")}
	got := followPins(reqs, phase, pinRules{affinityOff: []window{{at(14), at(20)}}})
	want := "a r0@-1s r2@500ms(unpinned) r0@2s; first lost by r2@1.1s(unpinned)-1.2s (affinity off 400ms-1s)"
	if got.lost != 1 || got.lostPaths[0] != want {
		t.Errorf("got %+v, want the path %q", got, want)
	}
}

// A conversation that had not come back since its replica restarted lost
// its cache there: its next turn may move it, once.
func TestFollowPinsAfterARestart(t *testing.T) {
	phase := window{at(10), at(100)}
	rules := pinRules{restarts: []restart{{"r1", at(8)}}}
	cases := []struct {
		name string
		reqs []request
		want pins
	}{
		{"idle while its replica restarted, moved by its next turn", []request{served("a", 0, 5, "r1/0"), served("a", 50, 51, "r2/0"), served("a", 60, 61, "r2/0")}, pins{checked: 1, moved: 1}},
		{"came back to its restarted replica, then moved", []request{served("a", 0, 5, "r1/0"), served("a", 50, 51, "r1/0"), served("a", 60, 61, "r2/0")}, pins{checked: 1, lost: 1}},
		{"moved twice", []request{served("a", 0, 5, "r1/0"), served("a", 50, 51, "r2/0"), served("a", 60, 61, "r0/0")}, pins{checked: 1, lost: 1}},
		{"on another replica", []request{served("a", 0, 5, "r0/0"), served("a", 50, 51, "r2/0")}, pins{checked: 1, lost: 1}},
	}
	for _, c := range cases {
		if got := followPins(c.reqs, phase, rules); got.checked != c.want.checked || got.lost != c.want.lost || got.moved != c.want.moved {
			t.Errorf("%s: got %+v, want %+v", c.name, got, c.want)
		}
	}
}

// outcome marks r as routed by warden with that outcome.
func outcome(r request, o string) request {
	r.outcome = o
	return r
}

// unpinned marks r as a request warden routed by load (affinity off).
func unpinned(r request) request { return outcome(r, "unpinned") }

// spilled marks r as a request warden spilled off its conversation's pin.
func spilled(r request) request { return outcome(r, "spilled") }

func TestCountTraffic(t *testing.T) {
	reqs := []request{
		served("a", 0, 5, "r0/0"), // ended before the window
		served("a", 9, 12, "r0/0"),
		{conv: "b", start: at(14), end: at(21), engine: "r1/0", status: 200},                // streaming from r1 when it died at 20
		{conv: "c", start: at(20), end: at(22), status: 502},                                // never streamed
		{conv: "d", start: at(22), end: at(23), engine: "r1/0", status: 200},                // streamed from r1 after the kill: not explained by it
		{conv: "e", start: at(30), end: at(31), engine: "r0/0", status: 200, cut: true},     // the run ended
		{conv: "f", start: at(15), end: at(120), engine: "r1/0", status: 200, ok: false},    // ended after the window
		{conv: "g", start: at(15), end: at(25), engine: "r0/0", status: 200, ok: false},     // streaming from another replica
		{conv: "h", start: at(15), end: at(25), engine: "r0/0", status: 200, ok: true},      // fine
		{conv: "i", start: at(15), end: at(25), origin: fromNewcomer, status: 0, ok: false}, // refused
	}
	for i := range reqs {
		if reqs[i].failed() {
			reqs[i].err = "boom"
		}
	}
	got := countTraffic(reqs, window{at(10), at(100)}, "r1", at(20))
	if got.sent != 7 || got.failed != 5 || got.cutStreaming != 1 || len(got.errors) != 1 || got.errors["boom"] != 4 {
		t.Errorf("got %+v, want 7 sent, 5 failed, 1 cut streaming, 4 others", got)
	}
}

func TestPinnedAtAndFirstRequestsAfter(t *testing.T) {
	reqs := []request{
		served("a", 0, 5, "r0/0"), unpinned(served("a", 6, 8, "r1/0")), // last success before 10: r1
		served("b", 0, 5, "r1/0"), unpinned(served("b", 6, 8, "r0/0")),
		served("c", 0, 5, "r1/0"), served("c", 9, 11, "r1/0"), // ended after 10: r1 still, from the first
		served("a", 12, 14, "r2/0"), served("a", 11, 13, "r0/0"),
	}
	got := pinnedAt(reqs, at(10), "r1", fromProbe, nil)
	if strings.Join(got, ",") != "a,c" {
		t.Errorf("pinned to r1 at 10: %v, want a,c", got)
	}
	// With affinity off from 6 to 8, a's request on r1 and b's on r0,
	// routed by load, say nothing: a's pin is still r0, b's r1.
	if got := pinnedAt(reqs, at(10), "r1", fromProbe, []window{{at(6), at(8)}}); strings.Join(got, ",") != "b,c" {
		t.Errorf("pinned to r1 at 10, affinity off from 6 to 8: %v, want b,c", got)
	}
	first := firstRequestsAfter(reqs, at(10), []string{"a", "b"})
	if r, ok := first["a"]; !ok || r.engine != "r0/0" {
		t.Errorf("a's first request after 10: %+v", r)
	}
	if _, ok := first["b"]; ok {
		t.Error("b sent nothing after 10")
	}
}

func TestNewcomers(t *testing.T) {
	newcomer := func(a int, engine string, ok bool) request {
		r := served("n", a, a+1, engine)
		r.origin, r.ok = fromNewcomer, ok
		return r
	}
	reqs := []request{newcomer(5, "r1/0", true), newcomer(12, "r0/0", true), newcomer(15, "r1/0", true),
		newcomer(16, "r1/0", false), served("p", 17, 18, "r1/0"), newcomer(30, "r1/0", true)}
	if on, all := newcomersOn(reqs, window{at(10), at(20)}, "r1"); on != 1 || all != 2 {
		t.Errorf("newcomers on r1 in [10, 20): %d of %d, want 1 of 2", on, all)
	}
	if first, ok := firstNewcomerOn(reqs, at(16), "r1"); !ok || !first.Equal(at(30)) {
		t.Errorf("first newcomer on r1 from 16: %v %v, want %v", first, ok, at(30))
	}
	if _, ok := firstNewcomerOn(reqs, at(31), "r1"); ok {
		t.Error("found a newcomer after the last one")
	}
}

func TestLogWatch(t *testing.T) {
	var passed strings.Builder
	l := newLogWatch(&passed)
	lines := `{"level":"info","logger":"http","msg":"server running"}
{"level":"warn","logger":"warden","msg":"replica unhealthy","model":"m","server":"127.0.0.1:1","was":"ok","reason":"metrics error: boom"}
{"level":"warn","logger":"warden","msg":"replica unhealthy","model":"m","server":"127.0.0.1:2","was":"ok","reason":"health failed"}
not json
{"level":"warn","logger":"warden","msg":"replica unhealthy","model":"m","server":"127.0.0.1:1","was":"metrics error","reason":"health failed: 503"}
{"level":"info","logger":"warden","msg":"replica healthy","model":"m","server":"127.0.0.1:1","was":"health failed"}
`
	// Written in pieces that split lines, as a pipe delivers them.
	for i := 0; i < len(lines); i += 7 {
		if _, err := l.Write([]byte(lines[i:min(i+7, len(lines))])); err != nil {
			t.Fatal(err)
		}
	}
	if passed.String() != lines {
		t.Error("the log was not passed on intact")
	}
	got := l.healthLines("127.0.0.1:1", window{time.Now().Add(-time.Minute), time.Now().Add(time.Minute)})
	if len(got) != 3 || got[0].healthy || got[0].reason != "metrics error: boom" || !got[2].healthy {
		t.Fatalf("lines about 127.0.0.1:1: %+v", got)
	}
	if n := repeatedStates(got); n != 0 {
		t.Errorf("%d repeated states among changes", n)
	}
	if n := repeatedStates(append(got[:1:1], got[0], got[0])); n != 2 {
		t.Errorf("%d repeated states in the same line thrice, want 2", n)
	}
}

func TestTablePrint(t *testing.T) {
	table := Table{
		Options:         Options{}.withDefaults(),
		MetricsInterval: 100 * time.Millisecond,
		Rows: []Row{
			{Fault: "reloads", Sent: 120, PinsChecked: 9},
			{Fault: "kill r1", Sent: 80, Failed: 2, CutStreaming: 2, PinsChecked: 9, Moved: 3, Recovery: 1234 * time.Millisecond,
				Notes: []string{"re-placed fast"}, Violations: []string{"something"}},
		},
	}
	var out strings.Builder
	if err := table.Print(&out); err != nil {
		t.Fatal(err)
	}
	text := out.String()
	var rows []string
	for line := range strings.Lines(text) {
		if strings.HasPrefix(line, "|") {
			rows = append(rows, strings.TrimSpace(line))
		}
	}
	if len(rows) != 4 {
		t.Fatalf("want a header, a rule and 2 rows:\n%s", text)
	}
	for _, row := range rows {
		if cells := strings.Count(row, "|"); cells != 10 || !strings.HasSuffix(row, "|") {
			t.Errorf("row %q: %d separators, want 10 (9 columns)", row, cells)
		}
	}
	for _, want := range []string{"| kill r1", " 2 ", "0 / 9", "1.234s (12.3 intervals)", "1 violation(s)", "- kill r1: re-placed fast", "Violations:\n- kill r1: something"} {
		if !strings.Contains(text, want) {
			t.Errorf("output lacks %q:\n%s", want, text)
		}
	}
}
