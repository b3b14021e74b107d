package clienttest

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/lmwarden/caddy-warden/bench/vllmsim/server"
	"github.com/lmwarden/caddy-warden/internal/caddyproc"
	"github.com/lmwarden/caddy-warden/internal/testnet"
)

// quickStart is what the README's quick start has a user run.
type quickStart struct {
	servers      []vllmServe // its `vllm serve` lines
	caddyfile    string      // its Caddyfile
	claude       command     // Claude Code: environment and command
	openCode     command
	codex        command
	codexProfile string // ~/.codex/<profile>.config.toml
}

// vllmServe is what a `vllm serve` line says clients may ask for.
type vllmServe struct {
	port        string
	names       []string // --served-model-name
	maxModelLen int
}

// command is a shell command: its leading VAR=value assignments, and its words.
type command struct {
	env  []string
	args []string
}

func (c command) get(name string) string {
	for _, kv := range c.env {
		if k, v, _ := strings.Cut(kv, "="); k == name {
			return v
		}
	}
	return ""
}

// quickStartURL is the site the quick start's clients are pointed at.
const quickStartURL = "http://127.0.0.1:8080"

// parseQuickStart reads the README's "Quick start" section.
func parseQuickStart(readme string) (quickStart, error) {
	_, section, ok := strings.Cut(readme, "\n## Quick start\n")
	if !ok {
		return quickStart{}, errors.New("the README has no Quick start section")
	}
	section, _, _ = strings.Cut(section, "\n## ")
	return parseGuide(section)
}

// parseGuide reads what a guide has a user run: its ```sh blocks (the `vllm serve` lines and
// the clients' commands), its first Caddyfile and Codex's profile.
func parseGuide(section string) (quickStart, error) {
	var qs quickStart
	for _, b := range fenced(section) {
		switch b.lang {
		case "caddyfile":
			if qs.caddyfile == "" {
				qs.caddyfile = b.text
			}
		case "toml":
			if strings.Contains(b.text, "[model_providers.") {
				qs.codexProfile = b.text
			}
		case "sh":
			for _, line := range logicalLines(b.text) {
				words, err := shellWords(line)
				if err != nil {
					return qs, fmt.Errorf("%q: %v", line, err)
				}
				c := splitAssignments(words)
				switch {
				case len(c.args) >= 2 && c.args[0] == "vllm" && c.args[1] == "serve":
					s, err := parseVLLMServe(c.args[2:])
					if err != nil {
						return qs, fmt.Errorf("%q: %v", line, err)
					}
					qs.servers = append(qs.servers, s)
				case len(c.args) > 0 && c.args[0] == "claude":
					qs.claude = c
				case len(c.args) > 0 && c.args[0] == "codex":
					qs.codex = c
				case len(c.args) > 0 && c.args[0] == "opencode":
					qs.openCode = c
				}
			}
		}
	}
	return qs, nil
}

type block struct{ lang, text string }

// fenced are the text's fenced code blocks.
func fenced(text string) []block {
	var out []block
	for rest := text; ; {
		_, after, ok := strings.Cut(rest, "```")
		if !ok {
			return out
		}
		lang, body, _ := strings.Cut(after, "\n")
		body, tail, _ := strings.Cut(body, "```")
		out = append(out, block{lang: strings.TrimSpace(lang), text: body})
		rest = tail
	}
}

// logicalLines joins the lines a trailing backslash continues.
func logicalLines(text string) []string {
	var out []string
	var cur strings.Builder
	for line := range strings.Lines(text) {
		line = strings.TrimRight(line, "\n")
		if l, ok := strings.CutSuffix(line, "\\"); ok {
			cur.WriteString(l + " ")
			continue
		}
		cur.WriteString(line)
		out = append(out, cur.String())
		cur.Reset()
	}
	return out
}

