package caddyproc

import (
	"context"
	"os"
	"path/filepath"
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
