package caddymodule

import (
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"

	"github.com/lmwarden/caddy-warden/panel"
)

// adminMux mounts the warden admin routes as Caddy's admin server does and
// keeps the error each handler returned.
func adminMux(t *testing.T) (*http.ServeMux, *error) {
	t.Helper()
	mux := http.NewServeMux()
	var last error
	for _, route := range (Admin{}).Routes() {
		mux.HandleFunc(route.Pattern, func(w http.ResponseWriter, r *http.Request) {
			last = route.Handler.ServeHTTP(w, r)
			var apiErr caddy.APIError
			if errors.As(last, &apiErr) {
				http.Error(w, apiErr.Err.Error(), apiErr.HTTPStatus)
			} else if last != nil {
				http.Error(w, last.Error(), http.StatusInternalServerError)
			}
		})
	}
	return mux, &last
}

// liveModel applies a config load of a model named name, as Start does,
// until the test ends.
func liveModel(t *testing.T, name string) {
	t.Helper()
	liveLoad(t, name, &ModelConfig{Replicas: []ReplicaConfig{{Address: "127.0.0.1:9"}}})
}

// liveLoad is liveModel with the model's configuration, whose load it returns.
func liveLoad(t *testing.T, name string, cfg *ModelConfig) *modelLoad {
	t.Helper()
	l, err := loadModel(name, cfg, nil, nil, nil, zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = models.Delete(name) })
	l.activate()
	t.Cleanup(func() { l.live.Model().Deactivate(l.live, time.Now()) })
	return l
}

// The admin routes' refusals, in process. Their success path goes through
// Caddy's config API over the admin listener: reload_test.go covers it
// with a real Caddy.
func TestAdminRefusals(t *testing.T) {
	liveModel(t, "admin-unit")
	mux, last := adminMux(t)
	for _, c := range []struct {
		method, path, body string
		status             int
		want               string
	}{
		{"GET", "/warden/models/nope", "", 404, `unknown model "nope"`},
		{"POST", "/warden/models/nope/affinity", `{"enabled":false}`, 404, `unknown model "nope"`},
		{"POST", "/warden/models/nope/spill_threshold", `{"value":4}`, 404, `unknown model "nope"`},

		{"POST", "/warden/models/admin-unit/affinity", ``, 400, "decoding request body: EOF"},
		{"POST", "/warden/models/admin-unit/affinity", `enabled`, 400, "decoding request body: invalid character"},
		{"POST", "/warden/models/admin-unit/affinity", `{"enabled":"no"}`, 400, "decoding request body: json: cannot unmarshal string"},
		{"POST", "/warden/models/admin-unit/affinity", `{"enabled":false,"model":"x"}`, 400, `decoding request body: json: unknown field "model"`},
		{"POST", "/warden/models/admin-unit/affinity", `{"enable":false}`, 400, `decoding request body: json: unknown field "enable"`},
		{"POST", "/warden/models/admin-unit/affinity", `{"enabled":false} {"enabled":true}`, 400, `decoding request body: trailing data after the JSON object`},
		{"POST", "/warden/models/admin-unit/affinity", `{}`, 400, `expected {"enabled": true|false}`},
		{"POST", "/warden/models/admin-unit/affinity", `{"enabled":null}`, 400, `expected {"enabled": true|false}`},
		{"POST", "/warden/models/admin-unit/affinity", `{"enabled":true` + strings.Repeat(" ", 70<<10) + `}`, 400, "request body too large"},

		{"POST", "/warden/models/admin-unit/spill_threshold", `{"value":0}`, 400, `expected {"value": n} with n >= 1, or {"auto": true}`},
		{"POST", "/warden/models/admin-unit/spill_threshold", `{"value":-2}`, 400, `expected {"value": n} with n >= 1, or {"auto": true}`},
		{"POST", "/warden/models/admin-unit/spill_threshold", `{"value":2,"auto":true}`, 400, `expected {"value": n} with n >= 1, or {"auto": true}`},
		{"POST", "/warden/models/admin-unit/spill_threshold", `{"auto":false}`, 400, `expected {"value": n} with n >= 1, or {"auto": true}`},
		{"POST", "/warden/models/admin-unit/spill_threshold", `{}`, 400, `expected {"value": n} with n >= 1, or {"auto": true}`},
		{"POST", "/warden/models/admin-unit/spill_threshold", `{"value":2.5}`, 400, "decoding request body: json: cannot unmarshal number 2.5"},
		{"POST", "/warden/models/admin-unit/spill_threshold", `{"value":"4"}`, 400, "decoding request body: json: cannot unmarshal string"},
		{"POST", "/warden/models/admin-unit/spill_threshold", `{"threshold":4}`, 400, `decoding request body: json: unknown field "threshold"`},
		{"POST", "/warden/models/admin-unit/spill_threshold", `[4]`, 400, "decoding request body: json: cannot unmarshal array"},
	} {
		*last = nil
		w := httptest.NewRecorder()
		mux.ServeHTTP(w, httptest.NewRequest(c.method, c.path, strings.NewReader(c.body)))
		name := c.method + " " + c.path + " " + truncate(c.body, 40)
		var apiErr caddy.APIError
		if !errors.As(*last, &apiErr) {
			t.Errorf("%s: returned %v, not a caddy.APIError", name, *last)
			continue
		}
		if apiErr.HTTPStatus != c.status || w.Code != c.status {
			t.Errorf("%s: status %d (answered %d), want %d", name, apiErr.HTTPStatus, w.Code, c.status)
		}
		if !strings.Contains(apiErr.Err.Error(), c.want) {
			t.Errorf("%s: error %q does not say %q", name, apiErr.Err, c.want)
		}
	}
}

