package caddymodule

import (
	"bytes"
	"crypto/sha256"
	"embed"
	"encoding/base64"
	"encoding/json"
	"html/template"
	"net/http"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/munnerz/goautoneg"
)

func init() {
	caddy.RegisterModule(Panel{})
	httpcaddyfile.RegisterHandlerDirective("warden_panel", parsePanelDirective)
	httpcaddyfile.RegisterDirectiveOrder("warden_panel", httpcaddyfile.Before, "respond")
}

// Panel is the operator's page (`warden_panel` in a Caddyfile): per model,
// the routing badges, one row per replica, the counters' start and a chart
// of prompt tokens per second (cached vs computed) and completion tokens per
// second over the last hour. Like Caddy's metrics handler it answers at
// whatever path it is mounted, e.g.
//
//	route /warden/* {
//		warden_panel
//	}
//
// It serves the HTML page by default and its JSON twin (PanelData) for
// `Accept: application/json` or `?format=json`. The page is self-contained
// (no request leaves the site) and refreshes itself from the JSON. It shows
// no session IDs, and it can sit behind basic_auth like any handler.
type Panel struct{}

// CaddyModule returns the Caddy module information.
func (Panel) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "http.handlers.warden_panel",
		New: func() caddy.Module { return new(Panel) },
	}
}

// UnmarshalCaddyfile reads `warden_panel`, which takes no arguments.
func (p *Panel) UnmarshalCaddyfile(d *caddyfile.Dispenser) error { return noOptions(d) }

// noOptions reads a directive that takes no arguments and no block.
func noOptions(d *caddyfile.Dispenser) error {
	d.Next() // directive name
	name := d.Val()
	if d.NextArg() {
		return d.ArgErr()
	}
	if d.NextBlock(0) {
		return d.Errf("%s takes no options, found %q", name, d.Val())
	}
	return nil
}

func parsePanelDirective(h httpcaddyfile.Helper) (caddyhttp.MiddlewareHandler, error) {
	p := new(Panel)
	err := p.UnmarshalCaddyfile(h.Dispenser)
	return p, err
}

// ServeHTTP answers GET and HEAD with the page or its JSON twin.
func (Panel) ServeHTTP(w http.ResponseWriter, r *http.Request, _ caddyhttp.Handler) error {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		w.Header().Set("Allow", "GET, HEAD")
		return caddyhttp.Error(http.StatusMethodNotAllowed, nil)
	}
	h := w.Header()
	h.Set("Cache-Control", "no-store")
	h.Set("X-Content-Type-Options", "nosniff")
	if wantsJSON(r) {
		h.Set("Content-Type", "application/json")
		return json.NewEncoder(w).Encode(panelData(time.Now()))
	}
	h.Set("Content-Type", "text/html; charset=utf-8")
	h.Set("Content-Security-Policy", panelPage.policy)
	h.Set("Referrer-Policy", "no-referrer")
	_, err := w.Write(panelPage.html)
	return err
}

// wantsJSON reports whether the request asks for the JSON twin: with
// ?format=json, or an Accept header that prefers JSON to HTML. Browsers
// navigating and clients without an Accept header get the page.
func wantsJSON(r *http.Request) bool {
	switch r.URL.Query().Get("format") {
	case "json":
		return true
	case "html":
		return false
	}
	return goautoneg.Negotiate(r.Header.Get("Accept"), []string{"text/html", "application/json"}) == "application/json"
}

//go:embed panelassets
var panelAssets embed.FS

// page is the panel's HTML with its style and script inline, and the
// Content-Security-Policy that allows exactly those and requests to its own
// origin.
type page struct {
	html   []byte
	policy string
}

var panelPage = buildPanelPage()

func buildPanelPage() page {
	read := func(name string) string {
		b, err := panelAssets.ReadFile("panelassets/" + name)
		if err != nil {
			panic(err) // embedded at build time: cannot fail
		}
		return string(b)
	}
	style, script := read("panel.css"), read("panel.js")
	tmpl := template.Must(template.New("panel").Parse(read("panel.html")))
	var html bytes.Buffer
	err := tmpl.Execute(&html, struct {
		Style  template.CSS
		Script template.JS
	}{template.CSS(style), template.JS(script)})
	if err != nil {
		panic(err)
	}
	return page{
		html: html.Bytes(),
		policy: "default-src 'none'; connect-src 'self'; img-src 'self' data:; " +
			"style-src " + sourceHash(style) + "; script-src " + sourceHash(script) +
			"; base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
	}
}

// sourceHash is the CSP source expression that allows one inline element.
func sourceHash(content string) string {
	sum := sha256.Sum256([]byte(content))
	return "'sha256-" + base64.StdEncoding.EncodeToString(sum[:]) + "'"
}

var (
	_ caddyhttp.MiddlewareHandler = Panel{}
	_ caddyfile.Unmarshaler       = (*Panel)(nil)
)
