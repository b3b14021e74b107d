package caddymodule

import (
	"errors"
	"fmt"
	"net/http"
	"path"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/lmwarden/caddy-warden/readahead"
	"github.com/lmwarden/caddy-warden/sessionkey"
)

func init() {
	caddy.RegisterModule(MatchModel{})
}

// MatchModel (`warden_model` in a Caddyfile) matches requests whose JSON
// body names a model one of its patterns matches: the top-level "model" of
// an Anthropic Messages (count_tokens too), Chat Completions or Responses
// request. A farm that serves several models behind one address routes
// each to its own reverse_proxy with it:
//
//	@small warden_model claude-haiku-* qwen3-4b
//	reverse_proxy @small {
//		dynamic warden qwen3-4b
//		lb_policy warden qwen3-4b
//	}
//
// Patterns are Go's path.Match globs, as Caddy's path matcher uses them:
// `*` is any run of characters but `/`, `?` one character, `[...]` a
// class; names are case-sensitive, as vLLM's are. A body that cannot be
// read, is not JSON or names no model matches nothing (the request goes on
// to the next route). The body is handed on intact.
type MatchModel []string

// CaddyModule returns the Caddy module information.
func (MatchModel) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "http.matchers.warden_model",
		New: func() caddy.Module { return new(MatchModel) },
	}
}

// UnmarshalCaddyfile reads `warden_model <pattern>...`; patterns given on
// several lines of a matcher block add up.
func (m *MatchModel) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	for d.Next() {
		patterns := d.RemainingArgs()
		if len(patterns) == 0 {
			return d.Err("warden_model: expected at least one model name or pattern, e.g. warden_model claude-haiku-* qwen3-4b")
		}
		for _, p := range patterns {
			if err := checkPattern(p); err != nil {
				return d.Err(err.Error())
			}
		}
		*m = append(*m, patterns...)
		if d.NextBlock(0) {
			return d.Errf("warden_model takes no block, found %q", d.Val())
		}
	}
	return nil
}

// Validate checks the patterns of a JSON config.
func (m MatchModel) Validate() error {
	if len(m) == 0 {
		return errors.New("warden_model: expected at least one model name or pattern")
	}
	for _, p := range m {
		if err := checkPattern(p); err != nil {
			return err
		}
	}
	return nil
}

func checkPattern(p string) error {
	if _, err := path.Match(p, ""); err != nil {
		return fmt.Errorf("warden_model: pattern %q: %v (patterns are Go's path.Match globs: * ? [...])", p, err)
	}
	return nil
}

// MatchWithError reports whether the request's body names a model that one
// of the patterns matches; it never fails.
func (m MatchModel) MatchWithError(r *http.Request) (bool, error) {
	model := requestModel(r)
	if model == "" {
		return false, nil
	}
	for _, p := range m {
		if ok, _ := path.Match(p, model); ok {
			return true, nil
		}
	}
	return false, nil
}

// varModel is the request variable that keeps the model its body names
// ("" for none) once read: every warden_model matcher of the request reads
// it, and logs may show it as {http.vars.warden.model}.
const varModel = "warden.model"

// How much of a body is read for its model: a first read that holds the
// model of the agents that write it first (Claude Code, Codex, OpenCode and
// Qwen Code all do), then the rest of a body of announced length, else as
// much again at each step, up to maxModelScan, for clients that write it
// after the conversation (Python's OpenAI SDK).
const (
	firstModelRead = 4 << 10
	maxModelScan   = 8 << 20
	// maxModelName bounds the name read: no server names a model with
	// more, and matching stays cheap.
	maxModelName = 1 << 10
)

// requestModel is the model r's JSON body names, read once per request as
// far as it takes to find it, and the bytes read handed on intact.
func requestModel(r *http.Request) string {
	ctx := r.Context()
	if model, ok := caddyhttp.GetVar(ctx, varModel).(string); ok {
		return model
	}
	var model []byte
	if readahead.MayBeJSON(r) {
		heldBodies.ReadUntil(r, firstModelRead, maxModelScan, func(read []byte) bool {
			var more bool
			model, more = sessionkey.Model(read)
			return !more
		})
	}
	name := ""
	if len(model) <= maxModelName {
		name = string(model)
	}
	caddyhttp.SetVar(ctx, varModel, name)
	return name
}

var (
	_ caddyhttp.RequestMatcherWithError = MatchModel(nil)
	_ caddy.Validator                   = MatchModel(nil)
	_ caddyfile.Unmarshaler             = (*MatchModel)(nil)
)