func truncate(s string, n int) string {
	if len(s) > n {
		return s[:n] + "..."
	}
	return s
}

// GET of a known model answers its panel; a valid POST that did not come
// through an admin listener is refused, not applied behind the config
// API's back.
func TestAdminKnownModelInProcess(t *testing.T) {
	liveModel(t, "admin-unit-get")
	mux, last := adminMux(t)

	w := httptest.NewRecorder()
	mux.ServeHTTP(w, httptest.NewRequest("GET", "/warden/models/admin-unit-get", nil))
	var st panel.ModelStatus
	if w.Code != 200 || *last != nil {
		t.Fatalf("GET: %d, %v", w.Code, *last)
	}
	if err := json.Unmarshal(w.Body.Bytes(), &st); err != nil || st.Model != "admin-unit-get" || len(st.Replicas) != 1 {
		t.Errorf("GET: %+v, %v", st, err)
	}

	w = httptest.NewRecorder()
	mux.ServeHTTP(w, httptest.NewRequest("GET", "/warden/models", nil))
	var list []panel.ModelStatus
	if err := json.Unmarshal(w.Body.Bytes(), &list); err != nil {
		t.Fatalf("GET /warden/models: %v", err)
	}
	found := false
	for _, m := range list {
		found = found || m.Model == "admin-unit-get"
	}
	if !found {
		t.Errorf("GET /warden/models lacks the model: %s", w.Body)
	}

	for path, body := range map[string]string{"affinity": `{"enabled":false}`, "spill_threshold": `{"auto":true}`} {
		*last = nil
		w := httptest.NewRecorder()
		mux.ServeHTTP(w, httptest.NewRequest("POST", "/warden/models/admin-unit-get/"+path, strings.NewReader(body)))
		var apiErr caddy.APIError
		if !errors.As(*last, &apiErr) || apiErr.HTTPStatus != http.StatusNotImplemented {
			t.Errorf("POST %s without an admin listener: %v, want a 501 APIError", path, *last)
		}
	}
	if l, _ := appliedModel("admin-unit-get"); l.Plan().View().Affinity() != true {
		t.Error("a refused POST changed the setting")
	}
}
