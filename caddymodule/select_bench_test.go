package caddymodule

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
)

// BenchmarkSelectPinned is Select for a turn of a known conversation named
// by Claude Code's header: the whole policy (key, pick, vars, completion
// hook), with the request's own setup (a fresh vars table and context, as
// Caddy's server makes them) counted in.
func BenchmarkSelectPinned(b *testing.B) {
	fx := newSelectFixture(b, &ModelConfig{Replicas: []ReplicaConfig{{Address: addrA}, {Address: addrB}}}, nil)
	pl := pool(addrA, addrB)
	base := httptest.NewRequest(http.MethodPost, "/v1/messages", strings.NewReader(`{}`))
	base.Header.Set("X-Claude-Code-Session-Id", "5f0c8e3a-1b2c-4d5e-8f90-0123456789ab")
	base.Header.Set("Anthropic-Version", "2023-06-01")
	b.ReportAllocs()
	for b.Loop() {
		ctx, cancel := context.WithCancel(context.WithValue(context.Background(), caddyhttp.VarsCtxKey, map[string]any{}))
		r := base.WithContext(ctx)
		fx.p.Select(pl, r, nil)
		cancel()
	}
}

// BenchmarkSessionKeyHeader is the key of such a turn alone.
func BenchmarkSessionKeyHeader(b *testing.B) {
	cfg := &ModelConfig{}
	cfg.rules = cfg.newRules()
	r := httptest.NewRequest(http.MethodPost, "/v1/messages", strings.NewReader(`{}`))
	r.Header.Set("X-Claude-Code-Session-Id", "5f0c8e3a-1b2c-4d5e-8f90-0123456789ab")
	b.ReportAllocs()
	for b.Loop() {
		_ = sessionKey(r, cfg)
	}
}

// The rank header's spelling in policy.go is the one net/http stores.
func TestRankKeyIsCanonical(t *testing.T) {
	if http.CanonicalHeaderKey(RankHeader) != rankKey {
		t.Fatalf("%q is not the canonical %q", rankKey, http.CanonicalHeaderKey(RankHeader))
	}
}
