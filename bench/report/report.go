// Package report holds the benchmark's result rows and shows them: the text
// table of DESIGN §1 with the seed's own numbers beside ours, the JSON file of
// DESIGN §4, and PNG plots. Both the virtual-time lab and the end-to-end run
// produce Rows and hand them to this package.
package report

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"reflect"
	"time"

	"github.com/lmwarden/caddy-warden/bench/agentload"
)

// Modes of a Row.
const (
	// ModeLab is a virtual-time run of bench/lab.
	ModeLab = "lab"
	// ModeRun is an end-to-end run through Caddy and simulated replicas.
	ModeRun = "run"
	// ModeSeed is a row of the seed's own measurements (DESIGN §1).
	ModeSeed = "seed"
)

// Row is one policy at one concurrency level for one seed: the columns of the
// seed's table plus what helps explain them. Its JSON form is DESIGN §4's.
type Row struct {
	// Mode is ModeLab, ModeRun or ModeSeed.
	Mode string `json:"mode"`
	// Policy is the routing rule (DESIGN §4 names: warden, off, vllm, ...).
	Policy string `json:"policy"`
	// Sessions is the number of concurrent sessions (the level).
	Sessions int `json:"sessions"`
	// Seed drew the workload.
	Seed int64 `json:"seed"`
	// DurationS is the measured window in seconds.
	DurationS float64 `json:"duration_s"`

	SessionsPerHour    float64 `json:"sessions_per_hour"`
	OutputTokensPerMin float64 `json:"output_tokens_per_min"`
	// TTFBP50S and TTFBP95S are client-side time to first token percentiles, in seconds.
	TTFBP50S float64 `json:"ttfb_p50_s"`
	TTFBP95S float64 `json:"ttfb_p95_s"`
	// TTFBMeanS is their mean, in seconds (not in the seed's table).
	TTFBMeanS float64 `json:"ttfb_mean_s,omitempty"`
	// ConversationP50S, ConversationP95S and ConversationMeanS are the time
	// per conversation, from the send of its first turn to the last token of
	// its last turn, in seconds, over the ConversationsTimed conversations
	// sent in the window that finished (see agentload.Summary). With none
	// timed they are 0 and left out of the JSON. ConversationsCut counts
	// those sent in the window that had not finished when the load stopped:
	// at the window's end in a run, so that a run times only the
	// conversations that fit in its window, and at a cap well past it in
	// the lab, which lets them finish.
	ConversationP50S   float64 `json:"conversation_p50_s,omitempty"`
	ConversationP95S   float64 `json:"conversation_p95_s,omitempty"`
	ConversationMeanS  float64 `json:"conversation_mean_s,omitempty"`
	ConversationsTimed int     `json:"conversations_timed"`
	ConversationsCut   int     `json:"conversations_cut"`
	// ReplicasBusy averages, over one sample per second, the replicas with
	// requests in flight.
	ReplicasBusy float64 `json:"replicas_busy"`
	// PrefixHitPercent is prompt tokens served from cache over prompt tokens
	// requested, from the engines' own counters over the window: the GPU
	// prefix cache's (vllm:prefix_cache_hits over vllm:prefix_cache_queries).
	PrefixHitPercent float64 `json:"prefix_hit_percent"`
	// HostHitPercent is prompt tokens loaded from the replicas' host-memory
	// KV tiers over the same prompt tokens requested
	// (vllm:external_prefix_cache_hits), so that the two add up to what the
	// cache served; measured by the lab only.
	HostHitPercent float64 `json:"host_hit_percent,omitempty"`
	// HostTierGiB is each replica's host-memory KV tier in GiB, vLLM's
	// --kv-offloading-size; 0 is none.
	HostTierGiB float64 `json:"kv_offloading_size_gib,omitempty"`
	// StayedPercent is the mean share of a session's requests served by the
	// replica that served its first one.
	StayedPercent float64 `json:"stayed_percent"`
	// HitBoundPercent is the best prefix hit rate any router could reach on
	// the same request stream (see bench/lab for the exact definition).
	HitBoundPercent float64 `json:"hit_bound_percent"`

	// Requests counts the requests that ended in the window; Errors and Cut
	// (still in flight when the window closed) are among them.
	Requests          int `json:"requests"`
	Errors            int `json:"errors"`
	Cut               int `json:"cut"`
	SessionsCompleted int `json:"sessions_completed"`
	// Preemptions is the engines' preemption count over the window.
	Preemptions uint64 `json:"preemptions"`
	// ReplicaRequests is how many requests the row's replicas finished
	// over the window by their own counters (vllm:request_success), in an
	// end-to-end run: with two models, each model's replicas' own.
	ReplicaRequests int `json:"replica_requests,omitempty"`
	// Outcomes counts, for a warden policy in the lab, why it routed each
	// request where it did (sticky, placed, spilled, rehomed...), warm-up
	// included.
	Outcomes map[string]uint64 `json:"outcomes,omitempty"`
	// Replicas is the number of replicas (engines) behind the router.
	Replicas int `json:"replicas,omitempty"`
	// Topology is how the end-to-end run laid out replicas: servers or ranks.
	Topology string `json:"topology,omitempty"`
	// ThinkTimeS is the workload's mean think time in seconds and Workload
	// names its variant (lab.WorkloadVariants); wardenbench grid sets both.
	ThinkTimeS float64 `json:"think_time_s,omitempty"`
	Workload   string  `json:"workload,omitempty"`
	// Person names whose conversations the client-side columns measure,
	// of the people sharing the fleet (lab.Person; its Sessions and
	// ThinkTimeS are the person's); "" is everyone's.
	Person string `json:"person,omitempty"`
	// Model names whose requests the row measures, client side and on its
	// own replicas, when two models share the address (an agent's main
	// model and its small one); "" is the only model's.
	Model string `json:"model,omitempty"`

	// Instances is how many Caddy instances routed (behind a front that
	// picks one at random per request); 0 or 1 is one, without a front.
	// PinStore is what they shared: "none" or "redis" ("" is none).
	Instances int    `json:"instances,omitempty"`
	PinStore  string `json:"pin_store,omitempty"`
	// TurnsOnReplicaPercent is the turn-weighted share of a conversation's
	// later turns served by the replica of its first turn (end-to-end runs).
	TurnsOnReplicaPercent float64 `json:"turns_on_replica_percent,omitempty"`
	// TurnsChangedReplica counts those later turns served by another
	// replica than their conversation's previous turn (end-to-end runs).
	TurnsChangedReplica int `json:"turns_changed_replica,omitempty"`
	// NewConversations counts the conversations that started in the
	// window; NewSpread is max − min of them over the replicas.
	NewConversations int `json:"new_conversations,omitempty"`
	NewSpread        int `json:"new_spread,omitempty"`
}

