package lab

import (
	"slices"
	"testing"

	"github.com/lmwarden/caddy-warden/bench/agentload"
	"github.com/lmwarden/caddy-warden/bench/vllmsim/engine"
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
	const blockSize = 4 // several blocks per message, some across two
	var m promptMemo
	var prompts [][]uint32
	var hashes [][]uint64
	for i, turn := range turns {
		got, gotHashes := m.of(turn, blockSize)
		want := promptOf(turn)
		if !slices.Equal(got, want) {
			t.Fatalf("turn %d: %d tokens, want the tokenizer's %d", i, len(got), len(want))
		}
		if !slices.Equal(gotHashes, engine.BlockHashes(want, blockSize)) {
			t.Fatalf("turn %d: block hashes are not those of its prompt", i)
		}
		prompts, hashes = append(prompts, got), append(hashes, gotHashes)
	}
	for i, turn := range turns {
		want := promptOf(turn)
		if !slices.Equal(prompts[i], want) || !slices.Equal(hashes[i], engine.BlockHashes(want, blockSize)) {
			t.Fatalf("turn %d's prompt or hashes changed after the turns that followed it", i)
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
