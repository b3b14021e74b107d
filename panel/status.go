package panel

import (
	"math"
	"time"

	"github.com/lmwarden/caddy-warden/kvevents"
	"github.com/lmwarden/caddy-warden/livemodel"
	"github.com/lmwarden/caddy-warden/loadcontrol"
	"github.com/lmwarden/caddy-warden/metricsfeed"
	"github.com/lmwarden/caddy-warden/pinsnapshot"
	"github.com/lmwarden/caddy-warden/pinstore"
	"github.com/lmwarden/caddy-warden/supervise"
)

// hitRateWindow is the window of the prefix hit rate shown per replica.
const hitRateWindow = 5 * time.Minute

// ModelStatus is a model's routing panel, as the admin API serves it.
type ModelStatus struct {
	Model              string `json:"model"`
	Mode               string `json:"mode"` // "replicas" or "ranks"
	Affinity           bool   `json:"affinity"`
	SpillThreshold     int    `json:"spill_threshold"`
	SpillThresholdAuto bool   `json:"spill_threshold_auto"`
	MaxNumSeqs         int    `json:"max_num_seqs"`
	// MaxNumSeqsSource says where MaxNumSeqs came from: "config",
	// "process" (the --max-num-seqs of a process the app launches) or
	// "vllm_default" (what vLLM runs without the flag on most GPUs).
	MaxNumSeqsSource string `json:"max_num_seqs_source"`
	// TypicalPromptTokens is the requests' prompt size, estimated from
	// their bodies and smoothed.
	TypicalPromptTokens int `json:"typical_prompt_tokens"`
	// PrefillTokensPerSecond is the replicas' prefill rate learnt from
	// their counters, and TurnSeconds the requests' duration, smoothed:
	// what a move's expected cost is measured with. Null until known.
	PrefillTokensPerSecond *float64 `json:"prefill_tokens_per_second"`
	TurnSeconds            *float64 `json:"turn_seconds"`
	StickyPercent          float64  `json:"sticky_percent"`
	InFlight               int64    `json:"in_flight"`
	Sessions               int64    `json:"sessions"`
	Requests               uint64   `json:"requests"`
	Unkeyed                uint64   `json:"unkeyed"`
	NoReplica              uint64   `json:"no_replica"`
	SessionsEvicted        uint64   `json:"sessions_evicted"`
	SessionsExpired        uint64   `json:"sessions_expired"`
	CompactionsIgnored     uint64   `json:"compactions_ignored"` // hints within compaction_interval of the last placement
	// PrefixHitRate is the fleet's, over the last 5 minutes, from the
	// replicas' prefix-cache counters (else the mean of their own V0 hit-rate
	// gauges); nil (JSON null) when no replica publishes either, or none
	// counted a query in that window.
	PrefixHitRate *float64        `json:"prefix_hit_rate"`
	Since         time.Time       `json:"since"`
	Replicas      []ReplicaStatus `json:"replicas"`
	// PinSnapshot is absent when snapshots are off.
	PinSnapshot *pinsnapshot.Status `json:"pin_snapshot,omitempty"`
	// PinStore is the shared pin store's state; absent when pins are local.
	PinStore *pinstore.Status `json:"pin_store,omitempty"`
	// LoadControl is load control's settings in force and its counters.
	LoadControl LoadControlStatus `json:"load_control"`
}