// shellWords splits a command line as sh does for what the quick start writes: blanks,
// single and double quotes, backslashes, and a # comment.
func shellWords(line string) ([]string, error) {
	var words []string
	var w strings.Builder
	inWord := false
	for i := 0; i < len(line); i++ {
		switch c := line[i]; {
		case c == ' ' || c == '\t':
			if inWord {
				words, inWord = append(words, w.String()), false
				w.Reset()
			}
		case c == '#' && !inWord:
			return words, nil
		case c == '\'':
			end := strings.IndexByte(line[i+1:], '\'')
			if end < 0 {
				return nil, errors.New("unclosed single quote")
			}
			w.WriteString(line[i+1 : i+1+end])
			i, inWord = i+1+end, true
		case c == '"':
			i++
			for ; i < len(line) && line[i] != '"'; i++ {
				if line[i] == '\\' && i+1 < len(line) {
					i++
				}
				w.WriteByte(line[i])
			}
			if i == len(line) {
				return nil, errors.New("unclosed double quote")
			}
			inWord = true
		case c == '\\' && i+1 < len(line):
			i++
			w.WriteByte(line[i])
			inWord = true
		default:
			w.WriteByte(c)
			inWord = true
		}
	}
	if inWord {
		words = append(words, w.String())
	}
	return words, nil
}

