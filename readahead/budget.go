package readahead

import (
	"context"
	"io"
	"net/http"
	"sync/atomic"
)

// NewBudget is a budget of limit bytes.
func NewBudget(limit int64) *Budget { return &Budget{limit: limit} }

// Budget counts the bytes of request bodies held in memory against a
// limit.
type Budget struct {
	limit int64
	used  atomic.Int64
}

// reserve takes up to want bytes of the budget, at least least of them,
// and returns how many it took: 0 when fewer than least are free.
func (b *Budget) reserve(least, want int64) int64 {
	for {
		used := b.used.Load()
		grant := min(want, b.limit-used)
		if grant < least || grant <= 0 {
			return 0
		}
		if b.used.CompareAndSwap(used, used+grant) {
			return grant
		}
	}
}

// Read reads r's body into memory, at most limit bytes and only as much
// as the budget has free, and hands it on intact, the bytes read first. It
// returns the bytes read and whether they are the whole body; a read error
// is handed on after them. A body announced longer than limit, or than the
// budget has free, is not read. The bytes count against the budget until
// the request ends.
func (b *Budget) Read(r *http.Request, limit int64) (data []byte, whole bool) {
	if r.ContentLength > limit {
		return nil, false
	}
	// One byte more than can be kept tells a body that goes on past it.
	least, want := int64(1), limit+1
	if r.ContentLength >= 0 {
		least, want = r.ContentLength+1, r.ContentLength+1
	}
	grant := b.reserve(least, want)
	if grant == 0 {
		return nil, false
	}
	data, err := io.ReadAll(io.LimitReader(r.Body, grant))
	held := int64(len(data))
	b.used.Add(held - grant)
	if held > 0 {
		context.AfterFunc(r.Context(), func() { b.used.Add(-held) })
	}
	whole = err == nil && held < grant
	replay(r, data, err, whole)
	return data, whole
}

// ReadUntil reads r's body into memory in steps, until enough says that
// the bytes read suffice, the body ends, limit bytes are read or the budget
// has no more free, and hands it on intact, the bytes read first. The first
// step reads first bytes; the next reads the rest of a body of announced
// length, else as much again as read so far. enough sees the bytes read
// after each step. Unlike Read, it reads the start of a body announced
// longer than limit. The bytes count against the budget until the request
// ends.
func (b *Budget) ReadUntil(r *http.Request, first, limit int, enough func(read []byte) bool) {
	var data []byte
	var err error
	for want := first; ; want = len(data) {
		if r.ContentLength >= 0 {
			// One byte more than announced: a read that ends short says
			// the body is whole.
			rest := int(r.ContentLength) + 1 - len(data)
			want = rest
			if data == nil {
				want = min(first, rest)
			}
		}
		want = min(want, limit-len(data))
		grant := 0
		if want > 0 {
			grant = int(b.reserve(1, int64(want)))
		}
		if grant == 0 {
			break
		}
		grown := make([]byte, len(data)+grant)
		copy(grown, data)
		var n int
		n, err = io.ReadFull(r.Body, grown[len(data):])
		data = grown[:len(data)+n]
		b.used.Add(int64(n - grant))
		if n > 0 && enough(data) || err != nil || len(data) >= limit {
			break
		}
	}
	if len(data) == 0 && err == nil {
		return // nothing read: the body stays as it was
	}
	if held := int64(len(data)); held > 0 {
		context.AfterFunc(r.Context(), func() { b.used.Add(-held) })
	}
	replay(r, data, err, err == io.EOF || err == io.ErrUnexpectedEOF)
}

// During runs fn with n more bytes of the budget taken, if it has them
// free, and reports whether it ran fn.
func (b *Budget) During(n int64, fn func()) bool {
	if n <= 0 || b.reserve(n, n) == 0 {
		return false
	}
	defer b.used.Add(-n)
	fn()
	return true
}
