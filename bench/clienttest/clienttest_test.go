package clienttest

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/lmwarden/caddy-warden/bench/vllmsim/server"
	"github.com/lmwarden/caddy-warden/promptprefix"
)

// reportTime is what the tests keep of go test's -timeout to stop a CLI still running and
// say what they were waiting for, rather than leave it to the test binary's panic.
const reportTime = 15 * time.Second

// untilTimeout is a context that ends reportTime before go test's -timeout (or with the
// test, without one): the tests wait on conditions for as long as the run allows, with no
// bound of their own on how long a CLI may take on a loaded machine.
func untilTimeout(t *testing.T) context.Context {
	deadline, ok := t.Deadline()
	if !ok {
		return t.Context()
	}
	ctx, cancel := context.WithDeadline(t.Context(), deadline.Add(-reportTime))
	t.Cleanup(cancel)
	return ctx
}

// TestClients drives each real CLI through Caddy to the simulated replicas, in one project
// directory: conversation A of three turns (the first, then two that continue it) must reach
// one replica, and conversation B, started after it in the same directory and continued
// once, must reach the other one. Each client has its own fleet, so clients run in parallel
// (as many as -parallel, GOMAXPROCS by default); a CLI spends much of a turn starting up.
func TestClients(t *testing.T) {
	if _, err := caddyBin(); err != nil { // built once, before the clients start
		t.Fatal(err)
	}
	for _, c := range clients {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			testClient(t, c)
		})
	}
}

func testClient(t *testing.T, c client) {
	bin, version := findCLI(t, c)
	f := startFleet(t, fleetOptions{})
	home := t.TempDir()
	env, err := c.setup(f, home)
	if err != nil {
		t.Fatal(err)
	}
	env = append(baseEnv(home), env...)
	dir := filepath.Join(home, "project")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "README.md"), []byte("# project\n\nA test project.\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	conv := func(name string, turns int) []turn {
		var out []turn
		for i := range turns {
			args := c.first(prompt(name, i+1))
			if i > 0 {
				args = c.next(prompt(name, i+1))
			}
			out = append(out, runTurn(t, f, bin, dir, env, fmt.Sprintf("%s turn %d", name, i+1), args))
		}
		return out
	}
	a := conv("A", 3)
	b := conv("B", 2)

	t.Logf("%s %s, on the wire:\n%s  every request through Caddy: %v", c.pkg, version, wireSummary(append(a, b...)), f.requestCounts())
	if dir := os.Getenv("CLIENTTEST_WIRE_DIR"); dir != "" {
		if err := dumpWire(filepath.Join(dir, c.name), append(a, b...)); err != nil {
			t.Error(err)
		}
	}
	engineA, errA := oneEngine(a, c.keyed)
	engineB, errB := oneEngine(b, c.keyed)
	if errA != nil {
		t.Errorf("conversation A: %v", errA)
	}
	if errB != nil {
		t.Errorf("conversation B: %v", errB)
	}
	if errA == nil && errB == nil && engineA == engineB {
		t.Errorf("conversations A and B both on %s; want them on different replicas%s", engineA, sharedLead(a[0].reqs[0], b[0].reqs[0]))
	}
	checkSharedPrefix(t, a[0], b[0])
	if !t.Failed() {
		t.Logf("%s %s: conversation A (3 turns) on %s, conversation B (2 turns) on %s", c.pkg, version, engineA, engineB)
	}
}

// checkSharedPrefix checks that load control reads the client's system prompt and tools
// (promptprefix, what it counts once per replica when the server does not report cached
// tokens) from the first requests of two conversations in one project, and that they share
// at least their first part. A turn's main request is the one that declares the most.
func checkSharedPrefix(t *testing.T, a, b turn) {
	t.Helper()
	main := func(tr turn) promptprefix.Prefix {
		var best promptprefix.Prefix
		for _, r := range tr.reqs {
			if p := promptprefix.Read(r.Body); len(p) > 0 && (len(best) == 0 || p[len(p)-1].Bytes > best[len(best)-1].Bytes) {
				best = p
			}
		}
		return best
	}
	pa, pb := main(a), main(b)
	if len(pa) == 0 || len(pb) == 0 {
		t.Errorf("prefix parts read from the first requests: %d in %s, %d in %s; want some in both", len(pa), a.name, len(pb), b.name)
		return
	}
	shared := pa.SharedBytes(pb)
	t.Logf("prefix parts: %d (%d bytes) in %s, %d (%d bytes) in %s, %d bytes shared",
		len(pa), pa[len(pa)-1].Bytes, a.name, len(pb), pb[len(pb)-1].Bytes, b.name, shared)
	if shared == 0 {
		t.Errorf("%s and %s share no prefix part: load control would count their system prompt twice", a.name, b.name)
	}
}

