package caddymodule_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/lmwarden/caddy-warden/internal/caddyproc"
	"github.com/lmwarden/caddy-warden/internal/testnet"
	"github.com/lmwarden/caddy-warden/internal/testrun"
	"github.com/lmwarden/caddy-warden/panel"
)

// Two models behind one address: warden_model sends each request to its
// model's replicas by the model its body names (a name, an alias or a
// glob), whatever the API and wherever the field stands; a body naming
// none goes to the last route; warden_models answers the model list with
// both models' names and aliases.
func TestModelsBehindOneAddress(t *testing.T) {
	large := []*fakeVLLM{startFakeVLLM(t, "large-a", 1), startFakeVLLM(t, "large-b", 1)}
	small := startFakeVLLM(t, "small", 1)
	ports := testnet.Addrs(t, 2)
	admin, site := ports[0], ports[1]
	caddyfile := fmt.Sprintf(`{
	admin %s
	default_bind 127.0.0.1
	warden {
		model qwen3-coder {
			aliases claude-sonnet-4-5 claude-opus-4-1
			replicas %s %s
		}
		model qwen3-4b {
			aliases claude-haiku-4-5
			replicas %s
		}
	}
}
http://%s {
	warden_models
	@small warden_model qwen3-4b claude-haiku-*
	reverse_proxy @small {
		dynamic warden qwen3-4b
		lb_policy warden qwen3-4b
		flush_interval -1
	}
	reverse_proxy {
		dynamic warden qwen3-coder
		lb_policy warden qwen3-coder
		flush_interval -1
	}
}
`, admin, large[0].addr, large[1].addr, small.addr, site)
	fields := map[string]any{"metrics_interval": "100ms"}
	config, err := caddyproc.Adapt(caddyBin, caddyfile, map[string]map[string]any{"qwen3-coder": fields, "qwen3-4b": fields})
	if err != nil {
		t.Fatal(err)
	}
	log := &testrun.Buffer{}
	p, err := caddyproc.Start(caddyBin, config, admin, log)
	if err != nil {
		t.Fatalf("%v\n%s", err, log.String())
	}
	t.Cleanup(func() {
		p.Stop()
		if t.Failed() {
			t.Logf("caddy log:\n%s", log.String())
		}
	})
	testrun.Eventually(t, 10*time.Second, "every replica healthy", func() bool {
		for _, m := range []string{"qwen3-coder", "qwen3-4b"} {
			var st panel.ModelStatus
			if err := p.Do(http.MethodGet, "/warden/models/"+m, nil, &st); err != nil {
				t.Fatal(err)
			}
			for _, r := range st.Replicas {
				if !r.Healthy || !r.MetricsKnown {
					return false
				}
			}
		}
		return true
	})

	base := "http://" + site
	send := func(path, body string) (status int, backend string) {
		t.Helper()
		req, err := http.NewRequest(http.MethodPost, base+path, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("X-Claude-Code-Session-Id", "one-session")
		resp, err := siteClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		_, _ = io.Copy(io.Discard, resp.Body)
		return resp.StatusCode, resp.Header.Get("X-Backend")
	}
	history := `[` + strings.Repeat(`{"role":"user","content":"a long conversation, turn after turn"},`, 30_000) + `{"role":"user","content":"hi"}]`
	for _, c := range []struct {
		name, path, body string
		small            bool
	}{
		{"Anthropic, the small model's alias", "/v1/messages?beta=true", `{"model":"claude-haiku-4-5","max_tokens":8,"stream":true,"messages":[{"role":"user","content":"title"}]}`, true},
		{"a name the glob matches", "/v1/messages", `{"model":"claude-haiku-4-5-20251001","max_tokens":8,"messages":[]}`, true},
		{"Chat Completions, model after 1 MiB of history", "/v1/chat/completions", `{"messages":` + history + `,"model":"qwen3-4b"}`, true},
		{"Responses, the large model", "/v1/responses", `{"model":"qwen3-coder","input":"hi"}`, false},
		{"the large model's alias", "/v1/messages", `{"model":"claude-sonnet-4-5","max_tokens":8,"messages":[]}`, false},
		{"no model", "/v1/messages", `{"max_tokens":8,"messages":[]}`, false},
		{"not JSON", "/v1/messages", `model=qwen3-4b`, false},
	} {
		status, backend := send(c.path, c.body)
		if got := backend == "small/0"; status != http.StatusOK || got != c.small || backend == "" {
			t.Errorf("%s: %d from %q, want the small model's replica: %v", c.name, status, backend, c.small)
		}
	}

	get := func(path string) (int, string, []byte) {
		t.Helper()
		resp, err := siteClient.Get(base + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, resp.Header.Get("Content-Type"), body
	}
	status, ctype, body := get("/v1/models?limit=1000")
	var list struct {
		Object  string `json:"object"`
		HasMore *bool  `json:"has_more"`
		Data    []struct {
			ID, Object, Type, DisplayName, OwnedBy string
			Created                                int64
		} `json:"data"`
	}
	if err := json.Unmarshal(body, &list); err != nil || status != http.StatusOK || ctype != "application/json" {
		t.Fatalf("GET /v1/models: %d %s %s (%v)", status, ctype, body, err)
	}
	var ids []string
	for _, m := range list.Data {
		ids = append(ids, m.ID)
		if m.Object != "model" || m.Type != "model" || m.Created == 0 {
			t.Errorf("entry %+v lacks OpenAI's or Anthropic's fields", m)
		}
	}
	if want := "[qwen3-4b claude-haiku-4-5 qwen3-coder claude-sonnet-4-5 claude-opus-4-1]"; fmt.Sprint(ids) != want || list.Object != "list" || list.HasMore == nil || *list.HasMore {
		t.Errorf("GET /v1/models lists %v (object %q, has_more %v), want %s", ids, list.Object, list.HasMore, want)
	}
	if status, _, body := get("/v1/models/claude-haiku-4-5"); status != http.StatusOK || !strings.Contains(string(body), `"id":"claude-haiku-4-5"`) {
		t.Errorf("GET /v1/models/claude-haiku-4-5: %d %s", status, body)
	}
	if status, _, body := get("/v1/models/gpt-5"); status != http.StatusNotFound || !strings.Contains(string(body), "not_found_error") {
		t.Errorf("GET /v1/models/gpt-5: %d %s, want 404 with an error body", status, body)
	}
	// Other paths reach the replicas: /health through the last route.
	if status, _, _ := get("/health"); status != http.StatusOK {
		t.Errorf("GET /health: %d", status)
	}
	// The conversation is pinned within each model: its small-model
	// requests on the small replica, the others all on one large replica.
	seen := sessionsSeen(append(large, small)...)
	if engines := seen["one-session"]; len(seen) != 1 || len(engines) != 2 || engines["small/"] != 3 {
		t.Errorf("the conversation's requests reached %v, want 3 on small/ and 4 on one large replica", seen)
	}
}

// Names two models share, and model lists or patterns that cannot work,
// fail at load with what is wrong.
func TestModelsConfigErrors(t *testing.T) {
	models := func(small string) string {
		return "{\n\twarden {\n\t\tmodel big {\n\t\t\taliases claude-sonnet-4-5\n\t\t\treplicas 127.0.0.1:1\n\t\t}\n\t\tmodel small {\n\t\t\t" +
			small + "\n\t\t\treplicas 127.0.0.1:2\n\t\t}\n\t}\n}\n"
	}
	site := func(directives string) string {
		return "\nhttp://127.0.0.1:" + fmt.Sprint(testnet.Port(t)) + " {\n" + directives + "\treverse_proxy {\n\t\tdynamic warden big\n\t\tlb_policy warden big\n\t}\n}\n"
	}
	for _, c := range []struct{ name, caddyfile, want string }{
		{"an alias of another model", models("aliases claude-sonnet-4-5"), `model "small": alias "claude-sonnet-4-5" is already a name of model "big"`},
		{"an alias that is a model's name", models("aliases big"), `alias "big" is already a name of model "big"`},
		{"an alias that is its own name", models("aliases small"), `alias "small": expected another name than the model's own`},
		{"aliases without a name", models("aliases"), "aliases: expected at least one name"},
		{"a bad pattern", models("") + site("\t@m warden_model qwen3-[4b\n\treverse_proxy @m 127.0.0.1:2\n"), `warden_model: pattern "qwen3-[4b": syntax error in pattern`},
		{"a matcher without a pattern", models("") + site("\t@m warden_model\n\treverse_proxy @m 127.0.0.1:2\n"), "warden_model: expected at least one model name or pattern"},
		{"an unknown model listed", models("") + site("\twarden_models big medium\n"), `warden_models: unknown model "medium"`},
	} {
		t.Run(c.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "Caddyfile")
			if err := os.WriteFile(path, []byte(c.caddyfile), 0o600); err != nil {
				t.Fatal(err)
			}
			home := t.TempDir()
			cmd := exec.Command(caddyBin, "validate", "--config", path, "--adapter", "caddyfile")
			cmd.Env = append(os.Environ(), "HOME="+home, "XDG_DATA_HOME="+home, "XDG_CONFIG_HOME="+home)
			out, err := cmd.CombinedOutput()
			msg := strings.ReplaceAll(string(out), `\"`, `"`)
			if err == nil || !strings.Contains(msg, c.want) {
				t.Errorf("validate: %v, want an error saying %q:\n%s", err, c.want, out)
			}
		})
	}
}

