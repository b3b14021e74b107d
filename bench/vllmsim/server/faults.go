package server

import (
	"encoding/json"
	"fmt"
	"net/http"
	"time"
)

// MetricsFault is how GET /metrics misbehaves.
type MetricsFault string

// The /metrics faults.
const (
	MetricsOK       MetricsFault = "ok"       // normal exposition
	MetricsSlow     MetricsFault = "slow"     // normal exposition after MetricsDelay
	MetricsGarbage  MetricsFault = "garbage"  // 200 with a body that is not Prometheus text
	MetricsHuge     MetricsFault = "huge"     // normal exposition followed by megabytes of filler series
	MetricsNaN      MetricsFault = "nan"      // every gauge and counter is NaN
	MetricsNegative MetricsFault = "negative" // every gauge and counter is below zero
	MetricsMissing  MetricsFault = "missing"  // 200 without any vllm: series
)

var metricsFaults = []MetricsFault{MetricsOK, MetricsSlow, MetricsGarbage, MetricsHuge, MetricsNaN, MetricsNegative, MetricsMissing}

// Duration is a time.Duration that reads and writes JSON as a string such as "5s".
type Duration time.Duration

// String formats the duration as time.Duration does.
func (d Duration) String() string { return time.Duration(d).String() }

// MarshalJSON writes the duration as a string.
func (d Duration) MarshalJSON() ([]byte, error) { return json.Marshal(time.Duration(d).String()) }

// UnmarshalJSON reads a string such as "250ms".
func (d *Duration) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return fmt.Errorf("duration must be a string such as \"5s\": %w", err)
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		return err
	}
	*d = Duration(v)
	return nil
}

// Faults are the switches reliability tests flip, through flags, POST /sim/faults or SetFaults.
type Faults struct {
	// Metrics is how /metrics answers ("" means ok).
	Metrics MetricsFault `json:"metrics"`
	// MetricsDelay is how long a slow /metrics waits (default 5s).
	MetricsDelay Duration `json:"metrics_delay"`
	// HealthStatus, when not 0, is the status GET /health returns (503: engine dead).
	HealthStatus int `json:"health_status"`
	// Refuse closes the listening port and every open connection until it is cleared.
	Refuse bool `json:"refuse"`
	// RefuseFor clears Refuse by itself after this long (needed when no control port exists).
	RefuseFor Duration `json:"refuse_for"`
	// DieMidStream drops the connection halfway through each reply.
	DieMidStream bool `json:"die_mid_stream"`
}

// defaultMetricsDelay is how long a slow /metrics waits when no delay is given.
const defaultMetricsDelay = 5 * time.Second

// validate reports the first switch that makes no sense. canClearRefuse says whether a
// refusal can be lifted without RefuseFor (a control port or an in-process caller exists).
func (f Faults) validate(canClearRefuse bool) error {
	known := f.Metrics == ""
	for _, m := range metricsFaults {
		known = known || f.Metrics == m
	}
	switch {
	case !known:
		return fmt.Errorf("unknown metrics fault %q (want one of %v)", f.Metrics, metricsFaults)
	case f.HealthStatus != 0 && (f.HealthStatus < 100 || f.HealthStatus > 599):
		return fmt.Errorf("health_status %d is not an HTTP status", f.HealthStatus)
	case f.MetricsDelay < 0 || f.RefuseFor < 0:
		return fmt.Errorf("durations must not be negative")
	case f.Refuse && f.RefuseFor == 0 && !canClearRefuse:
		return fmt.Errorf("refuse without refuse_for would close the only port for good: give refuse_for or run with --control-port")
	}
	return nil
}

func (f Faults) metricsDelay() time.Duration {
	if f.MetricsDelay == 0 {
		return defaultMetricsDelay
	}
	return time.Duration(f.MetricsDelay)
}

// Faults returns the switches in force.
func (s *Server) Faults() Faults {
	s.faultsMu.Lock()
	defer s.faultsMu.Unlock()
	return s.faults
}

// SetFaults replaces every switch. A refusal takes effect at once; it ends when cleared, or
// after RefuseFor.
func (s *Server) SetFaults(f Faults) error {
	if err := f.validate(true); err != nil {
		return err
	}
	s.applyFaults(f)
	return nil
}

func (s *Server) applyFaults(f Faults) {
	s.faultsMu.Lock()
	s.faults = f
	s.refuseGeneration++
	generation := s.refuseGeneration
	s.faultsMu.Unlock()
	s.setRefusing(f.Refuse)
	if f.Refuse && f.RefuseFor > 0 {
		time.AfterFunc(time.Duration(f.RefuseFor), func() { s.endRefusal(generation) })
	}
}

// endRefusal lifts the refusal set by applyFaults call number generation, unless the
// switches changed since.
func (s *Server) endRefusal(generation uint64) {
	s.faultsMu.Lock()
	current := s.refuseGeneration == generation
	if current {
		s.faults.Refuse, s.faults.RefuseFor = false, 0
	}
	s.faultsMu.Unlock()
	if current {
		s.setRefusing(false)
	}
}

// handleFaults serves /sim/faults: GET shows the switches, POST merges the JSON body into
// them (fields left out keep their value), DELETE clears them all. The answer is the switches
// now in force: they apply before it is sent, so the client's next request sees them, except
// for a refusal, which must let the answer out before it closes the connection.
func (s *Server) handleFaults(w http.ResponseWriter, r *http.Request) {
	f := s.Faults()
	switch r.Method {
	case http.MethodGet:
		writeJSON(w, http.StatusOK, f)
		return
	case http.MethodDelete:
		f = Faults{}
	case http.MethodPost:
		if err := json.NewDecoder(r.Body).Decode(&f); err != nil {
			writeJSON(w, http.StatusBadRequest, map[string]string{"error": "bad faults JSON: " + err.Error()})
			return
		}
		if err := f.validate(s.cfg.ControlPort != 0); err != nil {
			writeJSON(w, http.StatusBadRequest, map[string]string{"error": err.Error()})
			return
		}
	default:
		w.Header().Set("Allow", "GET, POST, DELETE")
		http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
		return
	}
	if !f.Refuse {
		s.applyFaults(f)
		writeJSON(w, http.StatusOK, f)
		return
	}
	writeJSON(w, http.StatusOK, f)
	http.NewResponseController(w).Flush()
	s.applyFaults(f)
}
