package caddymodule

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"
	"go.uber.org/zap"

	"github.com/lmwarden/caddy-warden/inflight"
	"github.com/lmwarden/caddy-warden/livemodel"
	"github.com/lmwarden/caddy-warden/selection"
	"github.com/lmwarden/caddy-warden/sessionkey"
)

func init() {
	caddy.RegisterModule(Policy{})
}

// Request headers the policy reads or sets.
const (
	// RankHeader is vLLM's per-request choice of data-parallel engine.
	RankHeader = selection.RankHeader
	// ReplicaHeader lets a client choose a replica by ID (client_pinning on).
	ReplicaHeader = "X-Warden-Replica"
	// rankKey is RankHeader as net/http stores it: reading or deleting it by
	// this spelling costs no allocation (the same header on the wire).
	rankKey = "X-Data-Parallel-Rank"
)

// Request variables the policy sets, for `header_up` and logs, e.g.
// `header_up X-data-parallel-rank {http.vars.warden.rank}`.
const (
	varRank     = "warden.rank"
	varReplica  = "warden.replica"
	varOutcome  = "warden.outcome"
	varInFlight = "warden.in_flight" // *inflight.Request, internal; renders as ""
	// varKeySource says how the conversation was keyed: header, body,
	// fingerprint, or none.
	varKeySource = "warden.key_source"
)

// Policy is the `warden` load-balancing policy of reverse_proxy: it keeps
// each session on the replica that holds its prefix cache, places new
// sessions on the least-loaded replica and spills over a threshold. It
// routes with the settings of the config it belongs to, even while a newer
// config takes over.
type Policy struct {
	// Model names a model of the warden app.
	Model string `json:"model"`

	cfg    *ModelConfig
	view   *selection.View
	live   *livemodel.Model // keeps prompts for refreshes (refresh.go)
	clock  clock
	logger *zap.Logger
	warned *sync.Map // replica addresses reported as missing from the pool
}

// clock is the time the policy routes and holds turns by: the wall clock,
// or a test's.
type clock interface {
	Now() time.Time
	After(d time.Duration) <-chan time.Time
}

type wallClock struct{}

func (wallClock) Now() time.Time                         { return time.Now() }
func (wallClock) After(d time.Duration) <-chan time.Time { return time.After(d) }

// CaddyModule returns the Caddy module information.
func (Policy) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "http.reverse_proxy.selection_policies.warden",
		New: func() caddy.Module { return new(Policy) },
	}
}

// UnmarshalCaddyfile sets up the policy:
//
//	lb_policy warden <model>
func (p *Policy) UnmarshalCaddyfile(d *caddyfile.Dispenser) (err error) {
	p.Model, err = parseModelName(d, "lb_policy warden")
	return err
}

// Provision finds the policy's model in the warden app of its own config.
func (p *Policy) Provision(ctx caddy.Context) error {
	p.logger = ctx.Logger()
	p.clock = wallClock{}
	p.warned = new(sync.Map)
	l, err := modelOfConfig(ctx, p.Model, "lb_policy warden")
	if err != nil {
		return err
	}
	if err := checkRepliesRead(ctx, p.Model, l.cfg); err != nil {
		return err
	}
	p.cfg, p.view, p.live = l.cfg, l.live.Plan().View(), l.live.Model()
	return nil
}

// modelOfConfig is the named model of ctx's warden app.
func modelOfConfig(ctx caddy.Context, name, user string) (*modelLoad, error) {
	app, err := ctx.App("warden")
	if err != nil {
		return nil, fmt.Errorf("%s: loading the warden app: %v", user, err)
	}
	l, ok := app.(*App).load(name)
	if !ok {
		return nil, fmt.Errorf("%s: unknown model %q; declare it in the global warden option", user, name)
	}
	return l, nil
}

// keySources are the values of warden.key_source, made once so that setting
// one does not allocate.
var keySources = [...]any{
	sessionkey.None: sessionkey.None.String(), sessionkey.Header: sessionkey.Header.String(),
	sessionkey.Body: sessionkey.Body.String(), sessionkey.Fingerprint: sessionkey.Fingerprint.String(),
}