// count_tokens, which Claude Code sends without its hint headers when they are off, goes to
// the conversation's replica like its turns, but load control does not hold it as a turn (nor
// read its answer).
func TestCountTokensIsNoTurn(t *testing.T) {
	backends := []*fakeVLLM{startFakeVLLM(t, "a", 1), startFakeVLLM(t, "b", 1)}
	f := startFleetWith(t, caddySetup{
		modelBlock:     "replicas {replicas}\n\t\t\tload_control on",
		siteDirectives: "warden_stop_reason",
	}, backends...)
	home := f.turn(t, "conv")
	req, err := http.NewRequest(http.MethodPost, "http://"+f.site+"/v1/messages/count_tokens?beta=true",
		strings.NewReader(`{"model":"m","messages":[{"role":"user","content":"how long is this?"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("X-Claude-Code-Session-Id", "conv")
	for range 3 {
		resp, err := siteClient.Do(req.Clone(req.Context()))
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || resp.Header.Get("X-Backend") != strings.TrimSuffix(home, "/0")+"/api" {
			t.Errorf("count_tokens: %d from %s (%s), want the conversation's replica %s", resp.StatusCode, resp.Header.Get("X-Backend"), body, home)
		}
		req.Body = io.NopCloser(strings.NewReader(`{"model":"m","messages":[{"role":"user","content":"how long is this?"}]}`))
	}
	lc := f.status(t).LoadControl
	if lc.Admitted != 1 || lc.Replies.Read != 1 {
		t.Errorf("load control admitted %d requests and read %d replies; want the one turn's", lc.Admitted, lc.Replies.Read)
	}
}
