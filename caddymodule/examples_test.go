package caddymodule_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/lmwarden/caddy-warden/internal/testnet"
)

func TestListModules(t *testing.T) {
	out, err := exec.Command(caddyBin, "list-modules").CombinedOutput()
	if err != nil {
		t.Fatalf("list-modules: %v\n%s", err, out)
	}
	for _, id := range []string{"warden", "http.reverse_proxy.selection_policies.warden", "admin.api.warden", "http.handlers.warden_stop_reason",
		"http.matchers.warden_model", "http.handlers.warden_models"} {
		if !strings.Contains("\n"+string(out), "\n"+id+"\n") {
			t.Errorf("list-modules does not show %s", id)
		}
	}
}

// Every Caddyfile a user may copy, the examples and the caddyfile blocks of
// the README and docs/, is formatted as `caddy fmt` writes it and is one
// Caddy accepts (validate provisions every module, as run would, without
// binding ports).
func TestEveryCaddyfileFormattedAndValid(t *testing.T) {
	files, _ := filepath.Glob("../examples/Caddyfile*")
	if len(files) == 0 {
		t.Fatal("no example Caddyfiles")
	}
	caddyfiles := map[string]string{}
	for _, f := range files {
		text, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		caddyfiles[strings.TrimPrefix(f, "../")] = string(text)
	}
	docs, _ := filepath.Glob("../docs/*.md")
	for _, doc := range append(docs, "../README.md") {
		text, err := os.ReadFile(doc)
		if err != nil {
			t.Fatal(err)
		}
		for i, block := range fencedBlocks(string(text), "caddyfile") {
			caddyfiles[fmt.Sprintf("%s, caddyfile block %d", strings.TrimPrefix(doc, "../"), i+1)] = block
		}
	}
	for name, text := range caddyfiles {
		t.Run(name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "Caddyfile")
			if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
				t.Fatal(err)
			}
			formatted, err := exec.Command(caddyBin, "fmt", path).Output()
			if err != nil {
				t.Fatalf("caddy fmt: %v", err)
			}
			if string(formatted) != text {
				t.Errorf("not as caddy fmt writes it:\n%s", formatted)
			}
			validate(t, path, "--adapter", "caddyfile")
		})
	}
}

// The README's JSON is what `caddy adapt` makes of its Caddyfile (the
// quick start's, examples/Caddyfile).
func TestReadmeJSONIsTheAdaptedCaddyfile(t *testing.T) {
	readme, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	caddyfiles, jsons := fencedBlocks(string(readme), "caddyfile"), fencedBlocks(string(readme), "json")
	if len(caddyfiles) == 0 || len(jsons) != 1 {
		t.Fatalf("README has %d caddyfile and %d json blocks, want the quick start's pair", len(caddyfiles), len(jsons))
	}
	example, err := os.ReadFile("../examples/Caddyfile")
	if err != nil {
		t.Fatal(err)
	}
	if caddyfiles[0] != string(example) {
		t.Errorf("the README's first Caddyfile is not examples/Caddyfile:\n%s", caddyfiles[0])
	}
	adapted, err := exec.Command(caddyBin, "adapt", "--config", "../examples/Caddyfile").Output()
	if err != nil {
		t.Fatalf("adapt: %v", err)
	}
	var want, got any
	if err := json.Unmarshal(adapted, &want); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal([]byte(jsons[0]), &got); err != nil {
		t.Fatalf("the README's JSON: %v", err)
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("the README's JSON is not what caddy adapt writes:\n%s", adapted)
	}
}

// fencedBlocks are the contents of the text's ```lang blocks.
func fencedBlocks(text, lang string) []string {
	var out []string
	for rest := text; ; {
		_, after, ok := strings.Cut(rest, "```"+lang+"\n")
		if !ok {
			return out
		}
		block, tail, _ := strings.Cut(after, "```")
		out = append(out, block)
		rest = tail
	}
}

