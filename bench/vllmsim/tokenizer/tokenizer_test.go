package tokenizer

import (
	"slices"
	"strings"
	"testing"
)

func TestTokenizeCutsFourByteChunks(t *testing.T) {
	for _, text := range []string{"", "a", "abcd", "abcde", strings.Repeat("hello world ", 100)} {
		got := len(Tokenize(text))
		want := (len(text) + CharsPerToken - 1) / CharsPerToken
		if got != want {
			t.Errorf("len(Tokenize(%d bytes)) = %d, want %d", len(text), got, want)
		}
	}
	if !slices.Equal(Tokenize("the cat sat"), Tokenize("the cat sat")) {
		t.Fatal("same text gave different tokens")
	}
	if slices.Equal(Tokenize("abcdefgh"), Tokenize("abcdefgX")) {
		t.Fatal("different text gave the same tokens")
	}
	if Tokenize("abc")[0] == Tokenize("abc\x00")[0] {
		t.Fatal("a short final chunk collides with its zero-padded form")
	}
}

func TestSystemFieldAndSystemMessageRenderAlike(t *testing.T) {
	msgs := []Message{{Role: "user", Content: "fix the bug"}}
	anthropic := ChatTokens("you are helpful", msgs)
	openAI := ChatTokens("", append([]Message{{Role: "system", Content: "you are helpful"}}, msgs...))
	if !slices.Equal(anthropic, openAI) {
		t.Fatalf("system field and system message differ:\n%v\n%v", anthropic, openAI)
	}
}

func TestReplyResentInHistoryKeepsTheTokenPrefix(t *testing.T) {
	system := strings.Repeat("shared system prompt. ", 50)
	history := []Message{{Role: "user", Content: "first question, of an odd length!"}}
	for turn, stopped := range []bool{true, false, true} {
		prompt := ChatTokens(system, history)
		reply := Reply(uint64(turn+7), 37, stopped)
		history = append(history,
			Message{Role: "assistant", Content: Text(reply)},
			Message{Role: "user", Content: "next question"})
		next := ChatTokens(system, history)
		generated := append(slices.Clone(prompt), reply...)
		if !slices.Equal(next[:len(generated)], generated) {
			t.Fatalf("turn %d (stopped=%v): next prompt does not start with prompt+reply", turn, stopped)
		}
	}
}

func TestReplyIsDeterministicReadableText(t *testing.T) {
	a, b := Reply(42, 64, false), Reply(42, 64, false)
	if !slices.Equal(a, b) {
		t.Fatal("same seed gave different replies")
	}
	if slices.Equal(a, Reply(43, 64, false)) {
		t.Fatal("different seeds gave the same reply")
	}
	text := Text(a)
	if len(text) != 64*CharsPerToken || strings.ContainsFunc(text, func(r rune) bool {
		return !(r >= 'a' && r <= 'z' || r == ' ' || r == ',' || r == '.')
	}) {
		t.Fatalf("reply text %q is not 64 word pieces", text)
	}
	if !slices.Equal(Tokenize(text), a) {
		t.Fatal("reply text does not tokenize back to the reply")
	}
	stopped := Reply(42, 64, true)
	if stopped[63] != ImEnd || !slices.Equal(stopped[:63], a[:63]) {
		t.Fatal("a stopped reply must end with ImEnd and otherwise match")
	}
	if Piece(ImEnd) != "" {
		t.Fatal("ImEnd must have no text")
	}
}

func TestReplyWordsHaveDistinctIDs(t *testing.T) {
	if len(pieceByID) != len(replyWords) {
		t.Fatalf("%d reply words share ids", len(replyWords)-len(pieceByID))
	}
	for _, w := range replyWords {
		if len(w) != CharsPerToken {
			t.Fatalf("reply word %q is not %d bytes", w, CharsPerToken)
		}
	}
}
