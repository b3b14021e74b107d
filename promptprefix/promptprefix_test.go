package promptprefix

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/cespare/xxhash/v2"
)

// part is a prefix part as the body has it (raw) and what names it.
type part struct{ name, raw string }

// raw is a part named by its raw JSON: a system block, a tool.
func raw(s string) part { return part{s, s} }

// msg is a message part, named by its role and content only.
func msg(s string) part {
	var m struct {
		Role    string          `json:"role"`
		Content json.RawMessage `json:"content"`
	}
	if err := json.Unmarshal([]byte(s), &m); err != nil {
		panic(err)
	}
	return part{m.Role + "\x00" + string(m.Content), s}
}

// want is the Prefix of these parts, hashed here from the concatenated
// bytes rather than streamed as Read does.
func want(parts ...part) Prefix {
	var p Prefix
	var hash uint64
	size := 0
	for _, pt := range parts {
		hash = xxhash.Sum64(append(binary.LittleEndian.AppendUint64(nil, hash), pt.name...))
		size += len(pt.raw)
		p = append(p, Part{Hash: hash, Bytes: size})
	}
	return p
}

func init() {
	// want's own check, so that it is not Read's algorithm twice over.
	b := binary.LittleEndian.AppendUint64(nil, 0)
	if want(raw(`"x"`))[0].Hash != xxhash.Sum64(append(b, `"x"`...)) {
		panic("want does not chain from 0")
	}
}

func check(t *testing.T, name string, body string, expected Prefix) {
	t.Helper()
	if got := Read([]byte(body)); !slices.Equal(got, expected) {
		t.Errorf("%s: got %v, want %v", name, got, expected)
	}
}

// Claude Code's request: messages first, then system in two text blocks
// (the second marked for caching), tools, metadata.
const (
	ccSystemIdentity = `{"type":"text","text":"You are Claude Code, Anthropic's official CLI for Claude."}`
	ccSystemMain     = `{"type":"text","text":"\nYou are an interactive CLI tool that helps users with software engineering tasks.\n\n# Tone and style\nBe concise.","cache_control":{"type":"ephemeral"}}`
	ccToolBash       = `{"name":"Bash","description":"Executes a given bash command in a persistent shell session.","input_schema":{"type":"object","properties":{"command":{"type":"string","description":"The command to execute"},"timeout":{"type":"number"}},"required":["command"],"additionalProperties":false,"$schema":"http://json-schema.org/draft-07/schema#"}}`
	ccToolRead       = `{"name":"Read","description":"Reads a file from the local filesystem.","input_schema":{"type":"object","properties":{"file_path":{"type":"string"}},"required":["file_path"],"additionalProperties":false,"$schema":"http://json-schema.org/draft-07/schema#"}}`
	ccToolEdit       = `{"name":"Edit","description":"Performs exact string replacements in files.","input_schema":{"type":"object","properties":{"file_path":{"type":"string"},"old_string":{"type":"string"},"new_string":{"type":"string"}},"required":["file_path","old_string","new_string"]}}`
	ccMessages       = `[{"role":"user","content":[{"type":"text","text":"<system-reminder>\nAs you answer the user's questions, you can use the following context.\n</system-reminder>"},{"type":"text","text":"Fix the failing test in parser_test.go","cache_control":{"type":"ephemeral"}}]},{"role":"assistant","content":[{"type":"tool_use","id":"toolu_01","name":"Bash","input":{"command":"go test ./..."}}]},{"role":"user","content":[{"type":"tool_result","tool_use_id":"toolu_01","content":"FAIL"}]}]`
	ccMetadata       = `{"user_id":"{\"device_id\":\"d\",\"account_uuid\":\"a\",\"session_id\":\"5f0c8e3a\"}"}`
)

func claudeCodeBody(tools ...string) string {
	return `{"model":"claude-sonnet-4-5","messages":` + ccMessages +
		`,"temperature":1,"system":[` + ccSystemIdentity + `,` + ccSystemMain +
		`],"tools":[` + strings.Join(tools, ",") +
		`],"metadata":` + ccMetadata + `,"max_tokens":32000,"stream":true}`
}