// Malformed options fail at load with the line and what was expected.
func TestCaddyfileErrors(t *testing.T) {
	cases := []struct{ block, want string }{
		{"replicas", "replicas needs at least one host:port"},
		{"replicas 127.0.0.1:1\n\t\tspill_threshold lots", `spill_threshold: expected auto or a positive integer, got "lots"`},
		{"replicas 127.0.0.1:1\n\t\taffinity maybe", `affinity: expected on or off, got "maybe"`},
		{"replicas 127.0.0.1:1\n\t\tmax_num_seqs 0", "max_num_seqs: expected a positive integer"},
		{"server 127.0.0.1:1 ranks x", `ranks: expected an integer from 1 to 256, got "x"`},
		{"server 127.0.0.1:1", "expected: server <host:port> ranks <n>"},
		{"replicas localhost", "want host:port"},
		{"replicas 127.0.0.1:1\n\t\tsession_ttl 1h", `session_ttl is no longer a Caddyfile option: set "session_ttl" in the model's JSON`},
		{"replicas 127.0.0.1:1\n\t\tbogus 1", `unrecognized model option "bogus"`},
		{"max_num_seqs 32", "needs replicas or a server"},
		{"replicas 127.0.0.1:1\n\t\trule seed", "rule was removed"},
		{"replica {\n\t\t\tprocess\n\t\t}", "process: expected a command"},
		{"replica {\n\t\t\tenv ONLY_NAME\n\t\t}", "env: expected a name and a value"},
		{"replica {\n\t\t\tprocess vllm serve m\n\t\t}", "give the replica an address or the command a --port"},
		{"replica 127.0.0.1:1 {\n\t\t\tdir /tmp\n\t\t}", "the block needs a process line"},
		{"replica {\n\t\t\tprocess vllm serve m --port x\n\t\t}", "--port"},
		{"replicas 127.0.0.1:1\n\t\tload_control on {\n\t\t\tfill 0.9\n\t\t}", "fill is a JSON field of load_control, not a Caddyfile option"},
		{"replicas 127.0.0.1:1\n\t\tload_control on {\n\t\t\tflow_header \"X Team\"\n\t\t}", `flow_header: "X Team" is not a header name`},
		{"replicas 127.0.0.1:1\n\t\tload_control yes", `load_control: expected off, on or farm, got "yes"`},
	}
	for _, c := range cases {
		caddyfile := "{\n\twarden {\n\t\tmodel m {\n\t\t" + c.block + "\n\t\t}\n\t}\n}\n"
		path := filepath.Join(t.TempDir(), "Caddyfile")
		if err := os.WriteFile(path, []byte(caddyfile), 0o600); err != nil {
			t.Fatal(err)
		}
		out, err := exec.Command(caddyBin, "adapt", "--config", path).CombinedOutput()
		if err == nil {
			t.Errorf("%q: adapted without error", c.block)
			continue
		}
		msg := strings.ReplaceAll(string(out), `\"`, `"`) // the log line is JSON
		if !strings.Contains(msg, c.want) || !strings.Contains(msg, "Caddyfile:") {
			t.Errorf("%q: error does not say %q with a file:line:\n%s", c.block, c.want, out)
		}
	}
}

// validate runs `caddy validate` on a config file: it provisions every
// module, as run would, without binding ports.
func validate(t *testing.T, path string, args ...string) {
	t.Helper()
	home := t.TempDir()
	cmd := exec.Command(caddyBin, append([]string{"validate", "--config", path}, args...)...)
	cmd.Env = append(os.Environ(), "HOME="+home, "XDG_DATA_HOME="+home, "XDG_CONFIG_HOME="+home)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("validate: %v\n%s", err, out)
	}
}

// Load control and KV cache events read the replies through
// warden_stop_reason: `caddy validate` and `caddy run` refuse a config
// whose lb_policy warden routes such a model without the handler before
// it, and say what to add.
func TestRepliesReaderRequired(t *testing.T) {
	const fix = "add the warden_stop_reason directive to the site, before reverse_proxy"
	site := func(model, handlers string) string {
		return "{\n\tadmin off\n\twarden {\n\t\t" + model + "\n\t}\n}\n\nhttp://127.0.0.1:" + strconv.Itoa(testnet.Port(t)) + " {\n" + handlers + "}\n"
	}
	const proxy = "\treverse_proxy {\n\t\tdynamic warden m\n\t\tlb_policy warden m\n\t}\n"
	for _, c := range []struct {
		name, caddyfile, want string
	}{
		{"load control without it", site("model m {\n\t\t\treplicas 127.0.0.1:1\n\t\t\tload_control on\n\t\t}", proxy),
			`lb_policy warden m: model "m" has load_control on, which reads the replies: ` + fix},
		{"the farm preset without it", site("model m {\n\t\t\treplicas 127.0.0.1:1\n\t\t\tload_control farm\n\t\t}", proxy), fix},
		{"KV cache events without it", site("model m {\n\t\t\treplica 127.0.0.1:1 {\n\t\t\t\tkv_events tcp://127.0.0.1:5557\n\t\t\t}\n\t\t}", proxy),
			`model "m" has kv_events, which reads the replies: ` + fix},
		{"placed after reverse_proxy", site("model m {\n\t\t\treplicas 127.0.0.1:1\n\t\t\tload_control on\n\t\t}",
			"\troute {\n\t"+strings.ReplaceAll(proxy, "\n\t", "\n\t\t")+"\t\twarden_stop_reason\n\t}\n"), fix},
		{"load control with it", site("model m {\n\t\t\treplicas 127.0.0.1:1\n\t\t\tload_control farm\n\t\t}", "\twarden_stop_reason\n"+proxy), ""},
		{"neither", site("model m {\n\t\t\treplicas 127.0.0.1:1\n\t\t\tload_control off\n\t\t}", proxy), ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "Caddyfile")
			if err := os.WriteFile(path, []byte(c.caddyfile), 0o600); err != nil {
				t.Fatal(err)
			}
			for _, verb := range []string{"validate", "run"} {
				if verb == "run" && c.want == "" {
					continue // it would run
				}
				home := t.TempDir()
				ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
				cmd := exec.CommandContext(ctx, caddyBin, verb, "--config", path, "--adapter", "caddyfile")
				cmd.Env = append(os.Environ(), "HOME="+home, "XDG_DATA_HOME="+home, "XDG_CONFIG_HOME="+home)
				out, err := cmd.CombinedOutput()
				cancel()
				msg := strings.ReplaceAll(string(out), `\"`, `"`)
				switch {
				case c.want == "" && err != nil:
					t.Errorf("caddy %s: %v\n%s", verb, err, out)
				case c.want != "" && (err == nil || !strings.Contains(msg, c.want)):
					t.Errorf("caddy %s: error %v, output does not say %q:\n%s", verb, err, c.want, out)
				}
			}
		})
	}
}
