package caddymodule

import (
	"net/http"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"
)

func init() {
	caddy.RegisterModule(Upstreams{})
}

// Upstreams is the `warden` upstream source of reverse_proxy: a model's
// servers, as its warden block lists them, so that the addresses are
// written once:
//
//	reverse_proxy {
//		dynamic warden <model>
//		lb_policy warden <model>
//	}
type Upstreams struct {
	// Model names a model of the warden app.
	Model string `json:"model"`

	upstreams []*reverseproxy.Upstream
}

// CaddyModule returns the Caddy module information.
func (Upstreams) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "http.reverse_proxy.upstreams.warden",
		New: func() caddy.Module { return new(Upstreams) },
	}
}

// UnmarshalCaddyfile reads `dynamic warden <model>`.
func (u *Upstreams) UnmarshalCaddyfile(d *caddyfile.Dispenser) (err error) {
	u.Model, err = parseModelName(d, "dynamic warden")
	return err
}

// Provision lists the servers of the model in its own config.
func (u *Upstreams) Provision(ctx caddy.Context) error {
	l, err := modelOfConfig(ctx, u.Model, "dynamic warden")
	if err != nil {
		return err
	}
	for _, addr := range l.cfg.addresses() {
		u.upstreams = append(u.upstreams, &reverseproxy.Upstream{Dial: addr})
	}
	return nil
}

// GetUpstreams returns the model's servers. Like Caddy's own sources it
// hands out the same upstreams every time; the proxy keeps their state.
func (u *Upstreams) GetUpstreams(*http.Request) ([]*reverseproxy.Upstream, error) {
	return u.upstreams, nil
}

var (
	_ reverseproxy.UpstreamSource = (*Upstreams)(nil)
	_ caddy.Provisioner           = (*Upstreams)(nil)
	_ caddyfile.Unmarshaler       = (*Upstreams)(nil)
)