// OpenCode-like Chat Completions request: two system messages, the
// conversation, a late system message that is not part of the prefix.
const (
	chatSystem  = `{"role":"system","content":"You are opencode, an interactive CLI agent."}`
	chatEnv     = `{"role":"developer","content":"<env>\n  Working directory: /src\n</env>"}`
	chatTool    = `{"type":"function","function":{"name":"read","description":"Read a file","parameters":{"type":"object","properties":{"filePath":{"type":"string"}},"required":["filePath"]}}}`
	chatToolTwo = `{"type":"function","function":{"name":"bash","parameters":{"type":"object","properties":{"command":{"type":"string"}}}}}`
	chatBody    = `{"model":"qwen3-coder","messages":[` + chatSystem + `,` + chatEnv +
		`,{"role":"user","content":"list the files"},{"role":"assistant","content":null,"tool_calls":[{"id":"call_1","type":"function","function":{"name":"bash","arguments":"{\"command\":\"ls\"}"}}]},{"role":"tool","tool_call_id":"call_1","content":"a.go"},{"role":"system","content":"late reminder"}],"tools":[` +
		chatTool + `,` + chatToolTwo + `],"tool_choice":"auto","stream":true,"stream_options":{"include_usage":true}}`
)

// Codex-like Responses request: instructions, a developer input item, the
// user's prompt, tools.
const (
	codexInstructions = `"You are Codex, based on GPT-5. You are running as a coding agent in the Codex CLI."`
	codexDeveloper    = `{"type":"message","role":"developer","content":[{"type":"input_text","text":"<permissions instructions>workspace-write</permissions instructions>"}]}`
	codexShell        = `{"type":"function","name":"shell","description":"Runs a shell command","strict":false,"parameters":{"type":"object","properties":{"command":{"type":"array","items":{"type":"string"}}},"required":["command"]}}`
	codexPatch        = `{"type":"custom","name":"apply_patch","description":"Edit files with a patch"}`
	codexBody         = `{"model":"gpt-5-codex","instructions":` + codexInstructions + `,"input":[` + codexDeveloper +
		`,{"type":"message","role":"user","content":[{"type":"input_text","text":"fix the build"}]},{"type":"reasoning","summary":[]},{"type":"function_call","name":"shell","arguments":"{}","call_id":"c1"}],"tools":[` +
		codexShell + `,` + codexPatch + `],"tool_choice":"auto","parallel_tool_calls":false,"reasoning":{"effort":"medium"},"store":false,"stream":true,"include":[],"prompt_cache_key":"019a-thread"}`
)

func TestReadClaudeCode(t *testing.T) {
	check(t, "claude code", claudeCodeBody(ccToolBash, ccToolRead),
		want(raw(ccSystemIdentity), raw(ccSystemMain), raw(ccToolBash), raw(ccToolRead)))
	check(t, "system string", `{"messages":[{"role":"user","content":"hi"}],"system":"Be brief.","max_tokens":10}`,
		want(raw(`"Be brief."`)))
}

func TestReadChatCompletions(t *testing.T) {
	// The late system message is the conversation's, after the first user one.
	check(t, "chat", chatBody, want(msg(chatSystem), msg(chatEnv), raw(chatTool), raw(chatToolTwo)))
	check(t, "no leading system", `{"messages":[{"role":"user","content":"hi"},{"role":"system","content":"late"}],"tools":[`+chatTool+`]}`,
		want(raw(chatTool)))
	check(t, "item without a role ends the run", `{"messages":[`+chatSystem+`,"odd",`+chatEnv+`]}`,
		want(msg(chatSystem)))
	check(t, "role of another type ends the run", `{"messages":[`+chatSystem+`,{"role":7},`+chatEnv+`]}`,
		want(msg(chatSystem)))
}

func TestReadResponses(t *testing.T) {
	check(t, "codex", codexBody, want(raw(codexInstructions), msg(codexDeveloper), raw(codexShell), raw(codexPatch)))
	check(t, "string input", `{"model":"m","input":"what time is it?","instructions":`+codexInstructions+`,"tools":[`+codexShell+`]}`,
		want(raw(codexInstructions), raw(codexShell)))
	check(t, "system input item", `{"input":[{"role":"system","content":"s"},{"role":"user","content":"u"}]}`,
		want(msg(`{"role":"system","content":"s"}`)))
	// Codex names each input item: two conversations' developer messages
	// differ in their ids only, which the template does not render.
	first := Read([]byte(`{"input":[{"type":"message","id":"msg_1","role":"developer","content":"d"},{"role":"user","content":"u"}]}`))
	second := Read([]byte(`{"input":[{"type":"message","id":"msg_2","role":"developer","content":"d"},{"role":"user","content":"v"}]}`))
	if len(first) != 1 || !slices.Equal(first, second) {
		t.Errorf("developer items differing in their ids: %v and %v, want one equal part", first, second)
	}
}

