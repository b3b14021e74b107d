package caddyproc

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
)

func TestModulePath(t *testing.T) {
	dir := t.TempDir()
	for text, want := range map[string]string{
		"module github.com/lmwarden/caddy-warden\n\ngo 1.26.0\n":          Module,
		"// c\nmodule \"github.com/lmwarden/caddy-warden/bench\"\n":       Module + "/bench",
		"modulex foo\nmodule\tgithub.com/lmwarden/caddy-warden // note\n": Module,
		"go 1.26.0\n": "",
	} {
		path := filepath.Join(dir, "go.mod")
		if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
		if got := modulePath(path); got != want {
			t.Errorf("modulePath(%q) = %q, want %q", text, got, want)
		}
	}
	if got := modulePath(filepath.Join(dir, "none", "go.mod")); got != "" {
		t.Errorf("missing go.mod: %q", got)
	}
}

// From this package, the root module is two directories up.
func TestRootDir(t *testing.T) {
	root, err := RootDir(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	want, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	if root != want {
		t.Errorf("RootDir = %s, want %s", root, want)
	}
}

// A load whose connection the admin server closed unanswered, as the one
// it replaces does, is sent again with the same body; another POST is not.
func TestDoSendsALoadAgainAfterABrokenConnection(t *testing.T) {
	var mu sync.Mutex
	var bodies []string
	received := func() []string { mu.Lock(); defer mu.Unlock(); return slices.Clone(bodies) }
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		mu.Lock()
		bodies = append(bodies, r.URL.Path+" "+string(body))
		first := len(bodies)%2 == 1
		mu.Unlock()
		if first { // every first try: closed unanswered
			conn, _, err := w.(http.Hijacker).Hijack()
			if err == nil {
				conn.Close()
			}
		}
	}))
	defer srv.Close()
	p := &Process{Admin: strings.TrimPrefix(srv.URL, "http://")}
	if err := p.Do(http.MethodPost, "/load", []byte(`{"apps":{}}`), nil); err != nil {
		t.Fatalf("load: %v", err)
	}
	if want := []string{`/load {"apps":{}}`, `/load {"apps":{}}`}; !slices.Equal(received(), want) {
		t.Fatalf("admin server received %q, want %q", received(), want)
	}
	if err := p.Do(http.MethodPost, "/stop", nil, nil); err == nil || !ConnectionBroke(err) {
		t.Fatalf("POST /stop on a closed connection: %v, want the broken connection", err)
	}
	if got := received(); len(got) != 3 {
		t.Fatalf("admin server received %q: POST /stop sent again", got)
	}
}
