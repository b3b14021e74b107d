package loadcontrol

// The shared prefix, as routing learns it (selection's sharedprefix.go),
// counted once per replica in what its residents hold.

// SharedPrefixSource tells where load control read the shared prefix.
type SharedPrefixSource uint8

// Sources of the shared prefix.
const (
	SharedUnknown      SharedPrefixSource = iota // neither told yet: nothing counts as shared
	SharedFromReplies                            // the cached part of new conversations' replies
	SharedFromRequests                           // the system prompt and tools the requests share
)

func (s SharedPrefixSource) String() string {
	return [...]string{"unknown", "replies", "requests"}[s]
}

// distinct is what a replica holding h holds with a prompt of tokens more
// (0: none): the prompts less the shared prefix for each but one, and never
// less than the new prompt or a mean one, so that conversations that share
// less than the prefix (another agent's, a sub-agent with its own system
// prompt) cannot make a replica look all but empty (g.mu held).
func (v *View) distinct(h residency, tokens int) int {
	n, sum := h.with(tokens)
	if n <= 1 {
		return sum
	}
	shared := v.sharedTokens()
	return max(sum-(n-1)*shared, tokens, sum/n)
}

// with is how many conversations, and how many tokens, h holds with a
// prompt of tokens more (0: none).
func (h residency) with(tokens int) (count, sum int) {
	if tokens > 0 {
		return h.count + 1, h.tokens + tokens
	}
	return h.count, h.tokens
}