// Several system sources are taken in a fixed order, whatever the body's.
func TestReadSourceOrder(t *testing.T) {
	check(t, "all sources", `{"tools":[{"t":1}],"messages":[{"role":"system","n":4}],"input":[{"role":"developer","n":3}],"instructions":"2","system":"1"}`,
		want(raw(`"1"`), raw(`"2"`), msg(`{"role":"developer","n":3}`), msg(`{"role":"system","n":4}`), raw(`{"t":1}`)))
	check(t, "last of a repeated key", `{"system":"a","system":[{"b":1},{"c":1}]}`, want(raw(`{"b":1}`), raw(`{"c":1}`)))
	check(t, "null is absent", `{"system":null,"instructions":null,"input":null,"messages":null,"tools":null}`, nil)
	check(t, "null beside parts", `{"system":null,"instructions":"i","input":null,"messages":null,"tools":[{"t":2}]}`, want(raw(`"i"`), raw(`{"t":2}`)))
	check(t, "null tools", `{"system":"s","tools":null}`, want(raw(`"s"`)))
	check(t, "empty arrays", `{"system":[],"messages":[],"input":[],"tools":[]}`, nil)
}

func TestReadKeyOrder(t *testing.T) {
	reordered := `{"system":[` + ccSystemIdentity + `,` + ccSystemMain + `],"metadata":` + ccMetadata +
		`,"tools":[` + ccToolBash + `,` + ccToolRead + `],"model":"claude-sonnet-4-5","messages":` + ccMessages + `}`
	// Whitespace between parts is no part's.
	spaced := "{\n  \"tools\" : [\n    " + ccToolBash + " ,\n\t" + ccToolRead + "\n  ],\n  \"system\":\r\n[ " +
		ccSystemIdentity + "\n, " + ccSystemMain + " ] ,\"messages\":" + ccMessages + "\n}\n"
	base := Read([]byte(claudeCodeBody(ccToolBash, ccToolRead)))
	if len(base) != 4 {
		t.Fatalf("claude code body: %d parts, want 4", len(base))
	}
	check(t, "reordered", reordered, base)
	check(t, "spaced", spaced, base)

	chatFirst := `{"tools":[` + chatTool + `,` + chatToolTwo + `],"stream":true,"messages":[` + chatSystem + `,` + chatEnv + `,{"role":"user","content":"other"}]}`
	check(t, "chat reordered", chatFirst, Read([]byte(chatBody)))
}

func TestReadSharedParts(t *testing.T) {
	a := Read([]byte(claudeCodeBody(ccToolBash, ccToolRead)))
	b := Read([]byte(claudeCodeBody(ccToolBash, ccToolEdit)))
	if len(a) != 4 || len(b) != 4 {
		t.Fatalf("got %d and %d parts, want 4 each", len(a), len(b))
	}
	for i := range 3 {
		if a[i] != b[i] {
			t.Errorf("part %d differs: %v and %v", i, a[i], b[i])
		}
	}
	if a[3].Hash == b[3].Hash {
		t.Errorf("part 3: the same hash %x for different tools", a[3].Hash)
	}
	shared := len(ccSystemIdentity) + len(ccSystemMain) + len(ccToolBash)
	if a[2].Bytes != shared || a[3].Bytes != shared+len(ccToolRead) || b[3].Bytes != shared+len(ccToolEdit) {
		t.Errorf("bytes: %v and %v, want %d shared", a, b, shared)
	}
	// A later difference leaves the earlier parts alone; an earlier one
	// changes every hash after it.
	c := Read([]byte(strings.Replace(claudeCodeBody(ccToolBash, ccToolRead), "Be concise.", "Be terse.", 1)))
	if len(c) != 4 || c[0] != a[0] {
		t.Fatalf("changed system block 1: %v, want part 0 %v", c, a[0])
	}
	for i := 1; i < 4; i++ {
		if c[i].Hash == a[i].Hash {
			t.Errorf("part %d: hash unchanged after part 1 changed", i)
		}
	}
}

// Claude Code's billing header block carries a hash of its own per
// request; vLLM drops it before the template, and so does Read: two
// conversations still share their system prompt and tools.
func TestReadSkipsClaudeCodesBillingHeader(t *testing.T) {
	withHeader := func(cch string) string {
		block := `{"type":"text","text":"x-anthropic-billing-header: cc_version=2.1.332; cc_entrypoint=cli; cch=` + cch + `;"}`
		return strings.Replace(claudeCodeBody(ccToolBash), `"system":[`, `"system":[`+block+`,`, 1)
	}
	a, b := Read([]byte(withHeader("3f1a9"))), Read([]byte(withHeader("c07e2")))
	plain := Read([]byte(claudeCodeBody(ccToolBash)))
	if len(a) != 3 || !reflect.DeepEqual(a, b) || !reflect.DeepEqual(a, plain) {
		t.Errorf("with billing headers of two hashes: %v and %v; want the parts without it, %v", a, b, plain)
	}
}