// Select picks the upstream of the replica chosen for r. It runs for every
// try of every request, so it does no I/O beyond the optional bounded body
// scan on the first try, and blocks only there, in the request's own
// goroutine, for a turn that load control holds.
func (p *Policy) Select(pool reverseproxy.UpstreamPool, r *http.Request, w http.ResponseWriter) *reverseproxy.Upstream {
	cfg, view := p.cfg, p.view.Current()
	ctx := r.Context()
	held, retry := caddyhttp.GetVar(ctx, varInFlight).(*inflight.Request)
	if !retry {
		held = &inflight.Request{ID: sessionKey(r, cfg)}
		caddyhttp.SetVar(ctx, varInFlight, held)
		caddyhttp.SetVar(ctx, varKeySource, keySources[held.ID.Source])
	}
	if held.TurnedAway || retry && held.Over() {
		return nil // a retry after its client left sends nothing
	}
	req := held.Routing()
	req.ClientReplica = clientReplica(r, cfg)
	req.Usable = func(addr string) bool { return p.usable(pool, addr) }
	if !retry {
		// A client that chose its replica is not held: load control would
		// count its conversation where it admits it, not where it goes.
		held.Body = requestBody(r) // once: a retry is the same prompt
		if view.WantsPrefix(held.ID.Key) {
			readPrefix(r, &held.Body)
		}
		if req.ClientReplica == "" && !p.admit(view, r, w, held, req) {
			held.TurnedAway = true
			return nil
		}
		context.AfterFunc(ctx, func() { held.Release(p.clock.Now()) })
	}
	req.PromptTokens, req.Prefix = view.EstimateTokens(held.Body.Bytes), held.Body.Prefix
	req.CountOnly = countsTokens(r)
	req.Now = p.clock.Now()
	if cfg.Server != nil && !view.Affinity() && req.ClientReplica == "" {
		// Affinity off with internal DP: vLLM's own balancer decides,
		// unless an allowed client chose its rank.
		if !held.Set(selection.Decision{}) {
			return nil
		}
		r.Header.Del(rankKey)
		caddyhttp.SetVar(ctx, varOutcome, "delegated")
		u := upstreamFor(pool, cfg.Server.Address)
		if u == nil {
			p.warnMissing(cfg.Server.Address)
		}
		return u
	}
	d := view.Pick(req)
	if _, ok := d.Replica(); !ok && view != p.view {
		d = p.view.Pick(req) // the new config lists none of this config's upstreams
	}
	if !held.Set(d) {
		return nil // its client left while it was routed
	}
	rep, ok := d.Replica()
	if !ok {
		return nil
	}
	u := upstreamFor(pool, rep.Address)
	if u == nil {
		p.warnMissing(rep.Address)
		return nil
	}
	caddyhttp.SetVar(ctx, varReplica, rep.ID)
	caddyhttp.SetVar(ctx, varOutcome, d.Outcome.String())
	if rep.SetsRank {
		rank := strconv.Itoa(rep.Rank)
		r.Header.Set(rankKey, rank)
		caddyhttp.SetVar(ctx, varRank, rank)
	}
	return u
}

// usable reports whether the pool's upstream for a replica address can
// take a request now.
func (p *Policy) usable(pool reverseproxy.UpstreamPool, addr string) bool {
	u := upstreamFor(pool, addr)
	if u == nil {
		p.warnMissing(addr)
		return false
	}
	return u.Available()
}

// clientReplica is the replica a client asked for, when allowed; otherwise
// the client's choice is removed from the request.
func clientReplica(r *http.Request, cfg *ModelConfig) string {
	rank, byID := r.Header.Get(rankKey), r.Header.Get(ReplicaHeader)
	r.Header.Del(ReplicaHeader)
	if !cfg.ClientPinning {
		r.Header.Del(rankKey)
		return ""
	}
	if cfg.Server != nil && rank != "" {
		if n, err := strconv.Atoi(rank); err == nil && n >= 0 && n < cfg.Server.Ranks {
			return cfg.Server.Address + "#" + strconv.Itoa(n)
		}
		r.Header.Del(rankKey) // out of range: vLLM would refuse the request
		return ""
	}
	return byID
}

// upstreamFor finds the pool's upstream for a replica address.
func upstreamFor(pool reverseproxy.UpstreamPool, addr string) *reverseproxy.Upstream {
	for _, u := range pool {
		if u.Dial == addr {
			return u
		}
	}
	return nil
}

func (p *Policy) warnMissing(addr string) {
	if _, seen := p.warned.LoadOrStore(addr, true); !seen {
		p.logger.Warn("replica address is not an upstream of this reverse_proxy; list the same host:port in both",
			zap.String("model", p.Model), zap.String("replica", addr))
	}
}

var (
	_ reverseproxy.Selector = (*Policy)(nil)
	_ caddy.Provisioner     = (*Policy)(nil)
	_ caddyfile.Unmarshaler = (*Policy)(nil)
)