// turn is one invocation of a CLI and the requests the replicas served during it.
type turn struct {
	name   string
	output string
	reqs   []server.Served
}

// runTurn runs the CLI once in dir and returns what the replicas served meanwhile; the
// invocation must succeed and reach a replica.
func runTurn(t *testing.T, f *fleet, bin, dir string, env []string, name string, args []string) turn {
	t.Helper()
	ctx := untilTimeout(t)
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Dir, cmd.Env = dir, env
	cmd.Stdin = nil // /dev/null: no CLI waits for input
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	// Its own process group, all of it killed if the run times out (CLIs spawn helpers).
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = 5 * time.Second
	mark := f.rec.mark()
	start := time.Now()
	err := cmd.Run()
	out := turn{name: name, output: strings.TrimSpace(stdout.String()), reqs: f.rec.since(mark)}
	took := time.Since(start).Round(10 * time.Millisecond)
	if err != nil {
		if ctx.Err() != nil {
			err = fmt.Errorf("no answer after %v, when go test's -timeout was near", took)
		}
		t.Fatalf("%s: %s %s: %v\nstdout:\n%s\nstderr:\n%s", name, filepath.Base(bin), strings.Join(args, " "), err, tail(stdout.String()), tail(stderr.String()))
	}
	if len(out.reqs) == 0 {
		t.Fatalf("%s: the CLI exited after %v without reaching a replica\nstdout:\n%s\nstderr:\n%s", name, took, tail(stdout.String()), tail(stderr.String()))
	}
	t.Logf("%s: %v, %d request(s), answer %q", name, took, len(out.reqs), firstLine(out.output))
	return out
}

// oneEngine returns the engine that served a conversation's main requests, those with the
// prompt head (system prompt) of its first request, or an error listing where each turn's
// requests went. With all, every request counts: a client that sends a conversation id
// sends it on its side requests too (titles, memory), which therefore stay with it; a
// header-less client's side requests with their own system prompt share no prefix with
// the conversation and may go anywhere.
func oneEngine(turns []turn, all bool) (string, error) {
	main := promptHead(turns[0].reqs[0])
	engines := map[string]bool{}
	var where []string
	for _, tr := range turns {
		var e []string
		for _, r := range tr.reqs {
			side := promptHead(r) != main
			if !side || all {
				engines[r.Engine] = true
			}
			if side {
				e = append(e, r.Engine+" (side request)")
			} else {
				e = append(e, r.Engine)
			}
		}
		where = append(where, tr.name+": "+strings.Join(e, ", "))
	}
	if len(engines) == 1 {
		for e := range engines {
			return e, nil
		}
	}
	return "", fmt.Errorf("its requests reached %d replicas (%s)", len(engines), strings.Join(where, "; "))
}

// sharedLead says how much two conversations' first requests have in common: the
// system prompt and the leading messages or input items that are byte for byte the same,
// what a key derived from the conversation's head cannot tell apart.
func sharedLead(a, b server.Served) string {
	items := func(body []byte) []json.RawMessage {
		var m struct {
			Messages []json.RawMessage `json:"messages"`
			Input    []json.RawMessage `json:"input"`
		}
		_ = json.Unmarshal(body, &m)
		return append(m.Messages, m.Input...)
	}
	ia, ib := items(a.Body), items(b.Body)
	n := 0
	for n < len(ia) && n < len(ib) && bytes.Equal(ia[n], ib[n]) {
		n++
	}
	var roles []string
	for _, it := range ia[:n] {
		var m struct{ Role, Type string }
		_ = json.Unmarshal(it, &m)
		roles = append(roles, cmpOrString(m.Role, m.Type))
	}
	return fmt.Sprintf(" (their first requests share the system prompt: %v, and %d of %d leading items: %v)",
		promptHead(a) == promptHead(b), n, len(ia), roles)
}