var assignment = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*=`)

func splitAssignments(words []string) command {
	i := 0
	for i < len(words) && assignment.MatchString(words[i]) {
		i++
	}
	return command{env: words[:i], args: words[i:]}
}

// parseVLLMServe reads the flags of `vllm serve MODEL ...` that say what clients may ask
// for; --served-model-name takes every name up to the next flag, as vLLM's does.
func parseVLLMServe(args []string) (vllmServe, error) {
	var s vllmServe
	for i := 0; i < len(args); i++ {
		flag, value, hasValue := strings.Cut(args[i], "=")
		next := func() string {
			if hasValue {
				return value
			}
			if i+1 < len(args) {
				i++
				return args[i]
			}
			return ""
		}
		switch flag {
		case "--port":
			s.port = next()
		case "--max-model-len":
			n, err := strconv.Atoi(next())
			if err != nil {
				return s, fmt.Errorf("--max-model-len: %v", err)
			}
			s.maxModelLen = n
		case "--served-model-name":
			if hasValue {
				s.names = append(s.names, value)
			}
			for i+1 < len(args) && !strings.HasPrefix(args[i+1], "-") {
				i++
				s.names = append(s.names, args[i])
			}
		}
	}
	if s.port == "" || len(s.names) == 0 || s.maxModelLen == 0 {
		return s, errors.New("a vllm serve line needs --port, --served-model-name and --max-model-len")
	}
	return s, nil
}

// simulatedReplicas are the configs of the simulators `make replicas` starts, read from the
// commands it would run.
func simulatedReplicas(t *testing.T) []server.Config {
	t.Helper()
	root, err := caddyproc.RootDir(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("make", "-s", "-n", "replicas")
	cmd.Dir = root
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("make -n replicas: %v", err)
	}
	var sims []server.Config
	for _, part := range strings.FieldsFunc(string(out), func(r rune) bool { return r == '\n' || r == '&' || r == ';' }) {
		words, err := shellWords(strings.TrimSpace(part))
		if err != nil || len(words) == 0 || filepath.Base(words[0]) != "vllmsim" {
			continue
		}
		cfg, err := server.ParseFlags(words[1:], os.Stderr)
		if err != nil {
			t.Fatalf("%s: %v", part, err)
		}
		sims = append(sims, cfg)
	}
	if len(sims) == 0 {
		t.Fatalf("make -n replicas runs no vllmsim:\n%s", out)
	}
	return sims
}

// checkNames reports every way the quick start's parts disagree: the names the clients ask
// for and the context they assume against what the `vllm serve` lines serve, and the
// simulated replicas against the `vllm serve` lines and the Caddyfile's replicas.
func checkNames(qs quickStart, sims []server.Config) error {
	var errs []error
	if len(qs.servers) == 0 {
		return errors.New("no vllm serve line")
	}
	served, maxLen := qs.servers[0].names, qs.servers[0].maxModelLen
	var ports []string
	for _, s := range qs.servers {
		ports = append(ports, s.port)
		if !sameSet(s.names, served) || s.maxModelLen != maxLen {
			errs = append(errs, fmt.Errorf("vllm serve on port %s serves %v with --max-model-len %d, another line %v with %d", s.port, s.names, s.maxModelLen, served, maxLen))
		}
		if !strings.Contains(qs.caddyfile, "127.0.0.1:"+s.port) {
			errs = append(errs, fmt.Errorf("the Caddyfile does not list the replica on port %s", s.port))
		}
	}
	var simPorts []string
	for _, c := range sims {
		simPorts = append(simPorts, strconv.Itoa(c.Port))
		if names := cmpOrNames(c.ServedModelNames, c.Model); !sameSet(names, served) || c.Profile.MaxModelLen != maxLen {
			errs = append(errs, fmt.Errorf("make replicas serves %v with --max-model-len %d on port %d, vllm serve %v with %d", names, c.Profile.MaxModelLen, c.Port, served, maxLen))
		}
	}
	if !sameSet(simPorts, ports) {
		errs = append(errs, fmt.Errorf("make replicas listens on ports %v, vllm serve on %v", simPorts, ports))
	}
	asked := map[string][]string{} // client: the model names it asks for
	for _, kv := range qs.claude.env {
		if k, v, _ := strings.Cut(kv, "="); strings.HasSuffix(k, "_MODEL") {
			asked["Claude Code "+k] = []string{v}
		}
	}
	if qs.claude.get("ANTHROPIC_MODEL") == "" {
		errs = append(errs, errors.New("Claude Code's settings leave ANTHROPIC_MODEL out: it would ask for its own model"))
	}
	if m := regexp.MustCompile(`(?m)^model = "([^"]+)"`).FindStringSubmatch(qs.codexProfile); m != nil {
		asked["Codex"] = []string{m[1]}
	} else {
		errs = append(errs, errors.New("Codex's profile sets no model"))
	}
	var oc struct {
		Model      string `json:"model"`
		SmallModel string `json:"small_model"`
		Provider   map[string]struct {
			Models map[string]struct {
				Limit struct{ Context, Output int } `json:"limit"`
			} `json:"models"`
		} `json:"provider"`
	}
	if err := json.Unmarshal([]byte(qs.openCode.get("OPENCODE_CONFIG_CONTENT")), &oc); err != nil {
		errs = append(errs, fmt.Errorf("OpenCode's OPENCODE_CONFIG_CONTENT: %v", err))
	}
	for _, m := range []string{oc.Model, oc.SmallModel} {
		_, name, _ := strings.Cut(m, "/") // provider/model
		asked["OpenCode "+m] = []string{name}
	}
	for provider, p := range oc.Provider {
		for name, m := range p.Models {
			asked["OpenCode provider "+provider] = append(asked["OpenCode provider "+provider], name)
			if m.Limit.Context > maxLen || m.Limit.Output >= maxLen {
				errs = append(errs, fmt.Errorf("OpenCode's %s: context %d, output %d; --max-model-len is %d", name, m.Limit.Context, m.Limit.Output, maxLen))
			}
		}
	}
	for client, names := range asked {
		for _, n := range names {
			if !slices.Contains(served, n) {
				errs = append(errs, fmt.Errorf("%s asks for model %q; vllm serve serves %v", client, n, served))
			}
		}
	}
	window, _ := strconv.Atoi(qs.claude.get("CLAUDE_CODE_MAX_CONTEXT_TOKENS"))
	output, _ := strconv.Atoi(qs.claude.get("CLAUDE_CODE_MAX_OUTPUT_TOKENS"))
	if window == 0 || window > maxLen || output == 0 || output >= maxLen {
		errs = append(errs, fmt.Errorf("Claude Code assumes a context of %d tokens and outputs of %d; --max-model-len is %d", window, output, maxLen))
	}
	return errors.Join(errs...)
}

