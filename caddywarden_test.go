package caddywarden_test

import (
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2"

	_ "github.com/lmwarden/caddy-warden"
)

// wardenModules are the Caddy module IDs that importing the root package
// must register, and the only ones of this repository it may register.
var wardenModules = []string{
	"admin.api.warden",
	"http.handlers.warden_models",
	"http.handlers.warden_panel",
	"http.handlers.warden_stop_reason",
	"http.matchers.warden_model",
	"http.reverse_proxy.selection_policies.warden",
	"http.reverse_proxy.upstreams.warden",
	"warden",
}

const modulePath = "github.com/lmwarden/caddy-warden"

// This test binary imports only the root package (and Caddy), as the main
// package xcaddy generates does; what it registers is what a user's Caddy gets.
func TestRootPackageRegistersEveryWardenModule(t *testing.T) {
	for _, id := range wardenModules {
		info, err := caddy.GetModule(id)
		if err != nil {
			t.Errorf("module %s not registered: %v", id, err)
			continue
		}
		if pkg := modulePackage(info); !strings.HasPrefix(pkg, modulePath+"/") {
			t.Errorf("module %s is registered by %s, not by this repository", id, pkg)
		}
	}
	// The other way: a module this repository registers but the list above
	// lacks is a module nobody checks (add it to wardenModules).
	for _, id := range caddy.Modules() {
		info, err := caddy.GetModule(id)
		if err != nil {
			t.Fatal(err)
		}
		if pkg := modulePackage(info); strings.HasPrefix(pkg, modulePath+"/") && !slices.Contains(wardenModules, id) {
			t.Errorf("module %s (package %s) is registered but not listed in wardenModules", id, pkg)
		}
	}
}

// modulePackage is the Go package of the type a Caddy module instantiates.
func modulePackage(info caddy.ModuleInfo) string {
	typ := reflect.TypeOf(info.New())
	for typ.Kind() == reflect.Pointer {
		typ = typ.Elem()
	}
	return typ.PkgPath()
}