// Setup names the row's routing layout in tables: "" for one instance
// without a pin store, else "×N store".
func (r Row) Setup() string {
	store := r.PinStore
	if store == "" {
		store = "none"
	}
	if r.Instances <= 1 && store == "none" {
		return ""
	}
	return fmt.Sprintf("×%d %s", max(r.Instances, 1), store)
}

// SetClientSide fills the columns the client measures from the Summary of
// the measured window: rates, TTFB and conversation times, request and
// session counts, stayed share. timeScale is how many times faster than the
// client's clock the reported clock runs: 1 in the lab, the simulator's time
// scale in a run, whose wall-clock times it multiplies and rates divides.
func (r *Row) SetClientSide(sum agentload.Summary, timeScale float64) {
	seconds := func(d time.Duration) float64 { return d.Seconds() * timeScale }
	r.SessionsPerHour = sum.SessionsPerHour / timeScale
	r.OutputTokensPerMin = sum.OutputTokensPerMin / timeScale
	r.TTFBP50S = seconds(sum.TTFBP50)
	r.TTFBP95S = seconds(sum.TTFBP95)
	r.TTFBMeanS = seconds(sum.TTFBMean)
	r.ConversationP50S = seconds(sum.ConversationP50)
	r.ConversationP95S = seconds(sum.ConversationP95)
	r.ConversationMeanS = seconds(sum.ConversationMean)
	r.ConversationsTimed = sum.ConversationsTimed
	r.ConversationsCut = sum.ConversationsCut
	r.StayedPercent = sum.StayedPercent
	r.Requests = sum.Requests
	r.Errors = sum.Errors
	r.Cut = sum.Cut
	r.SessionsCompleted = sum.SessionsCompleted
}

// File is the JSON document written by --json.
type File struct {
	Runs []Row `json:"runs"`
	// Shapes describes the workloads the runs' Workload names, when they
	// were drawn at random (wardenbench shapes).
	Shapes json.RawMessage `json:"shapes,omitempty"`
}

// WriteJSON writes rows to path as a File. Seed rows, which leave some
// columns unmeasured (NaN), cannot be written.
func WriteJSON(path string, rows []Row) error { return WriteFile(path, File{Runs: rows}) }

// WriteFile writes f to path, refusing rows WriteJSON would.
func WriteFile(path string, f File) error {
	for _, r := range f.Runs {
		if err := checkFinite(r); err != nil {
			return err
		}
	}
	if f.Runs == nil {
		f.Runs = []Row{}
	}
	b, err := json.MarshalIndent(f, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(b, '\n'), 0o644)
}

// ReadJSON reads a File written by WriteJSON, refusing unknown fields so that
// a schema drift shows.
func ReadJSON(path string) ([]Row, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	dec := json.NewDecoder(f)
	dec.DisallowUnknownFields()
	var file File
	if err := dec.Decode(&file); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if file.Runs == nil {
		return nil, fmt.Errorf("%s: no \"runs\" array", path)
	}
	return file.Runs, nil
}

// checkFinite rejects a row with a NaN or infinite number, which JSON cannot hold.
func checkFinite(r Row) error {
	v := reflect.ValueOf(r)
	for i := range v.NumField() {
		if f := v.Field(i); f.Kind() == reflect.Float64 && (math.IsNaN(f.Float()) || math.IsInf(f.Float(), 0)) {
			return fmt.Errorf("row %s/%s/%d: %s is %v", r.Mode, r.Policy, r.Sessions, v.Type().Field(i).Name, f.Float())
		}
	}
	return nil
}

// errNoRows is returned by the plots when there is nothing to draw.
var errNoRows = errors.New("report: no rows to plot")
