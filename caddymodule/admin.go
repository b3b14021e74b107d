package caddymodule

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/lmwarden/caddy-warden/livemodel"
	"github.com/lmwarden/caddy-warden/panel"
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
// Settings are configuration: the POST routes are shortcuts for
// `POST /config/apps/warden/models/{model}/affinity` (or spill_threshold)
// and go through Caddy's config API, so the running config, its autosave
// and routing never disagree. Every reload keeps pins and counters.
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
	out := []panel.ModelStatus{}
	for _, l := range appliedModels() {
		out = append(out, panel.Status(l, now))
	}
	return writeJSON(w, out)
}

func getModel(w http.ResponseWriter, r *http.Request) error {
	l, err := modelOf(r)
	if err != nil {
		return err
	}
	return writeJSON(w, panel.Status(l, time.Now()))
}

func setAffinity(w http.ResponseWriter, r *http.Request) error {
	l, err := modelOf(r)
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
	return setModelOption(w, r, l.Model().Name(), "affinity", *body.Enabled)
}

func setSpillThreshold(w http.ResponseWriter, r *http.Request) error {
	l, err := modelOf(r)
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
		return setModelOption(w, r, l.Model().Name(), "spill_threshold", 0)
	case !body.Auto && body.Value != nil && *body.Value >= 1:
		return setModelOption(w, r, l.Model().Name(), "spill_threshold", *body.Value)
	}
	return badRequest(errors.New(`expected {"value": n} with n >= 1, or {"auto": true}`))
}

// setModelOption sets one option of a model through Caddy's config API,
// by asking the admin endpoint that received r, then answers with the
// model's panel under the new config.
func setModelOption(w http.ResponseWriter, r *http.Request, model, option string, value any) error {
	if err := changeModelOption(r, model, option, value); err != nil {
		return err
	}
	l, ok := appliedModel(model)
	if !ok {
		return caddy.APIError{HTTPStatus: http.StatusNotFound, Err: fmt.Errorf("model %q left the config", model)}
	}
	return writeJSON(w, panel.Status(l, time.Now()))
}

// changeModelOption sets one option of a model in the config. A config
// path cannot name a key with a "/" in it (Caddy splits the unescaped
// path), so a model named as Hugging Face names them (org/name) has its
// models object rewritten whole, provided it did not change since it was
// read.
func changeModelOption(r *http.Request, model, option string, value any) error {
	if !strings.Contains(model, "/") {
		_, _, err := configRequest(r, http.MethodPost, "/config/apps/warden/models/"+url.PathEscape(model)+"/"+option, value, "")
		return err
	}
	const path = "/config/apps/warden/models"
	current, etag, err := configRequest(r, http.MethodGet, path, nil, "")
	if err != nil {
		return err
	}
	if etag == "" { // without it, two changes at once could undo each other
		return fmt.Errorf("reading %s: the config API sent no ETag", path)
	}
	var models map[string]map[string]json.RawMessage
	if err := json.Unmarshal(current, &models); err != nil || models[model] == nil {
		return caddy.APIError{HTTPStatus: http.StatusNotFound, Err: fmt.Errorf("model %q is not in %s", model, path)}
	}
	if models[model][option], err = json.Marshal(value); err != nil {
		return err
	}
	_, _, err = configRequest(r, http.MethodPatch, path, models, etag)
	return err
}

// configRequest sends a request to path on the admin endpoint r came in
// on, with r's Host and Origin, which that endpoint has already accepted:
// value as its JSON body (none when nil), and ifMatch, when set, as its
// If-Match. It returns the answer's body and ETag.
func configRequest(r *http.Request, method, path string, value any, ifMatch string) (reply []byte, etag string, _ error) {
	local, ok := r.Context().Value(http.LocalAddrContextKey).(net.Addr)
	if !ok || r.TLS != nil {
		return nil, "", caddy.APIError{HTTPStatus: http.StatusNotImplemented,
			Err: fmt.Errorf("on this admin endpoint, change the setting with POST or PATCH %s", path)}
	}
	var body io.Reader = http.NoBody
	if value != nil {
		data, err := json.Marshal(value)
		if err != nil {
			return nil, "", err
		}
		body = bytes.NewReader(data)
	}
	req, err := http.NewRequestWithContext(r.Context(), method, "http://"+r.Host+path, body)
	if err != nil {
		return nil, "", err
	}
	if value != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if ifMatch != "" {
		req.Header.Set("If-Match", ifMatch)
	}
	if origin := r.Header.Get("Origin"); origin != "" {
		req.Header.Set("Origin", origin)
	}
	dialer := &net.Dialer{}
	client := &http.Client{Transport: &http.Transport{
		Proxy: nil,
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return dialer.DialContext(ctx, local.Network(), local.String())
		},
	}}
	defer client.CloseIdleConnections()
	verb := "changing"
	if method == http.MethodGet {
		verb = "reading"
	}
	resp, err := client.Do(req)
	if err != nil {
		return nil, "", fmt.Errorf("%s %s through the config API: %v", verb, path, err)
	}
	defer resp.Body.Close()
	msg, err := io.ReadAll(io.LimitReader(resp.Body, maxConfigReply+1))
	if err == nil && len(msg) > maxConfigReply {
		err = fmt.Errorf("over %d bytes", maxConfigReply)
	}
	if resp.StatusCode >= 300 {
		var apiErr struct {
			Error string `json:"error"`
		}
		if json.Unmarshal(msg, &apiErr) != nil || apiErr.Error == "" {
			apiErr.Error = string(bytes.TrimSpace(msg))
		}
		if resp.StatusCode == http.StatusPreconditionFailed {
			apiErr.Error += " (the config changed meanwhile: send the request again)"
		}
		return nil, "", caddy.APIError{HTTPStatus: resp.StatusCode, Err: fmt.Errorf("%s %s: %s", verb, path, apiErr.Error)}
	}
	if err != nil {
		return nil, "", fmt.Errorf("reading the answer to %s %s: %v", method, path, err)
	}
	return msg, resp.Header.Get("Etag"), nil
}

// maxConfigReply bounds what is read of a config API answer: the models
// object of a config, or an error.
const maxConfigReply = 4 << 20

func modelOf(r *http.Request) (*livemodel.Load, error) {
	name := r.PathValue("model")
	l, ok := appliedModel(name)
	if !ok {
		return nil, caddy.APIError{HTTPStatus: http.StatusNotFound, Err: fmt.Errorf("unknown model %q", name)}
	}
	return l, nil
}

func decodeBody(r *http.Request, v any) error {
	dec := json.NewDecoder(http.MaxBytesReader(nil, r.Body, 1<<16))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return badRequest(fmt.Errorf("decoding request body: %v", err))
	}
	if dec.More() {
		return badRequest(errors.New("decoding request body: trailing data after the JSON object"))
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
