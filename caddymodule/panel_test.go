package caddymodule

import (
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2/caddyconfig"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	_ "github.com/caddyserver/caddy/v2/modules/caddyhttp/caddyauth" // basic_auth

	"github.com/lmwarden/caddy-warden/panel"
)

func TestPanelServeHTTP(t *testing.T) {
	serve := func(method, target, accept string) (*httptest.ResponseRecorder, error) {
		r := httptest.NewRequest(method, target, nil)
		r.Header.Set("Accept", accept)
		w := httptest.NewRecorder()
		return w, Panel{}.ServeHTTP(w, r, nil)
	}

	w, err := serve(http.MethodGet, "/anywhere/at/all", "text/html")
	if err != nil || w.Code != http.StatusOK {
		t.Fatalf("page: %d, %v", w.Code, err)
	}
	if ct := w.Header().Get("Content-Type"); !strings.HasPrefix(ct, "text/html") {
		t.Errorf("page Content-Type %q", ct)
	}
	if html, policy := panel.Page(); w.Header().Get("Content-Security-Policy") != policy || w.Body.String() != string(html) {
		t.Error("page served without its policy or body")
	}

	w, err = serve(http.MethodGet, "/warden/", "application/json")
	if err != nil || w.Code != http.StatusOK {
		t.Fatalf("JSON: %d, %v", w.Code, err)
	}
	var data panel.Data
	if err := json.Unmarshal(w.Body.Bytes(), &data); err != nil {
		t.Fatalf("JSON twin does not decode: %v\n%s", err, w.Body)
	}
	if data.RefreshMS <= 0 || data.Models == nil {
		t.Errorf("JSON twin: refresh %d ms, models %v", data.RefreshMS, data.Models)
	}

	_, err = serve(http.MethodPost, "/warden/", "")
	var herr caddyhttp.HandlerError
	if !errors.As(err, &herr) || herr.StatusCode != http.StatusMethodNotAllowed {
		t.Errorf("POST: got %v, want a 405 handler error", err)
	}
}

// In a site, basic_auth runs before the panel whatever the order written.
func TestPanelDirectiveOrder(t *testing.T) {
	const site = `http://127.0.0.1:8080 {
	warden_panel /warden/*
	basic_auth /warden/* {
		operator $2a$04$e1SlGYHjRkuVGzqpIPZu8.v0RGbBO4RThwkbQ8k20FMM5XwzNEPmK
	}
}`
	adapted, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(site), nil)
	if err != nil {
		t.Fatal(err)
	}
	var handlers []string
	for _, m := range regexp.MustCompile(`"handler":"([a-z_]+)"`).FindAllStringSubmatch(string(adapted), -1) {
		handlers = append(handlers, m[1])
	}
	auth, panel := slices.Index(handlers, "authentication"), slices.Index(handlers, "warden_panel")
	if auth < 0 || panel < 0 || auth > panel {
		t.Errorf("handlers in order %v: want authentication before warden_panel\n%s", handlers, adapted)
	}
}

func TestPanelCaddyfile(t *testing.T) {
	for _, tc := range []struct {
		input string
		ok    bool
	}{
		{"warden_panel", true},
		{"warden_panel {\n}", true},
		{"warden_panel extra", false},
		{"warden_panel {\n\trefresh 1s\n}", false},
	} {
		err := new(Panel).UnmarshalCaddyfile(caddyfile.NewTestDispenser(tc.input))
		if (err == nil) != tc.ok {
			t.Errorf("%q: error %v, want ok=%v", tc.input, err, tc.ok)
		}
	}
}
