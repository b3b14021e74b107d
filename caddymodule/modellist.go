package caddymodule

import (
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
)

func init() { registerHandler[ModelList]("warden_models", "handle") }

// ModelList (`warden_models` in a Caddyfile) answers `GET /v1/models`, and
// `GET /v1/models/<name>`, with the names of the warden models a site
// routes to and their aliases, so that agents that list models (Claude
// Code's gateway model discovery, the OpenAI and Anthropic SDKs) see the
// farm's names rather than one replica's. Every other request goes on to
// the next handler, so the directive may head a site:
//
//	:8080 {
//		warden_models
//		reverse_proxy @small { ... }
//		reverse_proxy { ... }
//	}
//
// The answer has the fields of both OpenAI's and Anthropic's model lists.
type ModelList struct {
	// Models are the warden models listed, by name; empty lists every model
	// of the config.
	Models []string `json:"models,omitempty"`

	list []byte            // the answer to GET /v1/models
	one  map[string][]byte // the answer to GET /v1/models/<name>, by name
}

// CaddyModule returns the Caddy module information.
func (ModelList) CaddyModule() caddy.ModuleInfo {
	return handlerInfo[ModelList]("warden_models")
}

// UnmarshalCaddyfile reads `warden_models [<model>...]`.
func (l *ModelList) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next() // directive name
	l.Models = d.RemainingArgs()
	if d.NextBlock(0) {
		return d.Errf("warden_models takes no block, found %q", d.Val())
	}
	return nil
}

// modelEntry is one name in the list: OpenAI's fields (id, object,
// created, owned_by) and Anthropic's (type, id, display_name, created_at).
type modelEntry struct {
	ID          string `json:"id"`
	Object      string `json:"object"`
	Created     int64  `json:"created"`
	OwnedBy     string `json:"owned_by"`
	Type        string `json:"type"`
	DisplayName string `json:"display_name"`
	CreatedAt   string `json:"created_at"`
}

// Provision reads the listed models' names and aliases from the warden app
// of its config and writes the answers once.
func (l *ModelList) Provision(ctx caddy.Context) error {
	app, err := ctx.App("warden")
	if err != nil {
		return fmt.Errorf("warden_models: loading the warden app: %v", err)
	}
	models := app.(*App).Models
	listed := l.Models
	if len(listed) == 0 {
		listed = slices.Sorted(maps.Keys(models))
		if len(listed) == 0 {
			return fmt.Errorf("warden_models: the config declares no warden model; declare them in the global warden option")
		}
	}
	now := time.Now().UTC()
	var entries []modelEntry
	l.one = map[string][]byte{}
	for _, model := range listed {
		cfg, ok := models[model]
		if !ok || cfg == nil {
			return fmt.Errorf("warden_models: unknown model %q; declare it in the global warden option", model)
		}
		for _, name := range append([]string{model}, cfg.Aliases...) {
			if _, dup := l.one[name]; dup {
				continue // a model listed twice
			}
			e := modelEntry{
				ID: name, Object: "model", Created: now.Unix(), OwnedBy: "warden",
				Type: "model", DisplayName: name, CreatedAt: now.Format(time.RFC3339),
			}
			entries = append(entries, e)
			if l.one[name], err = json.Marshal(e); err != nil {
				return err
			}
		}
	}
	l.list, err = json.Marshal(map[string]any{
		"object": "list", "data": entries,
		"has_more": false, "first_id": entries[0].ID, "last_id": entries[len(entries)-1].ID,
	})
	return err
}

// ServeHTTP answers GET and HEAD of /v1/models and /v1/models/<name>, and
// passes every other request on.
func (l *ModelList) ServeHTTP(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler) error {
	rest, listing := strings.CutPrefix(r.URL.Path, "/v1/models")
	name, one := strings.CutPrefix(rest, "/")
	if !listing || rest != "" && !one || r.Method != http.MethodGet && r.Method != http.MethodHead {
		return next.ServeHTTP(w, r)
	}
	body := l.list
	status := http.StatusOK
	if one {
		var ok bool
		if body, ok = l.one[name]; !ok {
			status = http.StatusNotFound
			body, _ = json.Marshal(map[string]any{"type": "error", "error": map[string]string{
				"type": "not_found_error", "code": "model_not_found",
				"message": fmt.Sprintf("The model `%s` does not exist.", name),
			}})
		}
	}
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	if r.Method == http.MethodGet {
		_, err := w.Write(body)
		return err
	}
	return nil
}

var (
	_ caddy.Provisioner           = (*ModelList)(nil)
	_ caddyhttp.MiddlewareHandler = (*ModelList)(nil)
	_ caddyfile.Unmarshaler       = (*ModelList)(nil)
)
