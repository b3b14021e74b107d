package caddymodule_test

import (
	"bytes"
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2/caddyconfig"
	"github.com/caddyserver/caddy/v2/caddytest"
	_ "github.com/caddyserver/caddy/v2/modules/standard" // reverse_proxy, route, ...

	_ "github.com/lmwarden/caddy-warden/caddymodule"
)

var updateAdapt = flag.Bool("update", false, "rewrite the expected JSON of testdata/caddyfile_adapt/*.caddyfiletest")

// adaptSeparator splits a .caddyfiletest file: the Caddyfile, then the JSON
// it must adapt to, as in Caddy's caddytest/integration/caddyfile_adapt.
const adaptSeparator = "----------"

// Each testdata/caddyfile_adapt/*.caddyfiletest holds a Caddyfile, a line
// of ten dashes and the JSON the caddyfile adapter must make of it, in
// process (no Caddy binary). After an intended change to the adapted
// output, rewrite the expected JSON and review the diff before committing:
//
//	go test -run TestCaddyfileAdapt ./caddymodule -update
//	git diff caddymodule/testdata/caddyfile_adapt
func TestCaddyfileAdapt(t *testing.T) {
	files, err := filepath.Glob("testdata/caddyfile_adapt/*.caddyfiletest")
	if err != nil || len(files) == 0 {
		t.Fatalf("no adapt cases: %v", err)
	}
	for _, path := range files {
		t.Run(strings.TrimSuffix(filepath.Base(path), ".caddyfiletest"), func(t *testing.T) {
			data, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			input, expected, ok := strings.Cut(string(data), "\n"+adaptSeparator+"\n")
			if !ok {
				t.Fatalf("no %q line between the Caddyfile and the JSON", adaptSeparator)
			}
			input = strings.TrimSpace(input) + "\n"
			if *updateAdapt {
				adapted, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(input), nil)
				if err != nil {
					t.Fatalf("adapting: %v", err)
				}
				var pretty bytes.Buffer
				if err := json.Indent(&pretty, adapted, "", "\t"); err != nil {
					t.Fatal(err)
				}
				out := input + adaptSeparator + "\n" + pretty.String() + "\n"
				if err := os.WriteFile(path, []byte(out), 0o644); err != nil {
					t.Fatal(err)
				}
				return
			}
			// CompareAdapt prints a diff on stdout when they differ.
			if !caddytest.CompareAdapt(t, filepath.Base(path), input, "caddyfile", strings.TrimSpace(expected)) {
				t.Errorf("%s adapts to other JSON (diff above; -update rewrites it)", path)
			}
		})
	}
}