func cmpOrString(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// promptHead is what a request's prompt starts with: its system prompt (Anthropic system,
// Responses instructions, or the first chat message), as the simulator renders it.
func promptHead(r server.Served) string {
	var m struct {
		System       json.RawMessage   `json:"system"`
		Instructions json.RawMessage   `json:"instructions"`
		Messages     []json.RawMessage `json:"messages"`
	}
	_ = json.Unmarshal(r.Body, &m)
	switch {
	case len(m.System) > 0:
		return string(m.System)
	case len(m.Instructions) > 0:
		return string(m.Instructions)
	case len(m.Messages) > 0:
		return string(m.Messages[0])
	}
	return ""
}

// findCLI finds the pinned CLI in node_modules (npm ci in this directory). Where it is
// absent the test skips, unless under CI, where .ci/run installs it and absence is a failure.
func findCLI(t *testing.T, c client) (bin, version string) {
	t.Helper()
	bin, err := filepath.Abs(filepath.Join("node_modules", ".bin", c.bin))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(bin); err != nil {
		msg := fmt.Sprintf("%s (%s) is not installed: run `npm ci` in bench/clienttest", c.bin, c.pkg)
		if os.Getenv("CI") != "" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	var pkg struct{ Version string }
	data, err := os.ReadFile(filepath.Join("node_modules", filepath.FromSlash(c.pkg), "package.json"))
	if err == nil {
		err = json.Unmarshal(data, &pkg)
	}
	if err != nil {
		t.Fatalf("reading %s's version: %v", c.pkg, err)
	}
	return bin, pkg.Version
}

// baseEnv is a private home and XDG directories, PATH (node runs some CLIs), and no
// inherited credentials or configuration.
func baseEnv(home string) []string {
	env := []string{
		"HOME=" + home,
		"XDG_CONFIG_HOME=" + filepath.Join(home, ".config"),
		"XDG_DATA_HOME=" + filepath.Join(home, ".local", "share"),
		"XDG_STATE_HOME=" + filepath.Join(home, ".local", "state"),
		"XDG_CACHE_HOME=" + filepath.Join(home, ".cache"),
		"TMPDIR=" + os.TempDir(),
		"TERM=dumb",
		"NO_COLOR=1",
		"CI=1", // CLIs take it as "not interactive"
		"LANG=C.UTF-8",
	}
	if path := os.Getenv("PATH"); path != "" {
		env = append(env, "PATH="+path)
	}
	return env
}

// wireSummary lists, per request, what the client sent that could identify its
// conversation: every header but the transport and auth ones, and the body's id fields.
func wireSummary(turns []turn) string {
	var b strings.Builder
	for _, tr := range turns {
		for i, r := range tr.reqs {
			fmt.Fprintf(&b, "  %s #%d %s -> %s\n", tr.name, i+1, r.Path, r.Engine)
			var names []string
			for name := range r.Header {
				if !boringHeader(name) {
					names = append(names, name)
				}
			}
			sort.Strings(names)
			for _, name := range names {
				fmt.Fprintf(&b, "      %s: %s\n", name, clip(strings.Join(r.Header.Values(name), ", ")))
			}
			for _, field := range bodyIDs(r.Body) {
				fmt.Fprintf(&b, "      body %s\n", field)
			}
		}
	}
	return b.String()
}

func boringHeader(name string) bool {
	return slices.Contains([]string{
		"Accept", "Accept-Encoding", "Accept-Language", "Authorization", "Connection", "Content-Length",
		"Content-Type", "X-Api-Key", "X-Forwarded-For", "X-Forwarded-Host", "X-Forwarded-Proto", "Via",
		"Sec-Fetch-Mode", "Priority",
	}, name)
}

// bodyIDs returns the body's fields that name a conversation, a user or a cache key, and
// the model and sizes, as "field=value".
func bodyIDs(body []byte) []string {
	var m map[string]json.RawMessage
	if json.Unmarshal(body, &m) != nil {
		return []string{fmt.Sprintf("(not a JSON object, %d bytes)", len(body))}
	}
	var out []string
	for _, k := range []string{"model", "prompt_cache_key", "metadata", "user", "session_id", "client_metadata", "previous_response_id", "store", "max_tokens", "max_output_tokens", "stream"} {
		if v, ok := m[k]; ok {
			out = append(out, k+"="+clip(string(v)))
		}
	}
	for _, k := range []string{"messages", "input"} {
		var items []json.RawMessage
		if v, ok := m[k]; ok && json.Unmarshal(v, &items) == nil {
			out = append(out, fmt.Sprintf("%s: %d items", k, len(items)))
		}
	}
	return append(out, fmt.Sprintf("(%d bytes)", len(body)))
}

func clip(s string) string {
	if len(s) > 240 {
		return s[:240] + "..."
	}
	return s
}

func tail(s string) string {
	if len(s) > 4000 {
		return "..." + s[len(s)-4000:]
	}
	return s
}

func firstLine(s string) string {
	line, _, _ := strings.Cut(s, "\n")
	if len(line) > 100 {
		return line[:100] + "..."
	}
	return line
}

// dumpWire writes each request's headers and body under dir (CLIENTTEST_WIRE_DIR=DIR keeps
// what every client sent, for reading).
func dumpWire(dir string, turns []turn) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	for _, tr := range turns {
		for i, r := range tr.reqs {
			base := filepath.Join(dir, fmt.Sprintf("%s-%d", strings.ReplaceAll(tr.name, " ", "-"), i+1))
			var h strings.Builder
			fmt.Fprintf(&h, "POST %s -> %s\n", r.Path, r.Engine)
			_ = r.Header.Write(&h)
			if err := os.WriteFile(base+".headers", []byte(h.String()), 0o644); err != nil {
				return err
			}
			if err := os.WriteFile(base+".json", r.Body, 0o644); err != nil {
				return err
			}
		}
	}
	return nil
}
