package tokenizer

import "strings"

// replyWords are the pieces replies are made of. Each is exactly CharsPerToken bytes, so a
// reply's text cuts back into the same pieces wherever it starts a message.
var replyWords = buildReplyWords()

// pieceByID maps the id of each reply piece back to its text.
var pieceByID = func() map[uint32]string {
	m := make(map[uint32]string, len(replyWords))
	for _, w := range replyWords {
		m[chunkID(w)] = w
	}
	return m
}()

func buildReplyWords() []string {
	const words = "the and for are but not you all any can had her was one our out day get has him " +
		"his how man new now old see two way who did its let put say she too use map run set key " +
		"log sum add fix bug row max min end top low net box cat dog sun sky sea red big try ask " +
		"own few far yes job law war art act car eye arm air bed lot tax oil"
	const shortWords = "is it to on we go do so be by at in of up as or no an if my me he us"
	var out []string
	for _, w := range strings.Fields(words) {
		out = append(out, w+" ")
	}
	for _, w := range strings.Fields(shortWords) {
		out = append(out, w+", ", w+". ")
	}
	return out
}

// Reply returns the n tokens of a deterministic pseudo-text reply for seed. When stopped is
// true the last of the n tokens is ImEnd, as a model that ends its turn by itself emits.
func Reply(seed uint64, n int, stopped bool) []uint32 {
	out := make([]uint32, n)
	state := seed
	for i := range out {
		out[i] = chunkID(replyWords[splitmix64(&state)%uint64(len(replyWords))])
	}
	if stopped && n > 0 {
		out[n-1] = ImEnd
	}
	return out
}

// Piece returns the text of one generated token: a reply word, or "" for ImEnd and any id
// that is not a reply word.
func Piece(id uint32) string {
	return pieceByID[id]
}

// splitmix64 advances state and returns the next value of the SplitMix64 sequence.
func splitmix64(state *uint64) uint64 {
	*state += 0x9e3779b97f4a7c15
	z := *state
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	return z ^ (z >> 31)
}

// Text returns the text of generated tokens: their pieces concatenated.
func Text(tokens []uint32) string {
	var b strings.Builder
	b.Grow(len(tokens) * CharsPerToken)
	for _, id := range tokens {
		b.WriteString(Piece(id))
	}
	return b.String()
}
