package caddymodule

import (
	"errors"
	"fmt"
	"io"
	"net/http"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/lmwarden/caddy-warden/inflight"
)

func init() { registerHandler[StopReason]("warden_stop_reason", "reverse_proxy") }

// StopReason (`warden_stop_reason` in a Caddyfile, before the
// reverse_proxy whose lb_policy is warden) reads each reply's stop reason
// and usage as it streams through, for load control: a reply that ended
// the agent's task (no tool call: Anthropic's stop_reason end_turn,
// OpenAI's finish_reason stop, a completed Responses reply; see package
// replyend) hands the conversation back to a person, so its room goes to
// waiting turns at once instead of after linger; the prompt's size in the
// server's tokens sizes its conversation and teaches the bytes per token
// (selection/tokens.go), its cached part tells whether residency kept the
// cache. Replies of requests load control did not admit pass untouched and
// unread.
type StopReason struct{}

// CaddyModule returns the Caddy module information.
func (StopReason) CaddyModule() caddy.ModuleInfo {
	return handlerInfo[StopReason]("warden_stop_reason")
}

// UnmarshalCaddyfile reads `warden_stop_reason`, which takes no arguments.
func (s *StopReason) UnmarshalCaddyfile(d *caddyfile.Dispenser) error { return noOptions(d) }

// Provision tells the warden app of its config, if it has one, that the
// replies are read (checkRepliesRead).
func (StopReason) Provision(ctx caddy.Context) error {
	app, err := ctx.AppIfConfigured("warden")
	if errors.Is(err, caddy.ErrNotConfigured) {
		return nil
	}
	if err != nil {
		return err
	}
	app.(*App).repliesRead = true
	return nil
}

// checkRepliesRead refuses an lb_policy warden whose model needs the
// replies read (load control, KV cache events) in a config where no
// warden_stop_reason came before it. Caddy provisions a route's handlers
// in order, and the handler must come before reverse_proxy to see the
// replies; without it load control would never see a task end nor learn
// the prompts' size in tokens.
func checkRepliesRead(ctx caddy.Context, model string, cfg *ModelConfig) error {
	var needs string
	switch {
	case cfg.LoadControl != nil && cfg.LoadControl.Enabled:
		needs = "load_control on"
	case len(cfg.kvEvents()) > 0:
		needs = "kv_events"
	default:
		return nil
	}
	app, err := ctx.App("warden")
	if err != nil || app.(*App).repliesRead {
		return err
	}
	return fmt.Errorf("lb_policy warden %s: model %q has %s, which reads the replies: "+
		"add the warden_stop_reason directive to the site, before reverse_proxy (in JSON, a handler "+
		`{"handler": "warden_stop_reason"} before the reverse_proxy handler)`, model, model, needs)
}

// ServeHTTP passes the request on, and the reply's bytes, as they stream
// through, to what the request's end tells warden: whether the reply ended
// the agent's task, and the usage it reported (the prompt's size, its
// cached part, the reply's size). The request no longer offers the
// client's encodings upstream, so that the reply comes readable (Caddy's
// transport still takes a compressed one, decompressed); `encode`, ordered
// before, compresses for the client as it would.
func (StopReason) ServeHTTP(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler) error {
	r.Header.Del("Accept-Encoding")
	return next.ServeHTTP(&stopReasonWriter{ResponseWriterWrapper: &caddyhttp.ResponseWriterWrapper{ResponseWriter: w}, r: r}, r)
}

// stopReasonWriter hands what the reply writes to its inflight.Request,
// once it knows the request holds a ticket or goes to a replica whose KV
// cache events warden follows: warden's Select has run by the reply's
// first write.
type stopReasonWriter struct {
	*caddyhttp.ResponseWriterWrapper
	r       *http.Request
	checked bool
	held    *inflight.Request
}

// WriteHeader looks at the final reply's headers (not an interim 1xx's)
// before a handler outside this one (encode) adds its own.
func (w *stopReasonWriter) WriteHeader(status int) {
	if status >= http.StatusOK {
		w.check()
	}
	w.ResponseWriterWrapper.WriteHeader(status)
}

func (w *stopReasonWriter) Write(p []byte) (int, error) {
	w.check()
	if w.held != nil {
		w.held.ReadReply(p)
	}
	return w.ResponseWriterWrapper.Write(p)
}

// check decides, once, whether the reply is read: its request holds a
// ticket or goes to a replica whose KV cache events warden follows
// (warden's Select has run by the reply's first write), and the upstream
// sent it unencoded (one that compresses unasked is passed on unread).
func (w *stopReasonWriter) check() {
	if w.checked {
		return
	}
	w.checked = true
	if enc := w.Header().Get("Content-Encoding"); enc != "" && enc != "identity" {
		return
	}
	if held, ok := caddyhttp.GetVar(w.r.Context(), varInFlight).(*inflight.Request); ok && (held.Ticket != nil || held.NeedsUsage()) {
		w.held = held
	}
}

// ReadFrom goes through Write: the wrapper's own would hand the reader to
// the writer underneath, unread.
func (w *stopReasonWriter) ReadFrom(r io.Reader) (int64, error) {
	return io.Copy(writerOnly{w}, r)
}

type writerOnly struct{ io.Writer }

// Interface guards
var (
	_ caddyhttp.MiddlewareHandler = (*StopReason)(nil)
	_ caddyfile.Unmarshaler       = (*StopReason)(nil)
	_ caddy.Provisioner           = (*StopReason)(nil)
)