func cmpOrNames(names []string, model string) []string {
	if len(names) == 0 {
		return []string{model}
	}
	return names
}

func sameSet(a, b []string) bool {
	return slices.Equal(slices.Sorted(slices.Values(a)), slices.Sorted(slices.Values(b)))
}

func readme(t *testing.T) string {
	t.Helper()
	root, err := caddyproc.RootDir(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	text, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	return string(text)
}

// TestQuickStart runs the README's quick start as written against the simulated replicas
// `make replicas` starts: its Caddyfile, and Claude Code, Codex and OpenCode with its
// settings. The simulators, like vLLM, refuse a model they do not serve, and a request
// whose output does not fit --max-model-len: every request must be served. Only
// addresses change (every port is a free one, and Caddy gets an admin address of its
// own), and the simulators run 20 times faster with short replies.
func TestQuickStart(t *testing.T) {
	qs, err := parseQuickStart(readme(t))
	if err != nil {
		t.Fatal(err)
	}
	sims := simulatedReplicas(t)
	if err := checkNames(qs, sims); err != nil {
		t.Fatalf("the quick start's parts disagree:\n%v", err)
	}
	type cli struct {
		name, bin, pkg string
		cmd            command
		// args are the command's arguments for one non-interactive turn.
		args func(prompt string) []string
		// env is what keeps the CLI to the test: no telemetry, updates or downloads.
		env []string
	}
	clis := []cli{
		{"ClaudeCode", "claude", "@anthropic-ai/claude-code", qs.claude,
			func(p string) []string { return append(slices.Clone(qs.claude.args[1:]), "-p", p) },
			[]string{"DISABLE_TELEMETRY=1", "DISABLE_ERROR_REPORTING=1", "DISABLE_AUTOUPDATER=1"}},
		{"Codex", "codex", "@openai/codex", qs.codex,
			func(p string) []string {
				return append(append([]string{"exec", "--skip-git-repo-check"}, qs.codex.args[1:]...), p)
			}, nil},
		{"OpenCode", "opencode", "opencode-ai", qs.openCode,
			func(p string) []string { return append(append([]string{"run"}, qs.openCode.args[1:]...), p) },
			[]string{"OPENCODE_DISABLE_AUTOUPDATE=1", "OPENCODE_DISABLE_MODELS_FETCH=1", "OPENCODE_DISABLE_DEFAULT_PLUGINS=1",
				"OPENCODE_DISABLE_LSP_DOWNLOAD=1", "OPENCODE_DISABLE_SHARE=1", "OPENCODE_DISABLE_CLAUDE_CODE=1"}},
	}
	bins := map[string]string{}
	for _, c := range clis {
		bins[c.name], _ = findCLI(t, client{bin: c.bin, pkg: c.pkg})
	}

	f, refused := startQuickStart(t, qs, sims)
	for _, c := range clis {
		t.Run(c.name, func(t *testing.T) {
			home := t.TempDir()
			dir := filepath.Join(home, "project")
			if err := os.MkdirAll(dir, 0o755); err != nil {
				t.Fatal(err)
			}
			env := append(baseEnv(home), c.env...)
			for _, kv := range c.cmd.env {
				env = append(env, strings.ReplaceAll(kv, quickStartURL, f.url))
			}
			if c.name == "Codex" {
				profile := strings.ReplaceAll(qs.codexProfile, quickStartURL, f.url)
				name := c.cmd.args[slices.Index(c.cmd.args, "--profile")+1]
				if err := writeFile(filepath.Join(home, ".codex", name+".config.toml"), profile); err != nil {
					t.Fatal(err)
				}
			}
			mark := refused.count()
			out := runTurn(t, f, bins[c.name], dir, env, c.name, c.args(prompt("Q", 1)))
			if r := refused.since(mark); len(r) > 0 {
				t.Errorf("the replicas refused %+v", r)
			}
			if out.output == "" {
				t.Error("the CLI printed no answer")
			}
		})
	}
	var st struct {
		Requests         uint64 `json:"requests"`
		MaxNumSeqsSource string `json:"max_num_seqs_source"`
	}
	model := modelLabel(qs.caddyfile)
	if err := getJSON("http://"+f.admin+"/warden/models/"+model, &st); err != nil {
		t.Fatal(err)
	}
	source := "vllm_default" // the replicas are not Caddy's processes
	if strings.Contains(qs.caddyfile, "max_num_seqs") {
		source = "config"
	}
	if st.Requests < uint64(len(clis)) || st.MaxNumSeqsSource != source {
		t.Errorf("warden's model %s: %+v; want every request routed by warden, max_num_seqs from %s", model, st, source)
	}
}

// refusals keeps what the replicas refused.
type refusals struct {
	mu   sync.Mutex
	list []server.Refused
}

func (r *refusals) add(x server.Refused) { r.mu.Lock(); r.list = append(r.list, x); r.mu.Unlock() }
func (r *refusals) count() int           { r.mu.Lock(); defer r.mu.Unlock(); return len(r.list) }
func (r *refusals) since(mark int) []server.Refused {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.list[mark:])
}

