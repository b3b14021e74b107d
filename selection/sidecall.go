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
// resident becomes so on its title's small prompt. A turn larger than its
// residency by the same ratio (that title's, or a conversation grown that
// much at once) must then find room as a newcomer would, its residency
// counted at the turn's size, instead of riding in on it; it waits in order.
// The title is a side call from then on: its reply, ending after the turn
// that outgrew it, neither ends nor sizes the residency. Whichever turn ends
// last acts on the task end its conversation's own latest turn read.
//
// After a compaction this keeps the residency at its old size until the
// conversation leaves (its task ends, or it lingers past linger): room held
// for nothing, which costs a waiting turn, where the other error would cost
// the residents their caches.

// sideShare is the share of what a residency holds under which a turn's
// prompt is a side call.
const sideShare = 0.25

// outgrows reports whether t, a turn of res's conversation, is larger than
// what res holds by more than the side-call ratio.
func outgrows(t *Ticket, res *resident) bool {
	return sideShare*float64(t.tokens) > float64(res.tokens)
}

// rides returns the residency t's turn runs on without finding room: its
// conversation's, unless t outgrows it; nil when there is none.
func (g *gate) rides(t *Ticket) *resident {
	if res := g.residents[t.key]; res != nil && !outgrows(t, res) {
		return res
	}
	return nil
}

// sideCall reports whether t, a turn of res's conversation, is a side call.
// A body whose size is unknown or only a lower bound is sized too small to
// tell.
func sideCall(t *Ticket, res *resident) bool {
	return t.body.Bytes > 0 && !t.body.Partial && float64(t.tokens) < sideShare*float64(res.tokens)
}
