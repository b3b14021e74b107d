// Package tokenizer is the simulator's stand-in for a real tokenizer and chat template.
//
// The rule is deliberately simple and stable: text is cut into 4-byte chunks from the start
// of each piece of content, and each chunk becomes one token id derived from a hash of its
// bytes (so about 4 characters per token for ASCII text). A chat is rendered with Qwen's
// ChatML template (<|im_start|>role\n content <|im_end|>\n ...), so the same conversation
// always gives the same tokens and a resent history is an exact token prefix of the longer
// conversation, as with a real model.
//
// Replies are made of 4-byte word pieces whose ids are exactly the ids Tokenize gives those
// pieces, so a reply sent back verbatim in the next turn re-tokenizes to the very tokens the
// engine generated and cached, as it does with vLLM.
package tokenizer

import "strings"

// Special token ids, taken from Qwen3's vocabulary so traces look familiar.
const (
	// ImStart opens a chat turn (<|im_start|>).
	ImStart uint32 = 151644
	// ImEnd closes a chat turn (<|im_end|>); the model emits it when it stops by itself.
	ImEnd uint32 = 151645
	// Newline is the "\n" the template puts after the role and after <|im_end|>.
	Newline uint32 = 198
)

// CharsPerToken is how many bytes of text make one token.
const CharsPerToken = 4

// chunkIDBit marks every text-chunk id, keeping them apart from the special ids above.
const chunkIDBit = 1 << 31

// Tokenize returns the token ids of text: one id per 4-byte chunk (the last chunk may be shorter).
func Tokenize(text string) []uint32 {
	return AppendTokens(make([]uint32, 0, (len(text)+CharsPerToken-1)/CharsPerToken), text)
}

// AppendTokens appends the token ids of text to dst and returns the extended slice.
func AppendTokens(dst []uint32, text string) []uint32 {
	for len(text) >= CharsPerToken {
		dst = append(dst, chunkID(text[:CharsPerToken]))
		text = text[CharsPerToken:]
	}
	if text != "" {
		dst = append(dst, chunkID(text))
	}
	return dst
}

// chunkID hashes up to 4 bytes (FNV-1a over the bytes and the length) into a chunk id.
func chunkID(chunk string) uint32 {
	h := uint32(2166136261)
	for i := range CharsPerToken {
		var b byte // a short chunk hashes as if padded with zeros
		if i < len(chunk) {
			b = chunk[i]
		}
		h = (h ^ uint32(b)) * 16777619
	}
	h = (h ^ uint32(len(chunk))) * 16777619
	return h | chunkIDBit
}

// Message is one chat turn: Role is "system", "user", "assistant" or "tool"; Content is its
// text, with multi-part content already joined by the caller (see JoinParts).
type Message struct {
	Role    string
	Content string
}

// JoinParts joins the text parts of one message the way vLLM flattens multi-part content
// before applying a chat template: with a newline between parts.
func JoinParts(parts []string) string {
	return strings.Join(parts, "\n")
}

// ChatTokens renders a conversation with the ChatML template and the generation prompt for the
// assistant's next turn. A non-empty system is rendered first as a system turn, so a system
// prompt given as a top-level field (Anthropic) or as a first "system" message (OpenAI) gives
// identical tokens.
func ChatTokens(system string, msgs []Message) []uint32 {
	size := 3
	if system != "" {
		size += len(system)/CharsPerToken + 8
	}
	for _, m := range msgs {
		size += len(m.Content)/CharsPerToken + 8
	}
	return AppendGenerationPrompt(AppendChat(make([]uint32, 0, size), system, msgs))
}

// AppendChat appends the rendering of a conversation that ChatTokens ends with its generation
// prompt: a conversation that grows by messages renders as its last rendering and theirs.
func AppendChat(dst []uint32, system string, msgs []Message) []uint32 {
	if system != "" {
		dst = appendTurn(dst, "system", system)
	}
	for _, m := range msgs {
		dst = appendTurn(dst, m.Role, m.Content)
	}
	return dst
}

// AppendGenerationPrompt appends what opens the assistant's turn.
func AppendGenerationPrompt(dst []uint32) []uint32 {
	dst = append(dst, ImStart)
	dst = AppendTokens(dst, "assistant")
	return append(dst, Newline)
}

func appendTurn(dst []uint32, role, content string) []uint32 {
	dst = append(dst, ImStart)
	dst = AppendTokens(dst, role)
	dst = append(dst, Newline)
	dst = AppendTokens(dst, content)
	return append(dst, ImEnd, Newline)
}