// LoadControlStatus is load control's settings (defaults filled in), its
// queue and its counters since the model was first loaded.
type LoadControlStatus struct {
	// Enabled is true when load control is on and so is affinity, which
	// it needs.
	Enabled        bool    `json:"enabled"`
	Fill           float64 `json:"fill"`
	LingerSeconds  float64 `json:"linger_s"`
	MaxWaitSeconds float64 `json:"max_wait_s"`
	MaxQueue       int     `json:"max_queue"`
	// CapacityTokens is the configured KV capacity per replica; 0 reads
	// each replica's from its /metrics.
	CapacityTokens int `json:"capacity_tokens"`
	// Quantum is the turns a resident keeps its place while others wait,
	// -1 when it never yields.
	Quantum int `json:"quantum"`
	// StaggerSeconds is how long a replica filling from empty waits
	// between two new conversations; 0 is off.
	StaggerSeconds float64 `json:"stagger_s"`
	// MinResidents is how many conversations a replica takes however large.
	MinResidents int `json:"min_residents"`
	// FillMin and FillMax bound each replica's fill as its residents' hits
	// move it (replicas[].fill); 0 when fill control is off.
	FillMin float64 `json:"fill_min"`
	FillMax float64 `json:"fill_max"`
	// Touch: a replica a resident left waits for its idle residents to
	// begin a turn again before it takes a new conversation.
	Touch bool `json:"touch"`
	// Waiting is the number of turns held now.
	Waiting int `json:"waiting"`
	// LateShare is the share of idle residents whose residency expired
	// before their conversation came back, and LackShare the share of
	// turns that lacked room, recent ones weighing most; SteppedAside is
	// set until a turn lacks room and once LackShare is below 1/32, and
	// while LateShare is over 0.5 (cleared below 0.35) (selection/aside.go):
	// every turn is admitted at once meanwhile, since holding keeps no
	// cache then.
	LateShare    float64 `json:"late_share"`
	LackShare    float64 `json:"lack_share"`
	SteppedAside bool    `json:"stepped_aside"`
	// SharedPrefixTokens is the prefix new conversations share with others
	// (their system prompt and tools), which a replica holds once for all
	// its residents; nil (JSON null) until known. SharedPrefixSource says
	// where it was read: "replies" (the cached part of new conversations'
	// replies, with vLLM's --enable-prompt-tokens-details), "requests" (the
	// system prompt and tools their requests share) or "unknown"
	// (selection/sharedprefix.go).
	SharedPrefixTokens *int   `json:"shared_prefix_tokens"`
	SharedPrefixSource string `json:"shared_prefix_source"`
	// Admitted counts turns admitted, at once or after waiting (forced
	// included); Queued those that had to wait; Forced those sent over
	// capacity after max_wait; Refused those answered 503 by a full queue;
	// Cancelled those whose client left while they waited; TaskEnded the
	// turns whose reply ended the agent's task (read by warden_stop_reason),
	// their conversation leaving at once; SideCalls the turns of a resident
	// conversation with a body under a quarter of its latest own turn's (a
	// title, a classifier, a turn after a compaction), which neither sized
	// nor ended its residency.
	Admitted  uint64 `json:"admitted"`
	Queued    uint64 `json:"queued"`
	Forced    uint64 `json:"forced"`
	Refused   uint64 `json:"refused"`
	Cancelled uint64 `json:"cancelled"`
	TaskEnded uint64 `json:"task_ended"`
	SideCalls uint64 `json:"side_calls"`
	// Replies is what warden_stop_reason read of the admitted turns'
	// replies.
	Replies ReplyUsageStatus `json:"replies"`
	// Refreshes counts the requests that refreshed the cache of a
	// conversation kept for a person within their share
	// (livemodel/refresh.go): answered with a success, or not.
	Refreshes       uint64 `json:"refreshes"`
	RefreshesFailed uint64 `json:"refreshes_failed"`
	// FlowHeader is the header whose value names a turn's flow; "" when
	// the credential does (Authorization, else x-api-key). Flows is each
	// flow's share of the queue, the most recently active first, at most
	// 256; OtherFlows adds up the flows folded out of them, the idlest
	// when more came (selection/flows.go).
	FlowHeader string       `json:"flow_header"`
	Flows      []FlowStatus `json:"flows"`
	OtherFlows FlowStatus   `json:"other_flows"`
}

// ReplyUsageStatus is what the replies of the turns load control admitted
// reported of their prompts, read by warden_stop_reason.
type ReplyUsageStatus struct {
	// Read counts the replies that reported their prompt's size, and
	// CacheReported those that reported its cached part (vLLM needs
	// --enable-prompt-tokens-details, and leaves the part out when it is 0).
	Read          uint64 `json:"read"`
	CacheReported uint64 `json:"cache_reported"`
	// BytesPerToken is the request bodies' bytes per prompt token learned
	// from them, by which load control sizes turns (4 before any reply).
	BytesPerToken float64 `json:"bytes_per_token"`
	// Resident adds up the prompts of the turns whose conversation was
	// resident when they arrived, NonResident those of the others (first
	// turns, turns that waited). Residency works when the first find most
	// of their prompt cached.
	Resident    ReplyTokensStatus `json:"resident"`
	NonResident ReplyTokensStatus `json:"non_resident"`
}

