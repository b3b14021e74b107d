package main

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// A broken file link, a missing heading and a README over its lines are
// reported with their line; links in code and to the web are not checked.
func TestCheck(t *testing.T) {
	dir := t.TempDir()
	t.Chdir(dir)
	write := func(name, text string) {
		t.Helper()
		if err := os.MkdirAll(filepath.Dir(name), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(name, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("README.md", "# Title\n\nSee [the guide](docs/guide.md#several-caddy-instances-pin_store-redis), [a gap](docs/gone.md),\n"+
		"[here](#title), [nowhere](#missing), [the web](https://example.com/x.md).\n\n```sh\n[in code](nope.md)\n```\n`[inline](nope.md)`\n")
	write("docs/guide.md", "# Guide\n\n## Several Caddy instances (`pin_store redis`)\n\n## Guide\n\n[back](../README.md#title) [twice](#guide-1)\n")
	problems, err := check([]string{"README.md", "docs"}, 5)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		"README.md: 9 lines, more than 5",
		"README.md:3: link to docs/gone.md: no such file",
		"README.md:4: link to #missing: no such heading",
	}
	if !slices.Equal(problems, want) {
		t.Errorf("problems:\n%s\nwant:\n%s", strings.Join(problems, "\n"), strings.Join(want, "\n"))
	}
}

func TestSlug(t *testing.T) {
	for in, want := range map[string]string{
		"Follow vLLM's KV cache events":                            "follow-vllms-kv-cache-events",
		"Several Caddy instances sharing pins (`pin_store redis`)": "several-caddy-instances-sharing-pins-pin_store-redis",
		"[docs/agents.md](docs/agents.md): the fingerprint":        "docsagentsmd-the-fingerprint",
	} {
		if got := slugify(rendered(in)); got != want {
			t.Errorf("%q: %q, want %q", in, got, want)
		}
	}
}