func TestReadBadInput(t *testing.T) {
	for _, body := range []string{
		``,
		`   `,
		`null`,
		`42`,
		`"system"`,
		`[{"system":"s"}]`,
		"\x00\xff\xfe garbage",
		`{`,
		`{"system":"s"`,
		`{"system":"s",`,
		`{"system":"s","tools":[{"name":"a"},`,
		`{"system":"s"} trailing`,
		`{"system":"s"}{"system":"t"}`,
		`{"system":42,"tools":[{"name":"a"}]}`,
		`{"system":{"text":"s"}}`,
		`{"tools":{"name":"a"}}`,
		`{"tools":"a"}`,
		`{"instructions":["a"]}`,
		`{"messages":"hi","system":"s"}`,
		`{"messages":{"role":"system"}}`,
		`{"input":42}`,
		`{"system":nope}`,
		`{"system"::"s"}`,
		`{"system":"s",,"tools":[]}`,
		`{"tools":[1,,2]}`,
		`{"tools":[1]}`,
		`{"system":["s"]}`,
		`{"tools":[{"name":"a"},"b"]}`,
		`{}`,
		`{"model":"m","messages":[{"role":"user","content":"hi"}]}`,
	} {
		check(t, fmt.Sprintf("%q", body), body, nil)
	}
	// A hostile body of more tools than any agent declares reads as
	// nothing; a run of leading system messages ends at maxParts.
	many := `{"tools":[` + strings.Repeat(`{"name":"t"},`, maxParts) + `{"name":"t"}]}`
	check(t, "more tools than maxParts", many, nil)
	system := `{"role":"system","content":"s"}`
	messages := Read([]byte(`{"messages":[` + strings.Repeat(system+",", maxParts) + system + `]}`))
	if len(messages) != maxParts {
		t.Errorf("%d leading system messages read of %d, want maxParts, %d", len(messages), maxParts+1, maxParts)
	}
	// Truncated anywhere, each body is invalid and reads as nothing.
	for _, body := range []string{claudeCodeBody(ccToolBash, ccToolRead), chatBody, codexBody} {
		for n := range len(body) {
			if got := Read([]byte(body[:n])); got != nil {
				t.Fatalf("cut at %d of %q: got %v, want nil", n, body, got)
			}
		}
	}
}

// FuzzRead feeds arbitrary bytes: Read must not panic; parts take a
// growing share of the body, no more than all of it; and only a valid JSON
// document has any.
func FuzzRead(f *testing.F) {
	for _, seed := range []string{
		claudeCodeBody(ccToolBash, ccToolRead), chatBody, codexBody,
		`{"tools":[1],"messages":[{"role":"system","n":4}],"input":[{"role":"developer","n":3}],"instructions":"2","system":"1"}`,
		`{"system":"a","system":["b","c"]}`,
		`{"messages":[{"role":"system"},{"role":7},{"role":"system"}]}`,
		`{"input":"hi","system":null}`,
		`{"system":"s"} trailing`,
		`{"system"::"s"}`,
		``,
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		prefix := Read(body)
		if prefix != nil && !json.Valid(body) {
			t.Fatalf("%d parts from invalid JSON", len(prefix))
		}
		previous := 0
		for i, part := range prefix {
			if part.Bytes <= previous || part.Bytes > len(body) {
				t.Fatalf("part %d: %d bytes after %d, body of %d", i, part.Bytes, previous, len(body))
			}
			previous = part.Bytes
		}
	})
}

// BenchmarkRead reads a Claude Code body some 100 KB long, most of it the
// conversation before system and tools.
func BenchmarkRead(b *testing.B) {
	var messages []map[string]any
	for i := 0; len(messages) < 2 || i < 170; i++ {
		messages = append(messages,
			map[string]any{"role": "user", "content": []any{map[string]any{"type": "text", "text": strings.Repeat(fmt.Sprintf("turn %d asks about the parser. ", i), 12)}}},
			map[string]any{"role": "assistant", "content": []any{map[string]any{"type": "tool_use", "id": fmt.Sprintf("toolu_%d", i), "name": "Read", "input": map[string]string{"file_path": "/src/parser.go"}}}},
		)
	}
	conv, err := json.Marshal(messages)
	if err != nil {
		b.Fatal(err)
	}
	tools := []string{ccToolBash, ccToolRead, ccToolEdit}
	for i := range 17 {
		tools = append(tools, strings.Replace(ccToolRead, `"Read"`, fmt.Sprintf(`"Tool%d"`, i), 1))
	}
	body := []byte(strings.Replace(claudeCodeBody(tools...), ccMessages, string(conv), 1))
	if n := len(Read(body)); n != 2+len(tools) {
		b.Fatalf("%d parts, want %d", n, 2+len(tools))
	}
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		Read(body)
	}
	b.ReportMetric(float64(len(body)), "body-bytes")
}