// ReplyTokensStatus adds up prompts as their replies reported them.
type ReplyTokensStatus struct {
	PromptTokens uint64 `json:"prompt_tokens"`
	CachedTokens uint64 `json:"cached_tokens"`
	// CachedPercent is the share of the prompts' tokens found in the prefix
	// cache; null until a reply reported its cached part.
	CachedPercent *float64 `json:"cached_percent"`
}

func replyUsageStatus(a loadcontrol.Status) ReplyUsageStatus {
	tokens := func(c loadcontrol.TokenCounts) ReplyTokensStatus {
		out := ReplyTokensStatus{PromptTokens: c.Prompt, CachedTokens: c.Cached}
		if a.CacheReplies > 0 && c.Prompt > 0 {
			p := 100 * float64(c.Cached) / float64(c.Prompt)
			out.CachedPercent = &p
		}
		return out
	}
	return ReplyUsageStatus{
		Read: a.Replies, CacheReported: a.CacheReplies, BytesPerToken: a.BytesPerToken,
		Resident: tokens(a.Resident), NonResident: tokens(a.NonResident),
	}
}

// ReplicaStatus is one row of the panel.
type ReplicaStatus struct {
	ID           string  `json:"id"`
	Address      string  `json:"address"`
	Rank         int     `json:"rank"`
	InFlight     int64   `json:"in_flight"`
	Sticky       uint64  `json:"sticky"`
	SpilledIn    uint64  `json:"spilled_in"`
	ClientPinned uint64  `json:"client_pinned"`
	Placed       uint64  `json:"placed"`
	Replaced     uint64  `json:"replaced"`
	Adopted      uint64  `json:"adopted"`   // sessions another Caddy instance pinned here (shared pin store)
	Joined       uint64  `json:"joined"`    // of placed, sub-agents and continuations pinned beside their parent
	Compacted    uint64  `json:"compacted"` // conversations pinned here anew after a compaction
	Rehomed      uint64  `json:"rehomed"`   // conversations pinned here anew, their pin's cache likely evicted
	Unpinned     uint64  `json:"unpinned"`
	Running      float64 `json:"running"`
	Waiting      float64 `json:"waiting"`
	KVUsed       float64 `json:"kv_used"`
	MetricsKnown bool    `json:"metrics_known"`
	// PrefixHitRate is over the last 5 minutes, 0..1, from the replica's
	// prefix-cache counters (else its V0 engine's own hit-rate gauge); nil
	// (JSON null) when it publishes neither, before two scrapes of it, or
	// when it counted no query in that window.
	PrefixHitRate *float64 `json:"prefix_hit_rate"`
	// HostHitRate is, over the same window, the share of the prompt tokens
	// queried that its host-memory KV tier served; HostTierGiB the tier's
	// size. Both nil (JSON null) without a tier, or when it does not say.
	HostHitRate *float64 `json:"host_hit_rate"`
	HostTierGiB *float64 `json:"host_tier_gib"`
	// HostTierTokens is the tier's size in tokens, learnt from the bytes it
	// stores; nil (JSON null) until it has stored enough to tell.
	HostTierTokens *int   `json:"host_tier_tokens"`
	Healthy        bool   `json:"healthy"`
	Health         string `json:"health"`
	Sessions       int64  `json:"sessions"`
	ActiveSessions int64  `json:"active_sessions"`
	// Residents are the conversations load control holds resident here,
	// ResidentTokens their prompts' size, the shared prefix counted once
	// (0 when it is off).
	Residents      int `json:"residents"`
	ResidentTokens int `json:"resident_tokens"`
	// Fill is the share of the replica's KV capacity its residents may take
	// now: load control's fill, or where fill control moved it.
	Fill float64 `json:"fill"`
	// NextNewcomer is when the replica, filling from empty, may take its
	// next new conversation (load control's stagger); nil (JSON null) when
	// it takes one whenever it has room.
	NextNewcomer *time.Time `json:"next_newcomer"`
	// KVCapacityTokens is the replica's KV cache in tokens as load control
	// counts it: capacity_tokens when set, else the replica's
	// num_gpu_blocks × block_size, or its host tier's tokens when larger;
	// nil (JSON null) when unknown.
	KVCapacityTokens *int `json:"kv_capacity_tokens"`
	// Process is the launched vLLM server's state, when warden runs it.
	Process *supervise.State `json:"process,omitempty"`
	// KVEvents is how well warden follows the replica's KV cache events,
	// when it publishes them (kv_events).
	KVEvents *KVEventsStatus `json:"kv_events,omitempty"`
}

