package caddymodule_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/lmwarden/caddy-warden/internal/testnet"
)

// startSim runs the vLLM simulator on a free loopback port until the test
// ends; its replies are 1 to 4 tokens long, cut at max_tokens when that is
// lower.
func startSim(t *testing.T) string {
	t.Helper()
	port := testnet.Port(t)
	ctx, cancel := context.WithCancel(context.Background())
	cmd := exec.CommandContext(ctx, vllmsimBinary(t), "--host", "127.0.0.1", "--port", strconv.Itoa(port),
		"--model", "m", "--time-scale", "20", "--output-len", "uniform:1:4")
	if err := cmd.Start(); err != nil {
		cancel()
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cancel()
		cmd.Wait()
	})
	addr := "127.0.0.1:" + strconv.Itoa(port)
	testnet.WaitListening(t, addr, 30*time.Second)
	return addr
}

// reply sends a turn of conv through Caddy and reads its reply to the end.
func reply(t *testing.T, f *fleet, path, conv, body string) string {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, "http://"+f.site+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Claude-Code-Session-Id", conv)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	out, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("%s: %s %v\n%s", conv, resp.Status, err, out)
	}
	return string(out)
}

// A reply that ends the agent's task (Anthropic's end_turn, OpenAI's
// finish_reason stop, a completed Responses reply without a call) frees its
// conversation's place in load control at once with warden_stop_reason in
// the site, streamed or not; a reply cut at max_tokens or calling a tool
// keeps it for linger, and so does every reply without the directive.
func TestTaskEndFreesResidencyThroughCaddy(t *testing.T) {
	sim := startSim(t)
	block := "replicas {replicas}\n\t\t\tload_control {\n\t\t\t\tlinger 1m\n\t\t\t}"
	anthropic := func(maxTokens int, stream bool) string {
		return fmt.Sprintf(`{"model":"m","max_tokens":%d,"stream":%t,"messages":[{"role":"user","content":"hello"}]}`, maxTokens, stream)
	}
	openai := `{"model":"m","max_tokens":100,"stream":true,"messages":[{"role":"user","content":"hello"}]}`
	const shell = `{"type":"function","name":"shell","parameters":{"type":"object","properties":{"command":{"type":"string"}},"required":["command"]}}`
	responses := func(choice string) string {
		return `{"model":"m","max_output_tokens":100,"stream":true,"input":"hello","tools":[` + shell + `],"tool_choice":"` + choice + `"}`
	}
	anthropicTool := `{"model":"m","max_tokens":100,"stream":true,"messages":[{"role":"user","content":"hello"}],` +
		`"tools":[{"name":"Bash","input_schema":{"type":"object","properties":{"command":{"type":"string"}},"required":["command"]}}],"tool_choice":{"type":"any"}}`
	residents := func(f *fleet) (int, uint64) {
		st := f.status(t)
		n := 0
		for _, r := range st.Replicas {
			n += r.Residents
		}
		return n, st.LoadControl.TaskEnded
	}

	t.Run("with warden_stop_reason", func(t *testing.T) {
		f, _ := runCaddy(t, caddySetup{modelBlock: block, siteDirectives: "warden_stop_reason"}, sim)
		steps := []struct {
			conv, path, body, says string
			residents              int
			ended                  uint64
		}{
			{"a", "/v1/messages", anthropic(100, false), `"stop_reason":"end_turn"`, 0, 1},
			{"b", "/v1/messages", anthropic(100, true), `"stop_reason":"end_turn"`, 0, 2},
			{"c", "/v1/chat/completions", openai, `"finish_reason":"stop"`, 0, 3},
			{"d", "/v1/responses", responses("none"), `"status":"completed"`, 0, 4},
			{"e", "/v1/messages", anthropic(1, true), `"stop_reason":"max_tokens"`, 1, 4},
			{"f", "/v1/messages", anthropicTool, `"stop_reason":"tool_use"`, 2, 4},
			{"g", "/v1/responses", responses("required"), `"type":"function_call"`, 3, 4},
		}
		for _, s := range steps {
			if out := reply(t, f, s.path, s.conv, s.body); !strings.Contains(out, s.says) {
				t.Fatalf("%s: the simulator's reply does not say %s:\n%s", s.conv, s.says, out)
			}
			if n, ended := residents(f); n != s.residents || ended != s.ended {
				t.Fatalf("after %s (%s): %d resident, %d tasks ended; want %d and %d", s.conv, s.says, n, ended, s.residents, s.ended)
			}
		}
	})

	t.Run("without it", func(t *testing.T) {
		f, _ := runCaddy(t, caddySetup{modelBlock: block}, sim)
		reply(t, f, "/v1/messages", "a", anthropic(100, true))
		if n, ended := residents(f); n != 1 || ended != 0 {
			t.Fatalf("%d resident, %d tasks ended; want 1 and 0", n, ended)
		}
	})
}
