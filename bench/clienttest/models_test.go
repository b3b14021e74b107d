package clienttest

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/lmwarden/caddy-warden/bench/vllmsim/server"
	"github.com/lmwarden/caddy-warden/internal/caddyproc"
	"github.com/lmwarden/caddy-warden/panel"
)

// modelsGuide is what docs/models.md has a user run: its `vllm serve` lines, its Caddyfile,
// which must be examples/Caddyfile.models, and Claude Code's settings.
func modelsGuide(t *testing.T) quickStart {
	t.Helper()
	root, err := caddyproc.RootDir(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	doc, err := os.ReadFile(filepath.Join(root, "docs", "models.md"))
	if err != nil {
		t.Fatal(err)
	}
	guide, err := parseGuide(string(doc))
	if err != nil {
		t.Fatal(err)
	}
	example, err := os.ReadFile(filepath.Join(root, "examples", "Caddyfile.models"))
	if err != nil {
		t.Fatal(err)
	}
	if guide.caddyfile != string(example) {
		t.Fatalf("docs/models.md's Caddyfile is not examples/Caddyfile.models:\n%s", guide.caddyfile)
	}
	if len(guide.servers) == 0 || len(guide.claude.args) == 0 {
		t.Fatalf("docs/models.md has %d vllm serve lines and no claude command", len(guide.servers))
	}
	return guide
}

// guideReplicas are simulated replicas serving what the guide's `vllm serve` lines do, on
// their ports (startQuickStart moves them to free ones). counts says which models' replicas
// serve count_tokens, as a recent vLLM does; the others answer 404, as an older one.
func guideReplicas(guide quickStart, counts func(names []string) bool) []server.Config {
	var sims []server.Config
	for i, s := range guide.servers {
		cfg := server.DefaultConfig()
		cfg.ID = fmt.Sprintf("%s-%d", s.names[0], i) // the model's name first
		fmt.Sscan(s.port, &cfg.Port)
		cfg.ServedModelNames = s.names
		cfg.Profile.MaxModelLen = s.maxModelLen
		cfg.Profile.NumGPUBlocks = 2 * s.maxModelLen / cfg.Profile.BlockSize // room for two full contexts
		cfg.CountTokens = counts(s.names)
		sims = append(sims, cfg)
	}
	return sims
}

// sent is what a request through Caddy came back with.
type sent struct {
	status int
	engine string // X-Vllmsim-Engine: the replica (server id) that answered, "" for none
	body   string
}

func post(t *testing.T, f *fleet, path, session string, body []byte) sent {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, f.url+path, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Claude-Code-Session-Id", session)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	out, _ := io.ReadAll(resp.Body)
	return sent{resp.StatusCode, resp.Header.Get(server.EngineHeader), string(out)}
}

// replicaOf is the server id of an X-Vllmsim-Engine value ("r2/0", or "r2/api" for a count).
func replicaOf(engine string) string {
	id, _, _ := strings.Cut(engine, "/")
	return id
}

// modelStatus is warden's admin JSON for a model.
func (f *fleet) modelStatus(t *testing.T, model string) panel.ModelStatus {
	t.Helper()
	var st panel.ModelStatus
	if err := getJSON("http://"+f.admin+"/warden/models/"+model, &st); err != nil {
		t.Fatal(err)
	}
	return st
}

// pinnedOnOne checks that the model has exactly one conversation, pinned to one replica
// that served every one of its requests.
func (f *fleet) pinnedOnOne(t *testing.T, model string) {
	t.Helper()
	st := f.modelStatus(t, model)
	var holders []string
	for _, r := range st.Replicas {
		if r.Sessions > 0 {
			holders = append(holders, fmt.Sprintf("%s: %d", r.ID, r.Sessions))
		}
	}
	if st.Sessions != 1 || len(holders) != 1 || st.StickyPercent != 100 {
		t.Errorf("warden's %s: %d conversations on %v, sticky %.0f%%; want one, on one replica, every request there",
			model, st.Sessions, holders, st.StickyPercent)
	}
}

// TestModelsGuide runs docs/models.md's farm as written, over HTTP: its Caddyfile in front of
// simulated replicas serving what its `vllm serve` lines serve. One conversation sends turns
// to the large model and side calls to the small one, by name and alias, in each API,
// wherever the body puts the model: each reaches its model's replicas, with the body intact,
// and is pinned within its model. GET /v1/models lists the farm's names. count_tokens goes
// to the conversation's replica where the replicas serve it, and comes back as the replica's
// 404, not as a 5xx, where they do not (the small model's replicas here, as an older vLLM).
func TestModelsGuide(t *testing.T) {
	guide := modelsGuide(t)
	large, small := "qwen3-coder", "qwen3-4b"
	f, refused := startQuickStart(t, guide, guideReplicas(guide, func(names []string) bool { return names[0] == large }))

	resp, err := http.Get(f.url + "/v1/models")
	if err != nil {
		t.Fatal(err)
	}
	var list struct{ Data []struct{ ID string } }
	err = json.NewDecoder(resp.Body).Decode(&list)
	resp.Body.Close()
	var ids []string
	for _, m := range list.Data {
		ids = append(ids, m.ID)
	}
	if want := "[qwen3-4b claude-haiku-4-5 qwen3-coder claude-sonnet-4-5]"; err != nil || fmt.Sprint(ids) != want {
		t.Errorf("GET /v1/models: %v (%v), want %s", ids, err, want)
	}

	const session = "5f0c8e3a-1b2c-4d5e-8f90-0123456789ab"
	turn := func(model string) []byte {
		return fmt.Appendf(nil, `{"model":%q,"max_tokens":16,"stream":true,"messages":[{"role":"user","content":"fix the test"}]}`, model)
	}
	var history strings.Builder
	for i := 0; history.Len() < 96<<10; i++ { // far past the first read, within the small model's context
		fmt.Fprintf(&history, `{"role":"user","content":"step %d: read the file and run the tests again"},{"role":"assistant","content":"done"},`, i)
	}
	// Python's OpenAI SDK writes the model after the conversation.
	chatLast := []byte(`{"messages":[` + history.String() + `{"role":"user","content":"a title?"}],"max_tokens":16,"model":"claude-haiku-4-5"}`)
	mark := f.rec.mark()
	for _, c := range []struct {
		name, path string
		body       []byte
		model      string // whose replicas must answer
	}{
		{"a turn", "/v1/messages?beta=true", turn(large), large},
		{"a side call", "/v1/messages?beta=true", turn(small), small},
		{"a turn by the large model's alias", "/v1/messages", turn("claude-sonnet-4-5"), large},
		{"a side call by the alias, which the glob matches", "/v1/messages", turn("claude-haiku-4-5"), small},
		{"Chat Completions, the model after 96 KiB of history", "/v1/chat/completions", chatLast, small},
		{"Responses", "/v1/responses", fmt.Appendf(nil, `{"model":%q,"input":"hi","max_output_tokens":16}`, small), small},
		{"another turn", "/v1/messages?beta=true", turn(large), large},
	} {
		got := post(t, f, c.path, session, c.body)
		if got.status != http.StatusOK || !strings.HasPrefix(replicaOf(got.engine), c.model) {
			t.Errorf("%s: %d from %q, want 200 from a replica of %s\n%s", c.name, got.status, got.engine, c.model, clip(got.body))
		}
	}
	served := f.rec.since(mark)
	if len(served) != 7 || !slices.ContainsFunc(served, func(s server.Served) bool { return bytes.Equal(s.Body, chatLast) }) {
		t.Errorf("the replicas served %d requests, and the long one not byte for byte", len(served))
	}
	replica := map[string]string{} // the conversation's replica for each model
	for _, s := range served {
		id := replicaOf(s.Engine)
		model := large
		if strings.HasPrefix(id, small) {
			model = small
		}
		if replica[model] == "" {
			replica[model] = id
		} else if replica[model] != id {
			t.Errorf("the conversation's %s requests reached %s and %s", model, replica[model], id)
		}
	}
	f.pinnedOnOne(t, large)
	f.pinnedOnOne(t, small)

	count := func(model string) []byte {
		return fmt.Appendf(nil, `{"model":%q,"messages":[{"role":"user","content":"fix the test"}]}`, model)
	}
	if got := post(t, f, "/v1/messages/count_tokens?beta=true", session, count(large)); got.status != http.StatusOK ||
		replicaOf(got.engine) != replica[large] || !strings.Contains(got.body, `"input_tokens"`) {
		t.Errorf("count_tokens of the large model: %d from %q: %s; want the count from the conversation's replica %s",
			got.status, got.engine, got.body, replica[large])
	}
	if got := post(t, f, "/v1/messages/count_tokens?beta=true", session, count(small)); got.status != http.StatusNotFound ||
		strings.TrimSpace(got.body) != `{"detail":"Not Found"}` {
		t.Errorf("count_tokens of the small model, whose replicas do not serve it: %d %s; want their 404", got.status, got.body)
	}
	if got := post(t, f, "/v1/messages", session, turn(small)); got.status != http.StatusOK || replicaOf(got.engine) != replica[small] {
		t.Errorf("a side call after the 404: %d from %q, want the conversation's replica %s", got.status, got.engine, replica[small])
	}
	for _, model := range []string{large, small} {
		for _, r := range f.modelStatus(t, model).Replicas {
			if !r.Healthy {
				t.Errorf("%s's replica %s is unhealthy", model, r.ID)
			}
		}
	}
	if r := refused.since(0); len(r) > 0 {
		t.Errorf("the replicas refused %+v", r)
	}
}

// TestClaudeCodeTwoModels runs docs/models.md's farm with the real Claude Code in a terminal,
// with its settings as written: each prompt's main request names the large model, the title
// request before it the small one, both under the session's header. Each must reach its
// model's replicas and stay on one of them: warden's admin JSON shows one conversation per
// model, pinned. Its model discovery caches the aliases warden_models lists. Its /context
// command asks count_tokens for each part of the context: with replicas that serve it, each
// count comes from the conversation's replica; with replicas that do not (an older vLLM),
// each is their 404, and /context still shows its estimate. No request fails with a 5xx.
func TestClaudeCodeTwoModels(t *testing.T) {
	guide := modelsGuide(t)
	c := clients[slices.IndexFunc(clients, func(c client) bool { return c.bin == "claude" })]
	bin, version := findCLI(t, c)
	large, small := guide.claude.get("ANTHROPIC_MODEL"), guide.claude.get("ANTHROPIC_DEFAULT_HAIKU_MODEL")
	if large == "" || small == "" || large == small {
		t.Fatalf("docs/models.md's Claude Code asks for %q and, as its small model, %q: want two models", large, small)
	}
	for _, counts := range []bool{true, false} {
		t.Run(fmt.Sprintf("count_tokens-served-%v", counts), func(t *testing.T) {
			f, refused := startQuickStart(t, guide, guideReplicas(guide, func([]string) bool { return counts }))
			home := t.TempDir()
			env := []string{"DISABLE_TELEMETRY=1", "DISABLE_ERROR_REPORTING=1", "DISABLE_AUTOUPDATER=1",
				"CLAUDE_CODE_GATEWAY_HINT_HEADERS=1"} // to tell main requests from side calls
			for _, kv := range guide.claude.env {
				env = append(env, strings.ReplaceAll(kv, quickStartURL, f.url))
			}
			term := startClaudeCode(t, bin, home, env, guide.claude.args[1:]...)
			var turns []turn
			for i := range 2 {
				mark := f.rec.mark()
				term.typeLine(t, prompt("M", i+1))
				name := fmt.Sprintf("prompt %d", i+1)
				term.waitFor(t, name+"'s main request and a side call", func() bool {
					reqs := f.rec.since(mark)
					return slices.ContainsFunc(reqs, func(r server.Served) bool {
						return modelOf(r) == large && r.Header.Get("X-Claude-Code-Request-Class") == "main"
					}) &&
						slices.ContainsFunc(reqs, func(r server.Served) bool { return modelOf(r) == small })
				})
				turns = append(turns, turn{name: name, reqs: f.rec.since(mark)})
			}
			mark, shown := f.rec.mark(), len(term.printed())
			term.typeLine(t, "/context")
			term.waitFor(t, "/context's report", func() bool { return strings.Contains(term.printed()[shown:], "Context usage") })
			counted := f.rec.since(mark)
			term.typeLine(t, "/exit")
			term.waitExit(t)
			requests := f.requestCounts()
			t.Logf("%s %s, interactive, two models, on the wire:\n%s  /context: %d counts served\n  every request through Caddy: %v",
				c.pkg, version, wireSummary(turns), len(counted), requests)

			replica := f.oneReplicaPerModel(t, turns, large, small)
			f.pinnedOnOne(t, large)
			f.pinnedOnOne(t, small)
			if counts {
				if len(counted) == 0 {
					t.Error("/context asked for no count the replicas served")
				}
				for _, r := range counted {
					if !strings.HasSuffix(r.Path, "/count_tokens") || r.Engine != replica[large]+"/api" {
						t.Errorf("/context: %s answered by %s, want count_tokens by the conversation's replica %s", r.Path, r.Engine, replica[large])
					}
				}
			} else if requests["POST /v1/messages/count_tokens?beta=true 404"] == 0 {
				t.Error("/context asked for no count: the 404 of replicas that do not serve it went untested")
			}
			for req, n := range requests {
				if status := req[strings.LastIndexByte(req, ' ')+1:]; status >= "500" {
					t.Errorf("%d of %s", n, req)
				}
			}
			if requests["GET /v1/models?limit=1000 200"] == 0 {
				t.Error("Claude Code's model discovery did not list the models")
			}
			cached, err := os.ReadFile(filepath.Join(home, ".claude", "cache", "gateway-models.json"))
			var discovered struct{ Models []struct{ ID string } }
			if err == nil {
				err = json.Unmarshal(cached, &discovered)
			}
			var ids []string
			for _, m := range discovered.Models {
				ids = append(ids, m.ID)
			}
			if fmt.Sprint(ids) != "[claude-haiku-4-5 claude-sonnet-4-5]" {
				t.Errorf("Claude Code discovered %v (%v), want the aliases named like its models", ids, err)
			}
			if r := refused.since(0); len(r) > 0 {
				t.Errorf("the replicas refused %+v", r)
			}
		})
	}
}

// modelOf is the model a request's body names.
func modelOf(r server.Served) string {
	var body struct{ Model string }
	_ = json.Unmarshal(r.Body, &body)
	return body.Model
}

// oneReplicaPerModel checks that every request of the turns came from one session, named
// one of the models and reached one replica of that model, and returns that replica by
// model.
func (f *fleet) oneReplicaPerModel(t *testing.T, turns []turn, models ...string) map[string]string {
	t.Helper()
	session := ""
	replica := map[string]string{}
	for _, tr := range turns {
		for _, r := range tr.reqs {
			model, id := modelOf(r), replicaOf(r.Engine)
			if session == "" {
				session = r.Header.Get("X-Claude-Code-Session-Id")
			}
			if got := r.Header.Get("X-Claude-Code-Session-Id"); got != session || got == "" {
				t.Errorf("%s: a request with session %q, want every one with the session's %q", tr.name, got, session)
			}
			if !slices.Contains(models, model) || !strings.HasPrefix(id, model) {
				t.Errorf("%s: %s of model %q reached %s", tr.name, r.Path, model, r.Engine)
				continue
			}
			if replica[model] == "" {
				replica[model] = id
			} else if replica[model] != id {
				t.Errorf("%s: the session's %s requests reached %s and %s", tr.name, model, replica[model], id)
			}
		}
	}
	return replica
}
