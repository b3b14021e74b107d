package clienttest

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/creack/pty"

	"github.com/lmwarden/caddy-warden/bench/vllmsim/server"
)

// TestClaudeCodeInteractive runs Claude Code as a person does, in a terminal, through Caddy
// with load control on. Before each prompt it sends a request of its own under the
// session's header: a title for the prompt, with no tools and a small prompt, marked
// "auxiliary" by its gateway hint headers. Load control must let it pass without taking
// it for a turn of the conversation, which would open or size a residency on it
// (selection/sidecall.go relies on its being under a quarter of the conversation's size).
func TestClaudeCodeInteractive(t *testing.T) {
	c := clients[slices.IndexFunc(clients, func(c client) bool { return c.bin == "claude" })]
	bin, version := findCLI(t, c)
	f := startFleet(t, fleetOptions{loadControl: true})
	home := t.TempDir()
	env, err := c.setup(f, home)
	if err != nil {
		t.Fatal(err)
	}
	term := startClaudeCode(t, bin, home, env, "--model", model)

	var turns []turn
	for i := range 2 {
		mark := f.rec.mark()
		term.typeLine(t, prompt("A", i+1))
		name := fmt.Sprintf("prompt %d", i+1)
		term.waitFor(t, name+"'s main request, its reply read by warden_stop_reason", func() bool {
			served := slices.ContainsFunc(f.rec.since(mark), func(r server.Served) bool {
				return r.Header.Get("X-Claude-Code-Request-Class") == "main"
			})
			return served && f.loadControl(t).Replies.Read >= i+1
		})
		turns = append(turns, turn{name: name, reqs: f.rec.since(mark)})
	}
	term.typeLine(t, "/exit")
	term.waitExit(t)
	t.Logf("%s %s, interactive, on the wire:\n%s", c.pkg, version, wireSummary(turns))

	var mains int
	session := ""
	for _, tr := range turns {
		var main, titles []server.Served
		for _, r := range tr.reqs {
			if session == "" {
				session = r.Header.Get("X-Claude-Code-Session-Id")
			}
			if got := r.Header.Get("X-Claude-Code-Session-Id"); got != session || got == "" {
				t.Errorf("%s: a request with session %q, want every one with the session's %q", tr.name, got, session)
			}
			switch class := r.Header.Get("X-Claude-Code-Request-Class"); class {
			case "main":
				main = append(main, r)
			case "auxiliary":
				titles = append(titles, r)
			default:
				t.Errorf("%s: a request of class %q", tr.name, class)
			}
		}
		if len(main) != 1 || len(titles) == 0 {
			t.Fatalf("%s: %d main and %d auxiliary requests, want 1 and at least 1", tr.name, len(main), len(titles))
		}
		mains++
		for _, r := range titles {
			if n := toolCount(r.Body); n != 0 {
				t.Errorf("%s: an auxiliary request declares %d tools", tr.name, n)
			}
			if 4*len(r.Body) >= len(main[0].Body) {
				t.Errorf("%s: an auxiliary request of %d bytes beside a main one of %d: not under a quarter, load control's side-call rule would take it for a turn", tr.name, len(r.Body), len(main[0].Body))
			}
		}
	}
	lc := f.loadControl(t)
	if lc.Admitted != mains || lc.TaskEnded != mains || lc.SideCalls != 0 {
		t.Errorf("load control admitted %d turns, ended %d tasks, saw %d side calls; want the %d main turns only, each ending its task",
			lc.Admitted, lc.TaskEnded, lc.SideCalls, mains)
	}
}

// startClaudeCode runs Claude Code in a terminal in home's project directory, with env
// (besides the base environment) and args, as a person who has used it before, and waits for
// its input prompt. Its title requests are "nonessential traffic": they are let through.
func startClaudeCode(t *testing.T, bin, home string, env []string, args ...string) *terminal {
	t.Helper()
	dir := filepath.Join(home, "project")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	// A terminal, and no CI variable, which CLIs take as "not interactive".
	env = slices.DeleteFunc(append(baseEnv(home), env...), func(kv string) bool {
		return strings.HasPrefix(kv, "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=") ||
			strings.HasPrefix(kv, "CI=") || strings.HasPrefix(kv, "TERM=") || strings.HasPrefix(kv, "NO_COLOR=")
	})
	env = append(env, "TERM=xterm-256color")
	// What a person has done once: onboarding, trusting the folder, accepting the API key
	// (Claude Code keeps its last 20 characters).
	settings, _ := json.Marshal(map[string]any{
		"hasCompletedOnboarding": true,
		"projects":               map[string]any{dir: map[string]bool{"hasTrustDialogAccepted": true, "hasCompletedProjectOnboarding": true}},
		"customApiKeyResponses":  map[string]any{"approved": []string{dummyKey[len(dummyKey)-20:]}, "rejected": []string{}},
	})
	if err := os.WriteFile(filepath.Join(home, ".claude.json"), settings, 0o600); err != nil {
		t.Fatal(err)
	}
	term := startTerminal(t, bin, dir, env, args...)
	term.waitFor(t, "the input prompt", func() bool { return strings.Contains(term.printed(), "❯") })
	return term
}

