package livemodel

import (
	"context"
	"testing"
	"time"

	"go.uber.org/zap"
)

// The prompts kept for refreshes stay within their budget, a turn's
// replacing its conversation's last, and are forgotten once their
// conversation has not been refreshed for keptPromptFor.
func TestKeptPromptsStayWithinTheirBudget(t *testing.T) {
	m := New("m", time.Second, zap.NewNop())
	t0 := time.Date(2026, 12, 7, 0, 0, 0, 0, time.UTC)
	m.KeepPrompt(1, Prompt{Body: make([]byte, maxKeptPromptBytes-10)}, t0)
	m.KeepPrompt(2, Prompt{Body: make([]byte, 20)}, t0)
	if n, b := len(m.refresh.prompts), m.refresh.bytes; n != 1 || b != maxKeptPromptBytes-10 {
		t.Fatalf("%d prompts of %d bytes, want the first alone", n, b)
	}
	m.KeepPrompt(1, Prompt{Body: make([]byte, 100)}, t0)
	m.KeepPrompt(2, Prompt{Body: make([]byte, 20)}, t0.Add(time.Minute))
	if n, b := len(m.refresh.prompts), m.refresh.bytes; n != 2 || b != 120 {
		t.Fatalf("%d prompts of %d bytes, want 2 of 120", n, b)
	}
	m.refreshKept(context.Background(), t0.Add(keptPromptFor+time.Second))
	if _, kept := m.refresh.prompts[2]; len(m.refresh.prompts) != 1 || !kept || m.refresh.bytes != 20 {
		t.Fatalf("%d prompts of %d bytes after keptPromptFor, want the second alone", len(m.refresh.prompts), m.refresh.bytes)
	}
}
