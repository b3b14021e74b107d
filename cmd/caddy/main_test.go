package main

import (
	"encoding/json"
	"os"
	"runtime/debug"
	"testing"
)

// The build manifest must describe what this command builds: the same Caddy
// version as go.mod, and this module as a plugin.
func TestBuildManifestMatchesModule(t *testing.T) {
	data, err := os.ReadFile("../../xcaddy.json")
	if err != nil {
		t.Fatal(err)
	}
	var manifest struct {
		CaddyVersion string `json:"caddy_version"`
		Plugins      []struct {
			Module  string `json:"module"`
			Replace string `json:"replace"`
		} `json:"plugins"`
	}
	if err := json.Unmarshal(data, &manifest); err != nil {
		t.Fatalf("xcaddy.json: %v", err)
	}
	info, ok := debug.ReadBuildInfo()
	if !ok {
		t.Fatal("no build info")
	}
	var caddyVersion string
	for _, dep := range info.Deps {
		if dep.Path == "github.com/caddyserver/caddy/v2" {
			caddyVersion = dep.Version
		}
	}
	if caddyVersion != manifest.CaddyVersion {
		t.Errorf("xcaddy.json says Caddy %s, go.mod builds %s", manifest.CaddyVersion, caddyVersion)
	}
	if len(manifest.Plugins) == 0 || manifest.Plugins[0].Module != info.Main.Path {
		t.Errorf("xcaddy.json plugins %+v do not include %s", manifest.Plugins, info.Main.Path)
	}
}
