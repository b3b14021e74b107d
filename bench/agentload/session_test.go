package agentload

import (
	"encoding/json"
	"flag"
	"reflect"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"
)

var uuidV4 = regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$`)

func mustGenerator(t *testing.T, cfg Config) *Generator {
	t.Helper()
	g, err := NewGenerator(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return g
}

// playSession answers every turn with a reply derived from the turn, and
// returns the turns it saw.
func playSession(s *Session) []Turn {
	var turns []Turn
	for {
		turn, ok := s.Next()
		if !ok {
			return turns
		}
		turns = append(turns, turn)
		s.Reply(strings.Repeat("ok. ", turn.Index+1))
	}
}

func TestSameSeedSameSessions(t *testing.T) {
	a, b := mustGenerator(t, DefaultConfig()), mustGenerator(t, DefaultConfig())
	if a.SystemPrompt() != b.SystemPrompt() {
		t.Fatal("system prompts differ for the same seed")
	}
	for range 3 {
		sa, sb := a.NewSession(), b.NewSession()
		if sa.ID != sb.ID || sa.UserID != sb.UserID || sa.Turns() != sb.Turns() {
			t.Fatalf("session %d identity differs: %q/%q", sa.Index, sa.ID, sb.ID)
		}
		if ta, tb := playSession(sa), playSession(sb); !reflect.DeepEqual(ta, tb) {
			t.Fatalf("session %d turns differ", sa.Index)
		}
	}

	other := DefaultConfig()
	other.Seed = 2
	c := mustGenerator(t, other)
	if c.SystemPrompt() == a.SystemPrompt() {
		t.Error("seed 2 has seed 1's system prompt")
	}
	if c.NewSession().ID == mustGenerator(t, DefaultConfig()).NewSession().ID {
		t.Error("seed 2 has seed 1's first session ID")
	}
}

func TestSessionsIndependentOfCallOrder(t *testing.T) {
	cfg := DefaultConfig()
	sequential := mustGenerator(t, cfg)
	want := map[int][]Turn{}
	for range 8 {
		s := sequential.NewSession()
		want[s.Index] = playSession(s)
	}

	concurrent := mustGenerator(t, cfg)
	var mu sync.Mutex
	got := map[int][]Turn{}
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			s := concurrent.NewSession()
			turns := playSession(s)
			mu.Lock()
			got[s.Index] = turns
			mu.Unlock()
		})
	}
	wg.Wait()
	if !reflect.DeepEqual(got, want) {
		t.Fatal("sessions handed out concurrently differ from the sequential ones")
	}
}

func TestSessionIdentity(t *testing.T) {
	g := mustGenerator(t, DefaultConfig())
	seen := map[string]bool{}
	var device, account string
	for range 50 {
		s := g.NewSession()
		if !uuidV4.MatchString(s.ID) {
			t.Fatalf("session ID %q is not a v4 UUID", s.ID)
		}
		if seen[s.ID] {
			t.Fatalf("duplicate session ID %q", s.ID)
		}
		seen[s.ID] = true
		var user struct {
			DeviceID    string `json:"device_id"`
			AccountUUID string `json:"account_uuid"`
			SessionID   string `json:"session_id"`
		}
		if err := json.Unmarshal([]byte(s.UserID), &user); err != nil {
			t.Fatalf("user_id %q is not JSON: %v", s.UserID, err)
		}
		if user.SessionID != s.ID {
			t.Fatalf("user_id session %q, want %q", user.SessionID, s.ID)
		}
		if !regexp.MustCompile(`^[0-9a-f]{64}$`).MatchString(user.DeviceID) || !uuidV4.MatchString(user.AccountUUID) {
			t.Fatalf("device %q / account %q malformed", user.DeviceID, user.AccountUUID)
		}
		if device == "" {
			device, account = user.DeviceID, user.AccountUUID
		}
		if user.DeviceID != device || user.AccountUUID != account {
			t.Fatal("device or account changes between sessions of one run")
		}
	}
}

func within(t *testing.T, what string, got, lo, hi int) {
	t.Helper()
	if got < lo || got > hi {
		t.Errorf("%s = %d, want in [%d, %d]", what, got, lo, hi)
	}
}

func TestTokenSizes(t *testing.T) {
	cfg := DefaultConfig()
	g := mustGenerator(t, cfg)
	if got, want := len(g.SystemPrompt()), cfg.SystemPromptTokens*BytesPerToken; got != want {
		t.Errorf("system prompt is %d bytes, want %d", got, want)
	}
	maxTokens := map[int]bool{}
	firstSizes := map[int]bool{}
	for range 40 {
		s := g.NewSession()
		if s.Turns() != cfg.Turns {
			t.Fatalf("session has %d turns, want %d", s.Turns(), cfg.Turns)
		}
		for _, turn := range playSession(s) {
			text := turn.Messages[len(turn.Messages)-1].Content
			if len(text)%BytesPerToken != 0 || len(text)/BytesPerToken != turn.NewTokens {
				t.Fatalf("turn %d: %d bytes for %d tokens", turn.Index, len(text), turn.NewTokens)
			}
			if turn.Index == 0 {
				within(t, "first message tokens", turn.NewTokens, 6570, 8030)
				firstSizes[turn.NewTokens] = true
			} else {
				within(t, "turn tokens", turn.NewTokens, 360, 440)
			}
			within(t, "max_tokens", turn.MaxTokens, 230, 256)
			maxTokens[turn.MaxTokens] = true
		}
	}
	if len(maxTokens) < 5 || len(firstSizes) < 5 {
		t.Errorf("spread not applied: %d distinct max_tokens, %d distinct first sizes", len(maxTokens), len(firstSizes))
	}
}

func TestZeroSpreadIsExact(t *testing.T) {
	cfg := DefaultConfig()
	cfg.FirstMessageSpread, cfg.TurnTokensSpread, cfg.MaxOutputSpread = 0, 0, 0
	cfg.SystemPromptTokens, cfg.FirstMessageTokens, cfg.TurnTokens, cfg.Turns, cfg.MaxOutputTokens = 37, 101, 13, 4, 9
	s := mustGenerator(t, cfg).NewSession()
	turns := playSession(s)
	if len(turns) != 4 {
		t.Fatalf("%d turns, want 4", len(turns))
	}
	for _, turn := range turns {
		want := 13
		if turn.Index == 0 {
			want = 101
		}
		if turn.NewTokens != want || turn.MaxTokens != 9 || len(turn.System) != 37*BytesPerToken {
			t.Errorf("turn %d: new %d max %d system %d bytes", turn.Index, turn.NewTokens, turn.MaxTokens, len(turn.System))
		}
	}
}

func TestSystemAndTurnsSpread(t *testing.T) {
	systemSizes := map[int]bool{}
	turnCounts := map[int]bool{}
	for seed := range int64(20) {
		cfg := DefaultConfig()
		cfg.Seed, cfg.SystemPromptSpread, cfg.TurnsSpread, cfg.Turns = seed, 0.2, 0.5, 6
		g := mustGenerator(t, cfg)
		tokens := len(g.SystemPrompt()) / BytesPerToken
		within(t, "system prompt tokens", tokens, 2800, 4200)
		systemSizes[tokens] = true
		n := g.NewSession().Turns()
		within(t, "turns", n, 3, 9)
		turnCounts[n] = true
	}
	if len(systemSizes) < 5 || len(turnCounts) < 3 {
		t.Errorf("spread not applied: %d system sizes, %d turn counts", len(systemSizes), len(turnCounts))
	}
}

func TestTextIsReadableASCII(t *testing.T) {
	text := mustGenerator(t, DefaultConfig()).SystemPrompt()
	for i, c := range []byte(text) {
		if c != '\n' && (c < ' ' || c > '~') {
			t.Fatalf("byte %d is %q", i, c)
		}
	}
	words := strings.Fields(text)
	if len(words) < len(text)/15 {
		t.Errorf("only %d words in %d bytes", len(words), len(text))
	}
	if strings.HasSuffix(text, " ") || strings.HasSuffix(text, "\n") {
		t.Error("text ends with whitespace")
	}
}

func TestFirstMessagesAreUnique(t *testing.T) {
	g := mustGenerator(t, DefaultConfig())
	openings := map[string]int{}
	for range 30 {
		s := g.NewSession()
		turn, _ := s.Next()
		// 64 bytes = one 16-token KV block: sessions must not share one.
		opening := turn.Messages[0].Content[:64]
		if prev, dup := openings[opening]; dup {
			t.Fatalf("sessions %d and %d open their first message alike", prev, s.Index)
		}
		openings[opening] = s.Index
	}
}

func TestHistoryResendsRepliesVerbatim(t *testing.T) {
	s := mustGenerator(t, DefaultConfig()).NewSession()
	prev, _ := s.Next()
	if len(prev.Messages) != 1 || prev.Messages[0].Role != "user" || prev.Index != 0 {
		t.Fatalf("first turn: %+v", prev.Messages)
	}
	if again, _ := s.Next(); !reflect.DeepEqual(again, prev) {
		t.Fatal("Next before Reply returned another turn")
	}
	for i := 1; i < s.Turns(); i++ {
		reply := strings.Repeat("Reply number "+string(rune('0'+i))+" with text.\n", i)
		s.Reply(reply)
		next, ok := s.Next()
		if !ok {
			t.Fatalf("session over after %d turns, want %d", i, s.Turns())
		}
		want := append(append([]Message{}, prev.Messages...), Message{Role: "assistant", Content: reply})
		if !reflect.DeepEqual(next.Messages[:len(want)], want) {
			t.Fatalf("turn %d does not resend the history verbatim", i)
		}
		if len(next.Messages) != len(want)+1 || next.Messages[len(want)].Role != "user" {
			t.Fatalf("turn %d does not end with one new user message", i)
		}
		if next.Index != i || next.Last != (i == s.Turns()-1) {
			t.Fatalf("turn %d: index %d last %v", i, next.Index, next.Last)
		}
		// A caller appending to an earlier turn must not alter the history.
		_ = append(prev.Messages, Message{Role: "user", Content: "scribble"})
		if next.Messages[len(prev.Messages)].Content != reply {
			t.Fatalf("appending to turn %d overwrote the reply", i-1)
		}
		prev = next
	}
	if s.Done() {
		t.Fatal("session done before its last reply")
	}
	s.Reply("bye")
	if _, ok := s.Next(); ok || !s.Done() {
		t.Fatal("session goes on after its last turn")
	}
	defer func() {
		if recover() == nil {
			t.Error("Reply without a pending turn did not panic")
		}
	}()
	s.Reply("extra")
}

func TestConfigValidate(t *testing.T) {
	if err := DefaultConfig().Validate(); err != nil {
		t.Fatalf("default config invalid: %v", err)
	}
	for name, mutate := range map[string]func(*Config){
		"zero turns":      func(c *Config) { c.Turns = 0 },
		"negative tokens": func(c *Config) { c.TurnTokens = -1 },
		"spread of 1":     func(c *Config) { c.FirstMessageSpread = 1 },
		"negative spread": func(c *Config) { c.MaxOutputSpread = -0.1 },
		"unknown api":     func(c *Config) { c.API = "grpc" },
		"no model":        func(c *Config) { c.Model = "" },
	} {
		cfg := DefaultConfig()
		mutate(&cfg)
		if cfg.Validate() == nil {
			t.Errorf("%s: accepted", name)
		}
		if _, err := NewGenerator(cfg); err == nil {
			t.Errorf("%s: NewGenerator accepted", name)
		}
	}
}

func TestRegisterFlags(t *testing.T) {
	cfg := DefaultConfig()
	fs := flag.NewFlagSet("test", flag.ContinueOnError)
	cfg.RegisterFlags(fs)
	if f := fs.Lookup("first-tokens"); f == nil || f.DefValue != "7300" {
		t.Fatalf("first-tokens flag: %+v", f)
	}
	err := fs.Parse([]string{"--system-tokens=100", "--turns=3", "--output-spread=0.5", "--api=openai", "--session-header="})
	if err != nil {
		t.Fatal(err)
	}
	if cfg.SystemPromptTokens != 100 || cfg.Turns != 3 || cfg.MaxOutputSpread != 0.5 || cfg.API != APIOpenAI || cfg.SessionHeader != "" {
		t.Errorf("flags not applied: %+v", cfg)
	}
	if cfg.FirstMessageTokens != 7300 {
		t.Errorf("unset flag changed first message tokens to %d", cfg.FirstMessageTokens)
	}
}

func TestThinkTimesAreSpreadAndSeeded(t *testing.T) {
	cfg := DefaultConfig()
	cfg.ThinkTime, cfg.ThinkSpread = time.Second, 1
	a, b := mustGenerator(t, cfg).NewSession(), mustGenerator(t, cfg).NewSession()
	var lo, hi time.Duration = time.Hour, 0
	for {
		ta, okA := a.Next()
		tb, _ := b.Next()
		if !okA {
			break
		}
		if ta.Think != tb.Think {
			t.Fatalf("turn %d: think %v vs %v for the same seed", ta.Index, ta.Think, tb.Think)
		}
		if ta.Think < 0 || ta.Think > 2*time.Second {
			t.Fatalf("think %v outside [0, 2s]", ta.Think)
		}
		lo, hi = min(lo, ta.Think), max(hi, ta.Think)
		a.Reply("done")
		b.Reply("done")
	}
	if hi-lo < 100*time.Millisecond {
		t.Errorf("think times %v..%v: not spread", lo, hi)
	}
}
