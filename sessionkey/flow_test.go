package sessionkey

import (
	"net/http"
	"testing"
)

func TestFlow(t *testing.T) {
	headers := func(kv ...string) http.Header {
		h := http.Header{}
		for i := 0; i+1 < len(kv); i += 2 {
			h.Set(kv[i], kv[i+1])
		}
		return h
	}
	alice := Flow(headers("Authorization", "Bearer sk-alice"), "")
	if alice == 0 {
		t.Fatal("a bearer token gave no flow")
	}
	for _, c := range []struct {
		name   string
		h      http.Header
		header string
		want   uint64
	}{
		{"the same key as x-api-key", headers("X-Api-Key", "sk-alice"), "", alice},
		{"Authorization before x-api-key", headers("Authorization", "Bearer sk-alice", "X-Api-Key", "sk-bob"), "", alice},
		{"the header configured, absent", headers("Authorization", "Bearer sk-alice"), "X-Team", alice},
		{"no credential", headers("X-Claude-Code-Session-Id", "s"), "", 0},
	} {
		if got := Flow(c.h, c.header); got != c.want {
			t.Errorf("%s: flow %x, want %x", c.name, got, c.want)
		}
	}
	red := Flow(headers("X-Team", "red", "Authorization", "Bearer sk-alice"), "X-Team")
	if red == 0 || red == alice || red != Flow(headers("X-Team", "red", "X-Api-Key", "sk-bob"), "X-Team") {
		t.Errorf("the configured header names the flow whatever the key: %x, %x", red, alice)
	}
	if bob := Flow(headers("X-Api-Key", "sk-bob"), ""); bob == alice || bob == 0 {
		t.Errorf("two keys, flows %x and %x", alice, bob)
	}
	// Keyed by the process: not the unkeyed hash a reader could test
	// guesses against.
	if alice == Hash("sk-alice") {
		t.Error("the flow is the credential's unkeyed hash")
	}
}
