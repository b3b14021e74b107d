package readahead

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/lmwarden/caddy-warden/internal/testrun"
)

// A budget holds the bodies it read until their requests end, reads none
// announced past what it has free, reads a body of unannounced length only
// as far as it has free, and hands every body on intact.
func TestBodyBudget(t *testing.T) {
	b := NewBudget(1000)
	request := func(body string, announced bool) (*http.Request, context.CancelFunc) {
		ctx, end := context.WithCancel(context.Background())
		r := httptest.NewRequestWithContext(ctx, http.MethodPost, "/", strings.NewReader(body))
		if !announced {
			r.ContentLength = -1
		}
		return r, end
	}
	first := strings.Repeat("a", 600)
	r1, end1 := request(first, true)
	if data, whole := b.Read(r1, 800); !whole || string(data) != first {
		t.Fatalf("600 bytes within the budget: read %d, whole %v", len(data), whole)
	}
	if got := b.used.Load(); got != 600 {
		t.Errorf("after reading 600 bytes the budget holds %d", got)
	}
	handedOn(t, "read whole", r1, []byte(first))

	second := strings.Repeat("b", 500)
	r2, end2 := request(second, true)
	if data, whole := b.Read(r2, 800); data != nil || whole {
		t.Errorf("500 bytes announced with 400 free: read %d, whole %v; want none read", len(data), whole)
	}
	handedOn(t, "announced past the budget", r2, []byte(second))

	r3, end3 := request(second, false)
	if data, whole := b.Read(r3, 800); len(data) != 400 || whole {
		t.Errorf("500 bytes unannounced with 400 free: read %d, whole %v; want 400, partial", len(data), whole)
	}
	if got := b.used.Load(); got != 1000 {
		t.Errorf("the budget holds %d, want all 1000", got)
	}
	handedOn(t, "unannounced past the budget", r3, []byte(second))

	r4, end4 := request(first, true)
	if data, whole := b.Read(r4, 500); data != nil || whole {
		t.Errorf("600 bytes announced past the limit of 500: read %d", len(data))
	}
	handedOn(t, "past the limit", r4, []byte(first))

	ran := false
	if b.During(1, func() { ran = true }) || ran {
		t.Error("with the budget all taken, during ran its function")
	}
	end3()
	testrun.Eventually(t, 10*time.Second, "the third request's body given back", func() bool { return b.used.Load() == 600 })
	if !b.During(400, func() { ran = b.used.Load() == 1000 }) || !ran || b.used.Load() != 600 {
		t.Errorf("during with 400 bytes free: ran %v, the budget holds %d after, want 600", ran, b.used.Load())
	}
	for _, end := range []context.CancelFunc{end1, end2, end4} {
		end()
	}
	testrun.Eventually(t, 10*time.Second, "the ended requests' bodies given back", func() bool { return b.used.Load() == 0 })
}

// Requests racing for the budget never take more than it holds.
func TestBodyBudgetRace(t *testing.T) {
	b := NewBudget(350)
	body := strings.Repeat("x", 100)
	var mu sync.Mutex
	wholes := 0
	ctx, end := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for range 16 {
		wg.Go(func() {
			r := httptest.NewRequestWithContext(ctx, http.MethodPost, "/", strings.NewReader(body))
			if _, whole := b.Read(r, 1000); whole {
				mu.Lock()
				wholes++
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if wholes != 3 || b.used.Load() != 300 {
		t.Errorf("16 bodies of 100 bytes for a budget of 350: %d read, %d bytes held; want 3 and 300", wholes, b.used.Load())
	}
	end()
	testrun.Eventually(t, 10*time.Second, "the bodies given back", func() bool { return b.used.Load() == 0 })
}

// ReadUntil reads in growing steps, stops when enough says so, reads no
// more than the budget has free, and gives the bytes back when the request
// ends.
func TestReadUntil(t *testing.T) {
	b := NewBudget(10_000)
	body := []byte(strings.Repeat("a", 5000))
	ctx, end := context.WithCancel(context.Background())
	r := httptest.NewRequestWithContext(ctx, http.MethodPost, "/", bytes.NewReader(body))
	r.ContentLength = -1
	var steps []int
	b.ReadUntil(r, 100, 100_000, func(read []byte) bool {
		steps = append(steps, len(read))
		return len(read) >= 1000
	})
	if want := []int{100, 200, 400, 800, 1600}; fmt.Sprint(steps) != fmt.Sprint(want) { // unannounced: doubling
		t.Errorf("steps %v, want %v", steps, want)
	}
	if got := b.used.Load(); got != 1600 {
		t.Errorf("the budget holds %d, want the 1600 bytes read", got)
	}
	handedOn(t, "stopped early", r, body)

	r2 := httptest.NewRequest(http.MethodPost, "/", bytes.NewReader(body))
	steps = nil
	b.ReadUntil(r2, 100, 100_000, func(read []byte) bool { steps = append(steps, len(read)); return false })
	if got := b.used.Load(); fmt.Sprint(steps) != "[100 5000]" || got != 1600+int64(len(body)) {
		t.Errorf("announced: read in steps %v, want 100 then the rest; the budget holds %d", steps, got)
	}
	if _, whole, ok := Ahead(r2); !ok || !whole {
		t.Error("a body read to its end is not marked whole")
	}
	handedOn(t, "read whole", r2, body)

	r3 := httptest.NewRequest(http.MethodPost, "/", bytes.NewReader(body))
	r3.ContentLength = -1
	steps = nil
	b.ReadUntil(r3, 100, 100_000, func(read []byte) bool { steps = append(steps, len(read)); return false })
	if last := steps[len(steps)-1]; last != 10_000-1600-len(body) {
		t.Errorf("with %d free, read up to %d", 10_000-1600-len(body), last)
	}
	handedOn(t, "the budget spent", r3, body)

	end()
	testrun.Eventually(t, 10*time.Second, "the first request's bytes given back", func() bool { return b.used.Load() == 10_000-1600 })
}

// handedOn checks that the request's body reads as sent.
func handedOn(t *testing.T, name string, r *http.Request, want []byte) {
	t.Helper()
	got, err := io.ReadAll(r.Body)
	if err != nil || !bytes.Equal(got, want) {
		t.Errorf("%s: handed on %d bytes (%v), want the %d sent", name, len(got), err, len(want))
	}
}
