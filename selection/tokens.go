package selection

import (
	"math"
	"sync/atomic"
)

// A prompt's size in tokens is what routing and load control weigh, but a
// proxy sees bytes: the request's body. Bytes per token depend on the
// model's tokenizer and the text (prose, code, JSON around it), so the
// router learns them from the replies, which report the prompt in the
// server's own tokens (replyend), and starts from BytesPerToken.

// BytesPerToken is the request bodies' bytes per prompt token assumed
// before a reply tells: JSON around English text and code runs near 4.
const BytesPerToken = 4

// tokenSmoothing is the weight of one reply in the learned bytes per
// token: it settles within a few dozen replies.
const tokenSmoothing = 0.05

// Bytes per token a reply may teach: outside, the prompt is not text alone
// (base64 images count far more bytes than tokens) or the pair is wrong.
const (
	minBytesPerToken = 1
	maxBytesPerToken = 16
)

// EstimateTokens is a prompt's size in tokens from its request body's
// size, at the bytes per token learned so far; 0 when the size is unknown.
func (v *View) EstimateTokens(bodyBytes int64) int {
	perToken, _ := v.router.bytesPerTokenLearned()
	return tokensOf(bodyBytes, perToken)
}

// MaxPromptTokens bounds a prompt's size estimated from its body: no
// model's context is longer, and a forged Content-Length (8 EiB, and no
// body sent) must not overflow the sums of the prompts in flight.
const MaxPromptTokens = 1 << 24

func tokensOf(bodyBytes int64, bytesPerToken float64) int {
	if bodyBytes <= 0 {
		return 0
	}
	return int(min(MaxPromptTokens, max(1, math.Round(float64(bodyBytes)/bytesPerToken))))
}

// BytesPerToken is the request bodies' bytes per prompt token, learned from
// the replies; BytesPerToken before any reply told.
func (r *Router) BytesPerToken() float64 {
	b, _ := r.bytesPerTokenLearned()
	return b
}

// bytesPerTokenLearned is BytesPerToken, and whether a reply taught it, in
// one read.
func (r *Router) bytesPerTokenLearned() (float64, bool) {
	if b := r.bytesPerToken.value(); b > 0 {
		return b, true
	}
	return BytesPerToken, false
}

// learnTokenSize folds a reply's prompt size, in the server's tokens, and
// its request body's size into the learned bytes per token; a pair that
// cannot be the same text's (images, a body cut short) teaches nothing.
func (r *Router) learnTokenSize(bodyBytes int64, promptTokens int) {
	if bodyBytes <= 0 || promptTokens <= 0 {
		return
	}
	b := float64(bodyBytes) / float64(promptTokens)
	if b < minBytesPerToken || b > maxBytesPerToken {
		return
	}
	r.bytesPerToken.observe(b, tokenSmoothing)
}

// smoothed is an exponentially weighted mean, safe for concurrent use; 0
// before its first value, which it takes whole.
type smoothed struct{ bits atomic.Uint64 }

func (m *smoothed) observe(x, weight float64) {
	for {
		old := m.bits.Load()
		mean := math.Float64frombits(old)
		if mean == 0 {
			mean = x
		} else {
			mean += weight * (x - mean)
		}
		if m.bits.CompareAndSwap(old, math.Float64bits(mean)) {
			return
		}
	}
}

func (m *smoothed) value() float64 { return math.Float64frombits(m.bits.Load()) }
