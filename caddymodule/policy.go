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

	"github.com/lmwarden/caddy-warden/replyend"
	"github.com/lmwarden/caddy-warden/selection"
	"github.com/lmwarden/caddy-warden/sessionkey"
)

func init() {
	caddy.RegisterModule(Policy{})
}

// Request headers the policy reads or sets.
const (
	// RankHeader is vLLM's per-request choice of data-parallel engine.
	RankHeader = "X-data-parallel-rank"
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
	varInFlight = "warden.in_flight" // *inFlight, internal; renders as ""
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
	p.cfg, p.view = l.cfg, l.live.Plan().View()
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

// inFlight holds a request's current decision, so that a retry gives back
// the failed try's in-flight count and the request's end gives back the
// last, and its turn's place with load control, which the request's end
// ends. It also keeps the conversation's identity (hashed keys), read once
// per request; String hides it from placeholders such as
// {http.vars.warden.in_flight}.
type inFlight struct {
	id sessionkey.Identity
	// ticket is set on the first try, before the request's end can run
	// release; turnedAway is set then when load control refused the turn
	// or its client left while it waited, so that no retry sends it.
	ticket     *selection.Ticket
	turnedAway bool
	// body is the request body's size.
	body selection.Body
	// reply is what warden_stop_reason reads of the reply as it streams,
	// and release takes what it has read by then: a client may hang up at
	// the reply's last event, ending the request before the handler
	// returns.
	replyMu sync.Mutex
	reply   *replyend.Scanner

	// d is the current try's decision; ended is set when the request ended
	// (its client may leave while a try is routed, or before Caddy's
	// retry), after which no decision may be kept.
	mu    sync.Mutex
	d     selection.Decision
	ended bool
}

func (*inFlight) String() string { return "" }

// set makes d the request's decision and releases the previous try's. It
// reports false, and releases d at once, when the request has ended.
func (f *inFlight) set(d selection.Decision) bool {
	f.mu.Lock()
	old, ended := f.d, f.ended
	if !ended {
		f.d = d
	}
	f.mu.Unlock()
	old.Release()
	if ended {
		d.Release()
	}
	return !ended
}

// over reports whether the request has ended.
func (f *inFlight) over() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.ended
}

// needsUsage reports whether the current decision reads the reply's usage.
func (f *inFlight) needsUsage() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.d.NeedsUsage()
}

// readReply feeds the reply's next bytes to what release reads of it.
func (f *inFlight) readReply(p []byte) {
	f.replyMu.Lock()
	defer f.replyMu.Unlock()
	if f.reply == nil {
		f.reply = new(replyend.Scanner)
	}
	f.reply.Write(p)
}

// replyRead is what the reply told so far: whether it ended the agent's
// task, and its usage (the prompt's size, its cached part, the reply's
// size). It is zero for a reply not read.
func (f *inFlight) replyRead() selection.Reply {
	f.replyMu.Lock()
	defer f.replyMu.Unlock()
	if f.reply == nil {
		return selection.Reply{}
	}
	u := f.reply.Usage()
	return selection.Reply{
		TaskEnded:    f.reply.TaskEnded(),
		PromptTokens: u.PromptTokens, CachedTokens: u.CachedTokens, CacheReported: u.CacheReported,
		OutputTokens: u.OutputTokens,
	}
}

// release ends the request at now. It gives back the in-flight count
// first, so that a turn load control admits in the room the ticket's end
// frees sees it.
func (f *inFlight) release(now time.Time) {
	reply := f.replyRead()
	f.mu.Lock()
	d := f.d
	f.d, f.ended = selection.Decision{}, true
	f.mu.Unlock()
	d.End(now, reply)
	f.ticket.End(now, reply)
}

// Select picks the upstream of the replica chosen for r. It runs for every
// try of every request, so it does no I/O beyond the optional bounded body
// scan on the first try, and blocks only there, in the request's own
// goroutine, for a turn that load control holds.
func (p *Policy) Select(pool reverseproxy.UpstreamPool, r *http.Request, w http.ResponseWriter) *reverseproxy.Upstream {
	cfg := p.cfg
	ctx := r.Context()
	held, retry := caddyhttp.GetVar(ctx, varInFlight).(*inFlight)
	if !retry {
		held = &inFlight{id: sessionKey(r, cfg)}
		caddyhttp.SetVar(ctx, varInFlight, held)
		caddyhttp.SetVar(ctx, varKeySource, keySources[held.id.Source])
	}
	if held.turnedAway || retry && held.over() {
		return nil // a retry after its client left sends nothing
	}
	req := routeRequest(held.id)
	req.ClientReplica = clientReplica(r, cfg)
	req.Usable = func(addr string) bool { return p.usable(pool, addr) }
	if !retry {
		// A client that chose its replica is not held: load control would
		// count its conversation where it admits it, not where it goes.
		held.body = requestBody(r) // once: a retry is the same prompt
		if p.view.WantsPrefix(held.id.Key) {
			readPrefix(r, &held.body)
		}
		if req.ClientReplica == "" && !p.admit(r, w, held, pool) {
			held.turnedAway = true
			return nil
		}
		context.AfterFunc(ctx, func() { held.release(p.clock.Now()) })
	}
	req.PromptTokens, req.Prefix = p.view.EstimateTokens(held.body.Bytes), held.body.Prefix
	req.CountOnly = countsTokens(r)
	req.Now = p.clock.Now()
	if cfg.Server != nil && !p.view.Affinity() && req.ClientReplica == "" {
		// Affinity off with internal DP: vLLM's own balancer decides,
		// unless an allowed client chose its rank.
		if !held.set(selection.Decision{}) {
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
	d := p.view.Pick(req)
	if !held.set(d) {
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