// toolCount is the number of tools a request body declares.
func toolCount(body []byte) int {
	var req struct{ Tools []json.RawMessage }
	_ = json.Unmarshal(body, &req)
	return len(req.Tools)
}

// loadControlCounts is what the admin API says of the model's load control.
type loadControlCounts struct {
	Admitted  int `json:"admitted"`
	TaskEnded int `json:"task_ended"`
	SideCalls int `json:"side_calls"`
	Replies   struct {
		Read int `json:"read"`
	} `json:"replies"`
}

func (f *fleet) loadControl(t *testing.T) loadControlCounts {
	t.Helper()
	resp, err := http.Get("http://" + f.admin + "/warden/models/" + model)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var status struct {
		LoadControl loadControlCounts `json:"load_control"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&status); err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("admin API: %s, %v", resp.Status, err)
	}
	return status.LoadControl
}

// terminal is a CLI running in a pseudo-terminal, in its own session.
type terminal struct {
	pty    *os.File
	cmd    *exec.Cmd
	mu     sync.Mutex
	screen bytes.Buffer // all it printed, escape sequences included
	exited chan struct{}
	// timeout ends shortly before go test's -timeout (untilTimeout): the waits on the CLI
	// have no bound of their own.
	timeout context.Context
}

// retypeEvery is how long typeLine waits for a line typed to show before it types the line
// again: keys typed while the CLI is still drawing its input box are lost.
const retypeEvery = 5 * time.Second

func startTerminal(t *testing.T, bin, dir string, env []string, args ...string) *terminal {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Dir, cmd.Env = dir, env
	f, err := pty.StartWithSize(cmd, &pty.Winsize{Rows: 50, Cols: 200}) // wide: a prompt typed is not wrapped
	if err != nil {
		t.Fatal(err)
	}
	term := &terminal{pty: f, cmd: cmd, exited: make(chan struct{}), timeout: untilTimeout(t)}
	go func() {
		buf := make([]byte, 32<<10)
		for {
			n, err := f.Read(buf)
			term.mu.Lock()
			term.screen.Write(buf[:n])
			term.mu.Unlock()
			if err != nil {
				break
			}
		}
	}()
	go func() {
		_ = cmd.Wait()
		close(term.exited)
	}()
	t.Cleanup(func() {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) // it leads its session and group
		<-term.exited
		f.Close()
		if t.Failed() {
			t.Logf("the terminal's last output:\n%s", tail(escapes.ReplaceAllString(term.printed(), "")))
		}
	})
	return term
}

// escapes matches the terminal's control sequences (CSI, OSC), left out of a failure's log.
var escapes = regexp.MustCompile("\x1b\\[[0-9;?<>=]*[ -/]*[@-~]|\x1b\\][^\x07\x1b]*(\x07|\x1b\\\\)|\x1b[()][0-9A-Za-z]|\x1b[=>78]")

func (term *terminal) printed() string {
	term.mu.Lock()
	defer term.mu.Unlock()
	return term.screen.String()
}

// waitFor polls cond until it holds; the CLI must not exit meanwhile.
func (term *terminal) waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for !cond() {
		term.pause(t, what, nil)
	}
}

// pause waits a moment, or until retry fires (it then reports true), and fails the test if
// the CLI exited or the run is about to time out while it was waiting for what.
func (term *terminal) pause(t *testing.T, what string, retry <-chan time.Time) (retried bool) {
	t.Helper()
	select {
	case <-term.exited:
		t.Fatalf("the CLI exited while waiting for %s", what)
	case <-term.timeout.Done():
		t.Fatalf("no %s before go test's -timeout", what)
	case <-retry:
		return true
	case <-time.After(100 * time.Millisecond):
	}
	return false
}

// typeLine types s and, once the CLI shows it, Enter, as a person would: an Enter that
// comes with the text in one read is taken for part of a paste. While the text does not
// show, it is typed again every retypeEvery, the box cleared first with Ctrl-U, so that a
// slow echo of an earlier try counts as well as the last one's.
func (term *terminal) typeLine(t *testing.T, s string) {
	t.Helper()
	word := slices.MaxFunc(strings.Fields(s), func(a, b string) int { return len(a) - len(b) }) // drawn whole
	from := len(term.printed())
	shown := func() bool { return strings.Contains(term.printed()[from:], word) }
	for !shown() {
		if _, err := term.pty.WriteString("\x15" + s); err != nil {
			t.Fatal(err)
		}
		retype := time.After(retypeEvery)
		for retyped := false; !retyped && !shown(); {
			retyped = term.pause(t, fmt.Sprintf("%q typed to show", s), retype)
		}
	}
	if _, err := term.pty.WriteString("\r"); err != nil {
		t.Fatal(err)
	}
}

func (term *terminal) waitExit(t *testing.T) {
	t.Helper()
	select {
	case <-term.exited:
	case <-term.timeout.Done():
		t.Fatal("the CLI did not exit before go test's -timeout")
	}
}
