package caddymodule

import (
	"encoding/json"
	"net/http"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/lmwarden/caddy-warden/panel"
)

func init() { registerHandler[Panel]("warden_panel", "respond") }

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
// It serves the HTML page by default and its JSON twin (panel.Data) for
// `Accept: application/json` or `?format=json`. The page is self-contained
// (no request leaves the site) and refreshes itself from the JSON. It shows
// no session IDs, and it can sit behind basic_auth like any handler.
type Panel struct{}

// CaddyModule returns the Caddy module information.
func (Panel) CaddyModule() caddy.ModuleInfo {
	return handlerInfo[Panel]("warden_panel")
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

// handlerModule is a handler module whose Caddyfile directive is its own
// syntax.
type handlerModule[H any] interface {
	*H
	caddyhttp.MiddlewareHandler
	caddyfile.Unmarshaler
}

// handlerInfo is the module information of the handler H, whose ID names
// its Caddyfile directive as Caddy's own handlers do.
func handlerInfo[H any, P interface {
	*H
	caddy.Module
}](directive string) caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  caddy.ModuleID("http.handlers." + directive),
		New: func() caddy.Module { return P(new(H)) },
	}
}

// registerHandler registers the handler module H and its Caddyfile
// directive, ordered before another directive.
func registerHandler[H caddy.Module, P handlerModule[H]](directive, before string) {
	var module H
	caddy.RegisterModule(module)
	httpcaddyfile.RegisterHandlerDirective(directive, func(h httpcaddyfile.Helper) (caddyhttp.MiddlewareHandler, error) {
		m := P(new(H))
		err := m.UnmarshalCaddyfile(h.Dispenser)
		return m, err
	})
	httpcaddyfile.RegisterDirectiveOrder(directive, httpcaddyfile.Before, before)
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
	if panel.WantsJSON(r) {
		h.Set("Content-Type", "application/json")
		return json.NewEncoder(w).Encode(panel.NewData(time.Now(), appliedModels()))
	}
	html, policy := panel.Page()
	h.Set("Content-Type", "text/html; charset=utf-8")
	h.Set("Content-Security-Policy", policy)
	h.Set("Referrer-Policy", "no-referrer")
	_, err := w.Write(html)
	return err
}

var (
	_ caddyhttp.MiddlewareHandler = Panel{}
	_ caddyfile.Unmarshaler       = (*Panel)(nil)
)