// KVEventsStatus is a replica's KV cache events as warden follows them:
// the feed's counters, and how many turns ended there had their chain of
// blocks singled out by the events or not (a turn whose reply gave no
// usage with its cached part, or an ambiguous chain).
type KVEventsStatus struct {
	Endpoint string `json:"endpoint"`
	kvevents.Stats
	ChainsFound  uint64 `json:"chains_found"`
	ChainsMissed uint64 `json:"chains_missed"`
}

// Status assembles a model's status from the routing view of its applied
// load and the model's metrics and health.
func Status(l *livemodel.Load, now time.Time) ModelStatus {
	view := l.Plan().View()
	st := view.Status()
	admission := view.Admission()
	f := l.Model().Fleet()
	spec := l.Spec()
	out := ModelStatus{
		Model:                  st.Model,
		Mode:                   "replicas",
		Affinity:               st.Affinity,
		SpillThreshold:         st.SpillThreshold,
		SpillThresholdAuto:     st.SpillThresholdAuto,
		MaxNumSeqs:             st.MaxNumSeqs,
		MaxNumSeqsSource:       spec.MaxNumSeqsSource,
		TypicalPromptTokens:    int(math.Round(st.TypicalPrompt)),
		PrefillTokensPerSecond: known(math.Round(st.PrefillRate), st.PrefillRate > 0),
		TurnSeconds:            known(math.Round(st.TurnSeconds*1000)/1000, st.TurnSeconds > 0),
		StickyPercent:          st.StickyPercent,
		InFlight:               st.InFlight,
		Sessions:               st.Sessions,
		Requests:               st.Requests,
		Unkeyed:                st.Unkeyed,
		NoReplica:              st.NoReplica,
		SessionsEvicted:        st.Evicted,
		SessionsExpired:        st.Expired,
		CompactionsIgnored:     st.CompactionsIgnored,
		Since:                  st.Since,
		Replicas:               make([]ReplicaStatus, 0, len(st.Replicas)),
		PinSnapshot:            l.PinSnapshot(),
		LoadControl: LoadControlStatus{
			Enabled:            st.Admission.Enabled,
			Fill:               admission.Fill,
			LingerSeconds:      admission.Linger.Seconds(),
			MaxWaitSeconds:     admission.MaxWait.Seconds(),
			MaxQueue:           admission.MaxQueue,
			CapacityTokens:     admission.CapacityTokens,
			Quantum:            admission.Quantum,
			StaggerSeconds:     admission.Stagger.Seconds(),
			MinResidents:       admission.MinResidents,
			FillMin:            admission.FillMin,
			FillMax:            admission.FillMax,
			Touch:              admission.Touch,
			Waiting:            st.Admission.Waiting,
			LateShare:          st.Admission.LateShare,
			LackShare:          st.Admission.LackShare,
			SteppedAside:       st.Admission.SteppedAside,
			SharedPrefixTokens: sharedPrefixTokens(st.Admission),
			SharedPrefixSource: st.Admission.SharedPrefixSource.String(),
			Admitted:           st.Admission.Admitted,
			Queued:             st.Admission.Queued,
			Forced:             st.Admission.Forced,
			Refused:            st.Admission.Refused,
			Cancelled:          st.Admission.Cancelled,
			TaskEnded:          st.Admission.TaskEnded,
			SideCalls:          st.Admission.SideCalls,
			Replies:            replyUsageStatus(st.Admission),
			FlowHeader:         spec.FlowHeader,
		},
	}
	out.LoadControl.Flows, out.LoadControl.OtherFlows = flowsStatus(st.Flows)
	out.LoadControl.Refreshes, out.LoadControl.RefreshesFailed = l.Model().Refreshes()
	if spec.Store != nil {
		ps := spec.Store.Status()
		out.PinStore = &ps
	}
	for _, rs := range st.Replicas {
		if rs.SetsRank {
			out.Mode = "ranks"
		}
		row := ReplicaStatus{
			ID:             rs.ID,
			Address:        rs.Address,
			Rank:           rs.Rank,
			InFlight:       rs.InFlight,
			Sticky:         rs.Sticky,
			SpilledIn:      rs.SpilledIn,
			ClientPinned:   rs.ClientPinned,
			Placed:         rs.Placed,
			Replaced:       rs.Replaced,
			Adopted:        rs.Adopted,
			Joined:         rs.Joined,
			Compacted:      rs.Compacted,
			Rehomed:        rs.Rehomed,
			Unpinned:       rs.Unpinned,
			Running:        rs.Load.Running,
			Waiting:        rs.Load.Waiting,
			KVUsed:         rs.Load.KVUsage,
			MetricsKnown:   rs.Load.Known,
			Healthy:        rs.Healthy,
			Sessions:       rs.Sessions,
			ActiveSessions: rs.ActiveSessions,
			Residents:      rs.Residents,
			ResidentTokens: rs.ResidentTokens,
			Fill:           rs.Fill,
		}
		if rs.NextNewcomer.After(now) {
			row.NextNewcomer = &rs.NextNewcomer
		}
		row.KVCapacityTokens = kvCapacity(admission.CapacityTokens, rs.CapacityTokens)
		if rs.HostTierTokens > 0 {
			row.HostTierTokens = &rs.HostTierTokens
		}
		rates, ok := f.ReplicaRates(rs.Replica, now, hitRateWindow)
		row.PrefixHitRate = knownRate(rates, ok)
		if ok {
			row.HostHitRate = known(rates.HostHitRate())
		}
		row.HostTierGiB = known(rs.Load.HostTierGiB, rs.Load.HostTierGiB > 0)
		if row.PrefixHitRate == nil {
			row.PrefixHitRate = known(f.ReplicaReportedHitRate(rs.Replica, now, hitRateWindow))
		}
		if h, ok := f.Health(rs.Address, now); ok {
			row.Health = h.String()
		}
		row.Process = l.ProcessState(rs.Address)
		if endpoint, stats, ok := l.KVEvents(rs.ID); ok {
			row.KVEvents = &KVEventsStatus{Endpoint: endpoint, Stats: stats, ChainsFound: rs.ChainsFound, ChainsMissed: rs.ChainsMissed}
		}
		out.Replicas = append(out.Replicas, row)
	}
	out.PrefixHitRate = knownRate(f.Rates(now, hitRateWindow))
	if out.PrefixHitRate == nil {
		out.PrefixHitRate = known(f.ReportedHitRate(now, hitRateWindow))
	}
	return out
}

// kvCapacity is a replica's KV capacity as load control counts it: the
// configured one, else the one its metrics report; nil when unknown.
func kvCapacity(configured, measured int) *int {
	switch {
	case configured > 0:
		return &configured
	case measured > 0:
		return &measured
	}
	return nil
}

// knownRate is the prefix hit rate of rates, nil when unknown: no rates, no
// prefix-cache counters in them, or no query.
func knownRate(rates metricsfeed.Rates, ok bool) *float64 {
	if !ok {
		return nil
	}
	return known(rates.HitRate())
}

// known is v when ok, else nil.
func known(v float64, ok bool) *float64 {
	if !ok {
		return nil
	}
	return &v
}

// sharedPrefixTokens is a's shared prefix, nil until known.
func sharedPrefixTokens(a loadcontrol.Status) *int {
	if a.SharedPrefixSource == loadcontrol.SharedUnknown {
		return nil
	}
	return &a.SharedPrefix
}
