package lab

import (
	"slices"
	"testing"

	"github.com/lmwarden/caddy-warden/bench/agentload"
	"github.com/lmwarden/caddy-warden/bench/vllmsim/tokenizer"
)

func TestSlotPromptIsTheTokenizersWhateverTheTurns(t *testing.T) {
	msg := func(role, content string) agentload.Message { return agentload.Message{Role: role, Content: content} }
	history := []agentload.Message{msg("user", "read the file")}
	grown := append(slices.Clone(history), msg("assistant", "it says hello"), msg("user", "now edit it"))
	turns := []agentload.Turn{
		{System: "you are an agent", Messages: history},
		{System: "you are an agent", Messages: grown},
		{Messages: []agentload.Message{msg("user", "title this chat")}, Side: true},
		{System: "you are an agent", Messages: append(slices.Clone(grown), msg("assistant", "done"), msg("user", "thanks"))},
		{System: "you are an agent", Messages: []agentload.Message{msg("user", "a summary of it all")}},
		{System: "another system", Messages: []agentload.Message{msg("user", "a summary of it all")}},
		{System: "another system", Messages: []agentload.Message{msg("user", "a summary of it all, edited")}},
	}
	var m promptMemo
	var prompts [][]uint32
	for i, turn := range turns {
		got := m.of(turn)
		if want := promptOf(turn); !slices.Equal(got, want) {
			t.Fatalf("turn %d: %d tokens, want the tokenizer's %d", i, len(got), len(want))
		}
		prompts = append(prompts, got)
	}
	for i, turn := range turns {
		if !slices.Equal(prompts[i], promptOf(turn)) {
			t.Fatalf("turn %d's prompt changed after the turns that followed it", i)
		}
	}
}

// promptOf is the turn's prompt as the simulator's server tokenizes it,
// rendered whole: what promptMemo must give.
func promptOf(turn agentload.Turn) []uint32 {
	msgs := make([]tokenizer.Message, len(turn.Messages))
	for i, m := range turn.Messages {
		msgs[i] = tokenizer.Message{Role: m.Role, Content: m.Content}
	}
	return tokenizer.ChatTokens(turn.System, msgs)
}
