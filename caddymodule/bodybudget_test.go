package caddymodule

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
)

// A budget holds the bodies it read until their requests end, reads none
// announced past what it has free, reads a body of unannounced length only
// as far as it has free, and hands every body on intact.
func TestBodyBudget(t *testing.T) {
	b := &bodyBudget{limit: 1000}
	request := func(body string, announced bool) (*http.Request, context.CancelFunc) {
		ctx, end := context.WithCancel(context.Background())
		r := httptest.NewRequestWithContext(ctx, http.MethodPost, "/", strings.NewReader(body))
		if !announced {
			r.ContentLength = -1
		}
		return r, end
	}
	handedOn := func(name string, r *http.Request, want string) {
		t.Helper()
		got, err := io.ReadAll(r.Body)
		if err != nil || string(got) != want {
			t.Errorf("%s: handed on %d bytes (%v), want the %d sent", name, len(got), err, len(want))
		}
	}
	first := strings.Repeat("a", 600)
	r1, end1 := request(first, true)
	if data, whole := b.read(r1, 800); !whole || string(data) != first {
		t.Fatalf("600 bytes within the budget: read %d, whole %v", len(data), whole)
	}
	if got := b.used.Load(); got != 600 {
		t.Errorf("after reading 600 bytes the budget holds %d", got)
	}
	handedOn("read whole", r1, first)

	second := strings.Repeat("b", 500)
	r2, end2 := request(second, true)
	if data, whole := b.read(r2, 800); data != nil || whole {
		t.Errorf("500 bytes announced with 400 free: read %d, whole %v; want none read", len(data), whole)
	}
	handedOn("announced past the budget", r2, second)

	r3, end3 := request(second, false)
	if data, whole := b.read(r3, 800); len(data) != 400 || whole {
		t.Errorf("500 bytes unannounced with 400 free: read %d, whole %v; want 400, partial", len(data), whole)
	}
	if got := b.used.Load(); got != 1000 {
		t.Errorf("the budget holds %d, want all 1000", got)
	}
	handedOn("unannounced past the budget", r3, second)

	r4, end4 := request(first, true)
	if data, whole := b.read(r4, 500); data != nil || whole {
		t.Errorf("600 bytes announced past the limit of 500: read %d", len(data))
	}
	handedOn("past the limit", r4, first)

	ran := false
	if b.during(1, func() { ran = true }) || ran {
		t.Error("with the budget all taken, during ran its function")
	}
	end3()
	waitFor(t, "the third request's body given back", func() bool { return b.used.Load() == 600 })
	if !b.during(400, func() { ran = b.used.Load() == 1000 }) || !ran || b.used.Load() != 600 {
		t.Errorf("during with 400 bytes free: ran %v, the budget holds %d after, want 600", ran, b.used.Load())
	}
	for _, end := range []context.CancelFunc{end1, end2, end4} {
		end()
	}
	waitFor(t, "the ended requests' bodies given back", func() bool { return b.used.Load() == 0 })
}

// Requests racing for the budget never take more than it holds.
func TestBodyBudgetRace(t *testing.T) {
	b := &bodyBudget{limit: 350}
	body := strings.Repeat("x", 100)
	var mu sync.Mutex
	wholes := 0
	ctx, end := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for range 16 {
		wg.Go(func() {
			r := httptest.NewRequestWithContext(ctx, http.MethodPost, "/", strings.NewReader(body))
			if _, whole := b.read(r, 1000); whole {
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
	waitFor(t, "the bodies given back", func() bool { return b.used.Load() == 0 })
}
