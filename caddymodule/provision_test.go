package caddymodule

import (
	"fmt"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2"
)

// A JSON config (no Caddyfile parsing checked it) is refused before its
// model is built: ranks -1 panicked in Provision, which left the model
// referenced, and polling, after Caddy had moved on.
func TestInvalidModelIsRefusedBeforeItIsBuilt(t *testing.T) {
	home := t.TempDir()
	for _, env := range []string{"HOME", "XDG_DATA_HOME", "XDG_CONFIG_HOME"} {
		t.Setenv(env, home) // Caddy's storage and autosave stay in the test's directory
	}
	for _, ranks := range []int{-1, 0, 100_000_000} {
		cfg := fmt.Sprintf(`{"admin":{"disabled":true},"apps":{"warden":{"models":{"m":{"server":{"address":"127.0.0.1:1","ranks":%d}}}}}}`, ranks)
		err := caddy.Load([]byte(cfg), true)
		if err == nil || !strings.Contains(err.Error(), "needs ranks from 1 to 256") {
			t.Errorf("ranks %d: %v, want the load refused for its ranks", ranks, err)
		}
		if n, _ := models.References("m"); n != 0 {
			t.Errorf("ranks %d: the refused model is still referenced %d times", ranks, n)
		}
	}
}
