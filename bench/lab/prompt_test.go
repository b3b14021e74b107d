package lab

import (
	"slices"
	"testing"

	"github.com/lmwarden/caddy-warden/bench/agentload"
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
