package paneltest

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/crypto/bcrypt"

	"github.com/lmwarden/caddy-warden/bench/vllmsim/server"
	"github.com/lmwarden/caddy-warden/internal/caddyproc"
	"github.com/lmwarden/caddy-warden/internal/redisproc"
	"github.com/lmwarden/caddy-warden/internal/testnet"
	"github.com/lmwarden/caddy-warden/internal/testrun"
	"github.com/lmwarden/caddy-warden/panel"
)

// The simulated replicas. Each engine has 100,000 KV blocks (40 times the
// a4000 profile's) so that its KV use grows by at most 0.005% a second while
// the test holds requests open: the page, up to one refresh behind the admin
// JSON, still shows the same value to one decimal.
const (
	replicas     = 3
	maxNumSeqs   = 128
	numGPUBlocks = 100_000
	// holdTokens keeps a request decoding for minutes (about 40 tokens a
	// second at time scale 1), past the end of the test.
	holdTokens = 16_000
)

// fleet is Caddy, built from the root module's cmd/caddy and run as a
// process, in front of simulated vLLM servers run in the test, with the
// panel on a site of its own behind basic_auth.
type fleet struct {
	caddy *caddyproc.Process
	site  string // the proxied API
	panel panelSite
}

// panelSite is the panel mounted on a site of its own behind basic_auth.
type panelSite struct {
	url           string
	authorization string // the Authorization header that passes basic_auth
}

func startFleet(t *testing.T) *fleet {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	caddyBin := filepath.Join(t.TempDir(), "caddy")
	if err := caddyproc.Build(ctx, "./cmd/caddy", caddyBin); err != nil {
		t.Fatal(err)
	}

	var addrs []string
	for i := range replicas {
		cfg := server.DefaultConfig()
		cfg.ID = string(rune('a' + i))
		cfg.Model = "m"
		cfg.Profile.MaxNumSeqs = maxNumSeqs
		cfg.Profile.NumGPUBlocks = numGPUBlocks
		sim, err := server.New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		if err := sim.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = sim.Close() })
		addrs = append(addrs, sim.Addr())
	}

	const user, password = "operator", "panel-test-password"
	hash, err := bcrypt.GenerateFromPassword([]byte(password), bcrypt.MinCost)
	if err != nil {
		t.Fatal(err)
	}
	// The pins are shared through Redis, so that the panel shows the store;
	// load control is on, so that it shows the queue, the residents (the
	// caches are large: no turn waits) and what the replies report.
	redis := redisproc.StartTest(t)
	ports := testnet.Addrs(t, 3)
	admin, site, panelAddr := ports[0], ports[1], ports[2]
	caddyfile := fmt.Sprintf(`{
	admin %[1]s
	default_bind 127.0.0.1
	warden {
		pin_store redis {
			address %[8]s
		}
		model m {
			replicas %[2]s
			max_num_seqs %[3]d
			load_control on
		}
	}
}
http://%[4]s {
	warden_stop_reason
	reverse_proxy %[2]s {
		lb_policy warden m
		flush_interval -1
	}
}
http://%[5]s {
	route /warden/* {
		basic_auth {
			%[6]s %[7]s
		}
		warden_panel
	}
}
`, admin, strings.Join(addrs, " "), maxNumSeqs, site, panelAddr, user, hash, redis.Addr)

	var logs strings.Builder
	var logMu sync.Mutex
	config, err := caddyproc.Adapt(caddyBin, caddyfile, map[string]map[string]any{"m": {"metrics_interval": "100ms"}})
	if err != nil {
		t.Fatal(err)
	}
	p, err := caddyproc.Start(caddyBin, config, admin, writerFunc(func(b []byte) (int, error) {
		logMu.Lock()
		defer logMu.Unlock()
		return logs.Write(b)
	}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		p.Stop()
		if t.Failed() {
			logMu.Lock()
			t.Logf("caddy log:\n%s", logs.String())
			logMu.Unlock()
		}
	})
	f := &fleet{caddy: p, site: site, panel: panelSite{
		url:           "http://" + panelAddr + "/warden/",
		authorization: "Basic " + base64.StdEncoding.EncodeToString([]byte(user+":"+password)),
	}}
	testrun.Eventually(t, 10*time.Second, "every replica healthy", func() bool {
		st := f.status(t)
		for _, r := range st.Replicas {
			if !r.Healthy || !r.MetricsKnown {
				return false
			}
		}
		return len(st.Replicas) == replicas
	})
	testrun.Eventually(t, 10*time.Second, "the panel site answering", func() bool {
		resp, err := http.Get(f.panel.url)
		if err != nil {
			return false
		}
		resp.Body.Close()
		return true
	})
	return f
}

