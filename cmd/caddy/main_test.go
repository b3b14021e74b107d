package main

import (
	"encoding/json"
	"go/parser"
	"go/token"
	"os"
	"runtime/debug"
	"slices"
	"strconv"
	"testing"
)

const caddyModule = "github.com/caddyserver/caddy/v2"

// manifest is xcaddy.json, the build manifest `make caddy` builds from.
type manifest struct {
	CaddyVersion string   `json:"caddy_version"`
	Plugins      []plugin `json:"plugins"`
}

// plugin is one `--with module=replace` of the xcaddy command.
type plugin struct {
	Module  string `json:"module"`
	Replace string `json:"replace"`
}

func readManifest(t *testing.T) manifest {
	t.Helper()
	data, err := os.ReadFile("../../xcaddy.json")
	if err != nil {
		t.Fatal(err)
	}
	var m manifest
	if err := json.Unmarshal(data, &m); err != nil {
		t.Fatalf("xcaddy.json: %v", err)
	}
	return m
}

// xcaddy builds the Caddy version of xcaddy.json; the tests run against the
// version of go.mod. They must be the same Caddy, and xcaddy.json must
// list this module as a plugin built from the checkout.
func TestBuildManifestMatchesModule(t *testing.T) {
	m := readManifest(t)
	info, ok := debug.ReadBuildInfo()
	if !ok {
		t.Fatal("no build info")
	}
	var caddyVersion string
	for _, dep := range info.Deps {
		if dep.Path == caddyModule {
			caddyVersion = dep.Version
		}
	}
	if caddyVersion != m.CaddyVersion {
		t.Errorf("xcaddy.json says Caddy %s, go.mod builds %s", m.CaddyVersion, caddyVersion)
	}
	if !slices.Contains(m.Plugins, plugin{Module: info.Main.Path, Replace: "./"}) {
		t.Errorf("xcaddy.json plugins %+v do not include %s=./", m.Plugins, info.Main.Path)
	}
}

// main.go must import what xcaddy's generated main.go imports for
// xcaddy.json (xcaddy v0.4.5, environment.go, mainModuleTemplate): Caddy's
// cmd and standard modules, and each plugin's module path, which is a
// package only if the module has a root package.
func TestMainImportsWhatXcaddyGenerates(t *testing.T) {
	m := readManifest(t)
	want := []string{caddyModule + "/cmd", caddyModule + "/modules/standard"}
	for _, p := range m.Plugins {
		want = append(want, p.Module)
	}
	f, err := parser.ParseFile(token.NewFileSet(), "main.go", nil, parser.ImportsOnly)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, imp := range f.Imports {
		path, err := strconv.Unquote(imp.Path.Value)
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, path)
	}
	slices.Sort(got)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Errorf("main.go imports %q; xcaddy generates %q", got, want)
	}
}
