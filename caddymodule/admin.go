package caddymodule

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/caddyserver/caddy/v2"
)

func init() {
	caddy.RegisterModule(Admin{})
}

// Admin serves the warden routes of Caddy's admin API:
//
//	GET  /warden/models                          every model's panel
//	GET  /warden/models/{model}                  one model's panel
//	POST /warden/models/{model}/affinity         {"enabled": bool}
//	POST /warden/models/{model}/spill_threshold  {"value": n} or {"auto": true}
//
// Runtime changes keep every pin and counter, and survive config reloads
// until the config itself changes that setting.
type Admin struct{}

// CaddyModule returns the Caddy module information.
func (Admin) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "admin.api.warden",
		New: func() caddy.Module { return new(Admin) },
	}
}

// Routes returns the admin routes.
func (Admin) Routes() []caddy.AdminRoute {
	return []caddy.AdminRoute{
		{Pattern: "GET /warden/models", Handler: caddy.AdminHandlerFunc(listModels)},
		{Pattern: "GET /warden/models/{model}", Handler: caddy.AdminHandlerFunc(getModel)},
		{Pattern: "POST /warden/models/{model}/affinity", Handler: caddy.AdminHandlerFunc(setAffinity)},
		{Pattern: "POST /warden/models/{model}/spill_threshold", Handler: caddy.AdminHandlerFunc(setSpillThreshold)},
	}
}

func listModels(w http.ResponseWriter, _ *http.Request) error {
	now := time.Now()
	out := []ModelStatus{}
	for _, name := range modelNames() {
		if m, ok := lookupModel(name); ok {
			out = append(out, m.status(now))
		}
	}
	return writeJSON(w, out)
}

func getModel(w http.ResponseWriter, r *http.Request) error {
	m, err := modelOf(r)
	if err != nil {
		return err
	}
	return writeJSON(w, m.status(time.Now()))
}

func setAffinity(w http.ResponseWriter, r *http.Request) error {
	m, err := modelOf(r)
	if err != nil {
		return err
	}
	var body struct {
		Enabled *bool `json:"enabled"`
	}
	if err := decodeBody(r, &body); err != nil {
		return err
	}
	if body.Enabled == nil {
		return badRequest(errors.New(`expected {"enabled": true|false}`))
	}
	m.router.SetAffinity(*body.Enabled)
	return writeJSON(w, m.status(time.Now()))
}

func setSpillThreshold(w http.ResponseWriter, r *http.Request) error {
	m, err := modelOf(r)
	if err != nil {
		return err
	}
	var body struct {
		Value *int `json:"value"`
		Auto  bool `json:"auto"`
	}
	if err := decodeBody(r, &body); err != nil {
		return err
	}
	switch {
	case body.Auto && body.Value == nil:
		m.router.SetSpillThreshold(0)
	case !body.Auto && body.Value != nil && *body.Value >= 1:
		m.router.SetSpillThreshold(*body.Value)
	default:
		return badRequest(errors.New(`expected {"value": n} with n >= 1, or {"auto": true}`))
	}
	return writeJSON(w, m.status(time.Now()))
}

func modelOf(r *http.Request) (*model, error) {
	name := r.PathValue("model")
	m, ok := lookupModel(name)
	if !ok {
		return nil, caddy.APIError{HTTPStatus: http.StatusNotFound, Err: fmt.Errorf("unknown model %q", name)}
	}
	return m, nil
}

func decodeBody(r *http.Request, v any) error {
	dec := json.NewDecoder(http.MaxBytesReader(nil, r.Body, 1<<16))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return badRequest(fmt.Errorf("decoding request body: %v", err))
	}
	return nil
}

func badRequest(err error) error {
	return caddy.APIError{HTTPStatus: http.StatusBadRequest, Err: err}
}

func writeJSON(w http.ResponseWriter, v any) error {
	w.Header().Set("Content-Type", "application/json")
	return json.NewEncoder(w).Encode(v)
}

var _ caddy.AdminRouter = Admin{}