// startQuickStart starts the simulated replicas and Caddy with the quick start's
// Caddyfile, on free ports, its site logging each request.
func startQuickStart(t *testing.T, qs quickStart, sims []server.Config) (*fleet, *refusals) {
	t.Helper()
	bin, err := caddyBin()
	if err != nil {
		t.Fatal(err)
	}
	rec, refused := &recorder{}, &refusals{}
	caddyfile := qs.caddyfile
	for i, cfg := range sims {
		readmePort := cfg.Port
		cfg.Host, cfg.Port = "127.0.0.1", 0
		if cfg.ID == "" {
			cfg.ID = fmt.Sprintf("r%d", i)
		}
		cfg.TimeScale = 20
		if cfg.OutputLen, err = server.ParseOutputLen("uniform:8:24"); err != nil {
			t.Fatal(err)
		}
		cfg.OnRequest, cfg.OnCount, cfg.OnRefuse = rec.add, rec.add, refused.add
		sim, err := server.New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		if err := sim.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = sim.Close() })
		caddyfile = replaceOnce(t, caddyfile, fmt.Sprintf("127.0.0.1:%d", readmePort), sim.Addr())
	}
	ports := testnet.Addrs(t, 2)
	admin, site := ports[0], ports[1]
	_, sitePort, _ := strings.Cut(site, ":")
	_, readmeSitePort, _ := strings.Cut(strings.TrimPrefix(quickStartURL, "http://"), ":")
	// The site logs its requests (fleet.requestCounts).
	caddyfile = replaceOnce(t, caddyfile, "\n:"+readmeSitePort+" {", "\n:"+sitePort+" {\n\tlog {\n\t\toutput stderr\n\t\tformat json\n\t}")
	global, ok := strings.CutPrefix(caddyfile, "{\n")
	if !ok {
		t.Fatalf("the quick start's Caddyfile opens with no global options block:\n%s", caddyfile)
	}
	caddyfile = "{\n\tadmin " + admin + "\n" + global
	return runFleet(t, bin, caddyfile, admin, site, rec), refused
}

// replaceOnce replaces old, which must occur once, in s.
func replaceOnce(t *testing.T, s, old, new string) string {
	t.Helper()
	if n := strings.Count(s, old); n != 1 {
		t.Fatalf("%q occurs %d times in the quick start's Caddyfile, want once:\n%s", old, n, s)
	}
	return strings.Replace(s, old, new, 1)
}

// modelLabel is the first model the Caddyfile declares.
func modelLabel(caddyfile string) string {
	m := regexp.MustCompile(`(?m)^\s*model (\S+) \{`).FindStringSubmatch(caddyfile)
	if m == nil {
		return ""
	}
	return m[1]
}

