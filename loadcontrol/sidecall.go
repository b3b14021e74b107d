package loadcontrol

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
// conversation's latest own turn by the same ratio (that title, or a
// conversation grown that much at once) must then find room as a newcomer would, its residency
// counted at the turn's size, instead of riding in on it; it waits in order.
// The title is a side call from then on: its reply, ending after the turn
// that outgrew it, neither ends nor sizes the residency. Whichever turn ends
// last acts on the task end its conversation's own latest turn read.
//
// After a compaction this keeps the residency at its old size until the
// conversation leaves (its task ends, or it lingers past linger): room held
// for nothing, which costs a waiting turn, where the other error would cost
// the residents their caches.

// sideShare is the share of its conversation's latest own turn's body
// under which a turn's is a side call; a turn over its inverse outgrows
// the residency.
const sideShare = 0.25

// outgrows reports whether t, a turn of res's conversation, is larger than
// its latest own turn by more than the side-call ratio. Both are told in
// request bytes, not in the residency's tokens, which the replies set: a
// conversation carrying images has far more bytes per token than the mean,
// and its every turn would seem to outgrow its residency.
func outgrows(t *Ticket, res *resident) bool {
	return known(t.body) && res.bytes > 0 && sideShare*float64(t.body.Bytes) > float64(res.bytes)
}

// rides returns the residency t's turn runs on without finding room: its
// conversation's, unless t outgrows it; nil when there is none.
func (g *Gate) rides(t *Ticket) *resident {
	if res := g.residents[t.key]; res != nil && !outgrows(t, res) {
		return res
	}
	return nil
}

// sideCall reports whether t, a turn of res's conversation, is a side call:
// its body is under the side-call ratio of its conversation's latest own
// turn's.
func sideCall(t *Ticket, res *resident) bool {
	return known(t.body) && float64(t.body.Bytes) < sideShare*float64(res.bytes)
}

// known reports whether body's size is told: one unknown, or only a lower
// bound, tells nothing of a turn's size.
func known(body Body) bool { return body.Bytes > 0 && !body.Partial }