type writerFunc func([]byte) (int, error)

func (w writerFunc) Write(b []byte) (int, error) { return w(b) }

// status is the model's admin JSON.
func (f *fleet) status(t *testing.T) panel.ModelStatus {
	t.Helper()
	var st panel.ModelStatus
	if err := f.caddy.Do(http.MethodGet, "/warden/models/m", nil, &st); err != nil {
		t.Fatal(err)
	}
	return st
}

// systemPrompt is shared by every conversation, as an agent's is: about
// 450 tokens of the simulator's tokenizer (4 bytes each), 28 full KV blocks.
var systemPrompt = strings.Repeat("You are a careful coding agent. Read the files before editing them. ", 26)

// prompt is a conversation's request: the shared system prompt and a first
// message of its own (derived from the session ID, which it does not show).
// Every turn sends the same prompt, so from the second turn on the replica
// serves its full blocks from the prefix cache.
func prompt(session string, maxTokens int) string {
	sum := sha256.Sum256([]byte(session))
	body, err := json.Marshal(map[string]any{
		"model":      "m",
		"max_tokens": maxTokens,
		"stream":     true,
		"system":     systemPrompt,
		"messages": []map[string]string{
			{"role": "user", "content": strings.Repeat("Task "+hex.EncodeToString(sum[:])+". ", 6)},
		},
	})
	if err != nil {
		panic(err)
	}
	return string(body)
}

// turn sends one streaming request of a conversation, generating maxTokens
// tokens (25 ms each), and reads it to the end; it returns the engine that
// served it.
func (f *fleet) turn(t *testing.T, session string, maxTokens int) string {
	t.Helper()
	resp, err := f.send(context.Background(), session, maxTokens)
	if err != nil {
		t.Error(err)
		return ""
	}
	defer resp.Body.Close()
	if _, err := io.Copy(io.Discard, resp.Body); err != nil {
		t.Error(err)
	}
	if resp.StatusCode != http.StatusOK {
		t.Errorf("session %s: status %s", session, resp.Status)
	}
	return resp.Header.Get(server.EngineHeader)
}

// apiKeyPrefix starts the API keys of the test's two people, which neither
// the panel nor its JSON may show.
const apiKeyPrefix = "panel-key-"

func (f *fleet) send(ctx context.Context, session string, maxTokens int) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+f.site+"/v1/messages?beta=true",
		strings.NewReader(prompt(session, maxTokens)))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Claude-Code-Session-Id", session)
	// Two people, so that the panel shows load control's flows.
	req.Header.Set("X-Api-Key", fmt.Sprint(apiKeyPrefix, session[len(session)-1]%2))
	return http.DefaultClient.Do(req)
}

// holdRequests keeps one request of each conversation in flight until the
// test ends.
func (f *fleet) holdRequests(t *testing.T, sessions []string) {
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	t.Cleanup(func() {
		cancel()
		wg.Wait()
	})
	for _, s := range sessions {
		wg.Go(func() {
			resp, err := f.send(ctx, s, holdTokens)
			if err == nil {
				_, _ = io.Copy(io.Discard, resp.Body) // until cancelled
				resp.Body.Close()
			}
		})
	}
}
