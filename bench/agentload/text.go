package agentload

import (
	"math"
	"math/rand/v2"
	"strings"
)

const (
	consonants = "bcdfghjklmnprstvz"
	vowels     = "aeiou"
)

// pseudoText returns readable pseudo-words in sentences and paragraphs,
// exactly tokens×BytesPerToken bytes of ASCII, so the simulator's tokenizer
// counts exactly tokens tokens.
func pseudoText(rng *rand.Rand, tokens int) string {
	size := tokens * BytesPerToken
	var b strings.Builder
	b.Grow(size + 64)
	for b.Len() < size {
		writeParagraph(&b, rng)
	}
	text := []byte(b.String()[:size])
	// A cut can leave whitespace at the end; end on a visible character so
	// the text reads as finished.
	if last := len(text) - 1; last >= 0 && (text[last] == ' ' || text[last] == '\n') {
		text[last] = '.'
	}
	return string(text)
}

// writeParagraph appends three to six sentences and a blank line.
func writeParagraph(b *strings.Builder, rng *rand.Rand) {
	for s := range 3 + rng.IntN(4) {
		if s > 0 {
			b.WriteByte(' ')
		}
		for w := range 5 + rng.IntN(9) {
			if w > 0 {
				b.WriteByte(' ')
			}
			writeWord(b, rng, w == 0)
		}
		b.WriteByte('.')
	}
	b.WriteString("\n\n")
}

// writeWord appends one to three consonant-vowel syllables, sometimes closed
// by a consonant.
func writeWord(b *strings.Builder, rng *rand.Rand, capital bool) {
	for s := range 1 + rng.IntN(3) {
		c := consonants[rng.IntN(len(consonants))]
		if capital && s == 0 {
			c -= 'a' - 'A'
		}
		b.WriteByte(c)
		b.WriteByte(vowels[rng.IntN(len(vowels))])
	}
	if rng.IntN(3) == 0 {
		b.WriteByte(consonants[rng.IntN(len(consonants))])
	}
}

// spreadAround draws round(base×(1±spread)) uniformly, at least 1.
func spreadAround(rng *rand.Rand, base int, spread float64) int {
	factor := 1 + spread*(2*rng.Float64()-1)
	return max(1, int(math.Round(float64(base)*factor)))
}

// spreadBelow draws round(base×(1-spread×u)) for u uniform in [0,1), so the
// result never exceeds base; at least 1.
func spreadBelow(rng *rand.Rand, base int, spread float64) int {
	return max(1, int(math.Round(float64(base)*(1-spread*rng.Float64()))))
}
