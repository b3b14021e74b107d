package clienttest

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
)

// client is one coding-agent CLI: its npm package and command, how it is pointed at the
// fleet with telemetry, update checks and sign-in off, and its arguments for the first turn
// of a conversation and for a turn that continues the conversation of the current
// directory.
type client struct {
	name string // the test's name
	pkg  string // npm package (version from its package.json)
	bin  string // command in node_modules/.bin
	// setup writes the client's configuration under home and returns its environment
	// (besides PATH, HOME and the XDG directories, which run sets).
	setup func(f *fleet, home string) ([]string, error)
	first func(prompt string) []string
	next  func(prompt string) []string
	// keyed says whether the client sends a conversation id that warden's default keying
	// reads; a header-less client stays on one replica only through the fingerprint.
	keyed bool
}

// prompt is what the user types in a turn of a conversation. It asks for a text answer, so
// that the turn ends with the simulator's reply and no tool call. Two conversations differ
// from their first words, as two real tasks do: a client that sends no id can only be told
// apart by what it says.
func prompt(conversation string, turn int) string {
	return fmt.Sprintf("Task %s, step %d. Answer in one short sentence of plain text, without using any tool: what is %d plus %d?",
		conversation, turn, turn, turn)
}

const dummyKey = "sk-warden-clienttest-not-a-key"

var clients = []client{
	{
		name: "ClaudeCode", pkg: "@anthropic-ai/claude-code", bin: "claude", keyed: true,
		setup: func(f *fleet, home string) ([]string, error) {
			return []string{
				"ANTHROPIC_BASE_URL=" + f.url,
				"ANTHROPIC_API_KEY=" + dummyKey,
				"ANTHROPIC_MODEL=" + model,
				"ANTHROPIC_SMALL_FAST_MODEL=" + model,
				"ANTHROPIC_DEFAULT_HAIKU_MODEL=" + model,
				"ANTHROPIC_DEFAULT_SONNET_MODEL=" + model,
				"ANTHROPIC_DEFAULT_OPUS_MODEL=" + model,
				"CLAUDE_CODE_SUBAGENT_MODEL=" + model,
				"CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1",
				"DISABLE_TELEMETRY=1",
				"DISABLE_ERROR_REPORTING=1",
				"DISABLE_AUTOUPDATER=1",
				"DISABLE_BUG_COMMAND=1",
				"CLAUDE_CODE_GATEWAY_HINT_HEADERS=1", // records what the hints look like
				"CLAUDE_CODE_MAX_OUTPUT_TOKENS=4096",
			}, nil
		},
		first: func(p string) []string { return []string{"-p", p, "--model", model} },
		next:  func(p string) []string { return []string{"-p", p, "--model", model, "--continue"} },
	},
	{
		name: "Codex", pkg: "@openai/codex", bin: "codex", keyed: true,
		setup: func(f *fleet, home string) ([]string, error) {
			codexHome := filepath.Join(home, ".codex")
			config := fmt.Sprintf(`model = %q
model_provider = "warden"
approval_policy = "never"
sandbox_mode = "read-only"
check_for_update_on_startup = false

[model_providers.warden]
name = "warden"
base_url = "%s/v1"
wire_api = "responses"
env_key = "WARDEN_API_KEY"

[analytics]
enabled = false

[feedback]
enabled = false

[otel]
exporter = "none"
`, model, f.url)
			return []string{"CODEX_HOME=" + codexHome, "WARDEN_API_KEY=" + dummyKey},
				writeFile(filepath.Join(codexHome, "config.toml"), config)
		},
		first: func(p string) []string { return []string{"exec", "--skip-git-repo-check", p} },
		next:  func(p string) []string { return []string{"exec", "--skip-git-repo-check", "resume", "--last", p} },
	},
	{
		name: "OpenCode", pkg: "opencode-ai", bin: "opencode", keyed: true,
		setup: func(f *fleet, home string) ([]string, error) {
			config, err := json.MarshalIndent(map[string]any{
				"autoupdate":  false,
				"share":       "disabled",
				"model":       "warden/" + model,
				"small_model": "warden/" + model,
				"provider": map[string]any{"warden": map[string]any{
					"npm":     "@ai-sdk/openai-compatible",
					"name":    "warden",
					"options": map[string]any{"baseURL": f.url + "/v1", "apiKey": dummyKey},
					"models": map[string]any{model: map[string]any{
						"name": model, "limit": map[string]int{"context": 200_000, "output": 4096},
					}},
				}},
			}, "", "  ")
			if err != nil {
				return nil, err
			}
			return []string{
				"OPENCODE_DISABLE_AUTOUPDATE=1",
				"OPENCODE_DISABLE_MODELS_FETCH=1",
				"OPENCODE_DISABLE_DEFAULT_PLUGINS=1",
				"OPENCODE_DISABLE_LSP_DOWNLOAD=1",
				"OPENCODE_DISABLE_SHARE=1",
				"OPENCODE_DISABLE_CLAUDE_CODE=1",
			}, writeFile(filepath.Join(home, ".config", "opencode", "opencode.json"), string(config))
		},
		first: func(p string) []string { return []string{"run", "--model", "warden/" + model, p} },
		next:  func(p string) []string { return []string{"run", "--model", "warden/" + model, "--continue", p} },
	},
	{
		name: "QwenCode", pkg: "@qwen-code/qwen-code", bin: "qwen", keyed: false,
		setup: func(f *fleet, home string) ([]string, error) {
			settings := `{
  "security": {"auth": {"selectedType": "openai"}},
  "model": {"name": "` + model + `"},
  "telemetry": {"enabled": false},
  "privacy": {"usageStatisticsEnabled": false},
  "general": {"disableAutoUpdate": true, "disableUpdateNag": true}
}
`
			return []string{
				"OPENAI_BASE_URL=" + f.url + "/v1",
				"OPENAI_API_KEY=" + dummyKey,
				"OPENAI_MODEL=" + model,
			}, writeFile(filepath.Join(home, ".qwen", "settings.json"), settings)
		},
		first: func(p string) []string { return []string{"--auth-type", "openai", "--model", model, p} },
		next:  func(p string) []string { return []string{"--auth-type", "openai", "--model", model, "--continue", p} },
	},
}

func writeFile(path, content string) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	return os.WriteFile(path, []byte(content), 0o600)
}