func getJSON(url string, out any) error {
	resp, err := http.Get(url)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	return json.NewDecoder(resp.Body).Decode(out)
}

// The check fails as soon as the README's parts disagree, and the replicas refuse, as
// vLLM does, a model they do not serve: a README whose vllm serve lines serve another
// name than its clients ask for fails TestQuickStart twice over.
func TestQuickStartNamesMustAgree(t *testing.T) {
	text := readme(t)
	qs, err := parseQuickStart(text)
	if err != nil {
		t.Fatal(err)
	}
	sims := simulatedReplicas(t)
	if err := checkNames(qs, sims); err != nil {
		t.Fatalf("the README as it is: %v", err)
	}
	name := qs.servers[0].names[0]
	for what, mutate := range map[string]func(string) string{
		"vllm serve renamed": func(s string) string {
			return strings.ReplaceAll(s, "--served-model-name "+name, "--served-model-name "+name+"-renamed")
		},
		"Claude Code's model renamed": func(s string) string {
			return strings.Replace(s, "ANTHROPIC_MODEL="+name, "ANTHROPIC_MODEL=claude-opus-5-5", 1)
		},
		"Claude Code's model left out": func(s string) string {
			return strings.Replace(s, "ANTHROPIC_MODEL="+name+" \\\n", "", 1)
		},
		"Codex's model renamed": func(s string) string {
			return strings.Replace(s, `model = "`+name+`"`, `model = "gpt-5.5"`, 1)
		},
		"a context over --max-model-len": func(s string) string {
			return regexp.MustCompile(`CLAUDE_CODE_MAX_CONTEXT_TOKENS=\d+`).ReplaceAllString(s, "CLAUDE_CODE_MAX_CONTEXT_TOKENS=1000000")
		},
	} {
		mutated := mutate(text)
		if mutated == text {
			t.Fatalf("%s: the README no longer has what the mutation changes", what)
		}
		qs, err := parseQuickStart(mutated)
		if err == nil {
			err = checkNames(qs, sims)
		}
		if err == nil {
			t.Errorf("%s: the check passes", what)
		} else {
			t.Logf("%s: %v", what, err)
		}
	}

	// The refusal itself: a replica serving the renamed name answers Claude Code's model 404.
	cfg := sims[0]
	cfg.Host, cfg.Port = "127.0.0.1", 0
	cfg.ServedModelNames = []string{name + "-renamed"}
	var refused refusals
	cfg.OnRefuse = refused.add
	sim, err := server.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := sim.Start(); err != nil {
		t.Fatal(err)
	}
	defer sim.Close()
	body := fmt.Sprintf(`{"model": %q, "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}`, qs.claude.get("ANTHROPIC_MODEL"))
	resp, err := http.Post("http://"+sim.Addr()+"/v1/messages", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	var answer bytes.Buffer
	_, _ = answer.ReadFrom(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusNotFound || !strings.Contains(answer.String(), "does not exist") || refused.count() != 1 {
		t.Errorf("a replica serving %s-renamed answered Claude Code's model %d %s (%d refusals heard), want 404 does not exist",
			name, resp.StatusCode, answer.String(), refused.count())
	}
}

// The parser reads what sh would of the quick start's lines.
func TestShellWords(t *testing.T) {
	for in, want := range map[string][]string{
		`A=1 B='x y' cmd --flag "q \"t\"" # comment`:    {"A=1", "B=x y", "cmd", "--flag", `q "t"`},
		`make caddy          # bin/caddy`:               {"make", "caddy"},
		`OPENCODE_CONFIG_CONTENT='{"a": "b"}' opencode`: {`OPENCODE_CONFIG_CONTENT={"a": "b"}`, "opencode"},
	} {
		if got, err := shellWords(in); err != nil || !slices.Equal(got, want) {
			t.Errorf("%s: %q %v, want %q", in, got, err, want)
		}
	}
	if _, err := shellWords(`A='open`); err == nil {
		t.Error("an unclosed quote was accepted")
	}
}
