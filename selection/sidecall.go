package selection

// Side calls. An agent sends under its conversation's key requests that do
// not continue the conversation: Claude Code's titles and classifiers, a
// sub-agent's turns where sub-agents are not split off, the first turns after
// a compaction. Their prompts are far smaller than the conversation's, which
// otherwise only grows. Load control runs such a turn on the conversation's
// residency without letting it size or end it: its end_turn ends a side
// task, not the agent's, and its small prompt would let the replica take in
// more than fits by the time the conversation's next turn comes.
//
// A side call may also come first: Claude Code titles each prompt of an
// interactive session before sending it, so a conversation that is not
// resident becomes so on its title's small prompt. A turn larger than that
// residency by the same ratio must then find room as a newcomer would,
// instead of riding in on it.
//
// After a compaction this keeps the residency at its old size until the
// conversation leaves (its task ends, or it lingers past linger): room held
// for nothing, which costs a waiting turn, where the other error would cost
// the residents their caches.

// sideShare is the share of what a residency holds under which a turn's
// prompt is a side call.
const sideShare = 0.25

// outgrows reports whether t, a turn of res's conversation, is larger than
// what res holds by more than the side-call ratio: res was opened by a side
// call.
func outgrows(t *Ticket, res *resident) bool {
	return sideShare*float64(t.tokens) > float64(res.tokens)
}

// sideCall reports whether t, a turn of res's conversation, is a side call.
// A body whose size is unknown or only a lower bound is sized too small to
// tell.
func sideCall(t *Ticket, res *resident) bool {
	return t.body.Bytes > 0 && !t.body.Partial && float64(t.tokens) < sideShare*float64(res.tokens)
}
