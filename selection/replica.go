package selection

import (
	"math"
	"sync/atomic"
	"time"
)

// Replica names one place a conversation can be served: a whole vLLM server
// (Rank is the engine rank its metrics report, usually 0), or one
// data-parallel rank of a server, chosen with the X-data-parallel-rank header.
type Replica struct {
	// ID is unique within a model: the address, or "address#rank" for ranks.
	ID string
	// Address is the upstream's dial address (host:port).
	Address string
	// Rank is the engine rank (the `engine` label of vLLM's metrics).
	Rank int
	// SetsRank is true when requests must carry RankHeader: Rank.
	SetsRank bool
}

// RankHeader is vLLM's per-request choice of data-parallel engine.
const RankHeader = "X-data-parallel-rank"

// Load is what the replica's own metrics said at the last scrape.
type Load struct {
	Running float64
	Waiting float64
	// KVUsage is the fraction of KV-cache blocks in use, 0..1.
	KVUsage float64
	// KVTokens is the KV cache's size in tokens (num_gpu_blocks ×
	// block_size), 0 when the metrics do not say.
	KVTokens int
	// BlockSize is the KV cache's block size in tokens, 0 when the metrics
	// do not say.
	BlockSize int
	// Written counts the tokens the engine has written to its KV cache
	// (prompt tokens not served from the prefix cache plus generated
	// tokens), a counter; 0 when the metrics do not say. What was written
	// since a conversation's blocks were freed tells whether they were
	// evicted (see session.coldAt).
	Written float64
	// Prefilled counts the prompt tokens the engine computed (not served
	// from its prefix cache) and TTFTSeconds the times to first token of
	// their requests, both counted as each prefill ends, 0 when the
	// metrics do not say: prefilled tokens per second of time to first
	// token, at best, is the prefill rate (cost.go).
	Prefilled, TTFTSeconds float64
	// ExternalQueries counts the prompt tokens the GPU prefix cache missed
	// that were asked of a host-memory tier, ExternalHits those it served,
	// both 0 without a tier (hosttier.go).
	ExternalQueries, ExternalHits float64
	// HostTierGiB is the host tier's size as the engines report it, 0
	// without one or when they do not say; HostStoredBytes counts the
	// bytes of KV blocks copied to it, which size it in tokens
	// (hosttier.go).
	HostTierGiB, HostStoredBytes float64
	// At is when the scrape was taken; zero when unknown.
	At time.Time
	// Known is false when the metrics are missing, stale or invalid: the
	// replica is then scored as full, never as idle.
	Known bool

	// beyond is running+waiting minus our own in-flight count when the
	// load was recorded; external, the part of it seen in two scrapes in a
	// row, is taken as other clients' traffic.
	beyond, external float64
}

// unknownLoad is how a replica without fresh metrics is scored.
var unknownLoad = Load{KVUsage: 1}

// replicaState is the live state of a replica. It outlives config reloads:
// a reload that keeps a replica's ID keeps its counters and pins.
type replicaState struct {
	Replica
	idHash uint64 // for rendezvous tie-breaks

	inFlight atomic.Int64
	pending  atomic.Int64 // prompt tokens of our requests in flight (take)
	// routed counts the prompt tokens we sent the replica to compute (their
	// uncached part, as estimated when sent): what it writes to its KV
	// cache, known before its counters show it.
	routed   atomic.Int64
	lastSent atomic.Int64 // unix nanoseconds of the last request sent here
	sessions atomic.Int64 // pinned sessions in the table
	active   atomic.Int64 // of those, used within the active window
	load     atomic.Pointer[Load]
	// kvTokens is the KV cache's size the last scrape that told it gave:
	// a failed scrape leaves the load unknown, not the cache's size.
	kvTokens atomic.Int64
	// restarts counts the times Written went back (an engine restarted and
	// lost its cache), written the last Written known (float64 bits): a
	// restarted engine may write past the old count before a conversation
	// comes back.
	restarts, written atomic.Uint64
	healthy           atomic.Bool
	// rate learns the replica's prefill rate from its counters, and
	// backlog is the prefill work of our requests queued there (cost.go).
	rate    prefillRate
	backlog backlog
	// host learns what share of the GPU's misses a host tier serves.
	host hostShare
	// chains, when set, is what the replica's KV cache events tell of
	// conversations' chains (chains.go).
	chains                    atomic.Pointer[chainSource]
	chainsFound, chainsMissed atomic.Uint64

	sticky       atomic.Uint64 // requests served here as the session's pin
	placed       atomic.Uint64 // new sessions pinned here
	replaced     atomic.Uint64 // sessions moved here from an unusable pin
	spilledIn    atomic.Uint64 // requests of sessions pinned elsewhere
	clientPinned atomic.Uint64 // requests whose client chose this replica
	unpinned     atomic.Uint64 // requests placed by load alone (unkeyed, affinity off)
	adopted      atomic.Uint64 // sessions pinned here by another router (shared pins)
	joined       atomic.Uint64 // of placed, new sessions pinned beside their parent
	compacted    atomic.Uint64 // sessions pinned here anew after a compaction
	rehomed      atomic.Uint64 // sessions pinned here anew, their cache lost
}

func newReplicaState(r Replica) *replicaState {
	s := &replicaState{Replica: r, idHash: HashKey(r.ID)}
	s.load.Store(&unknownLoad)
	s.healthy.Store(true) // until its metrics say otherwise
	return s
}

// setLoad records a scrape. The engine's running+waiting beyond our own
// in-flight count is traffic from other clients, if it lasts: a request of
// ours that ended between the scrape and now shows up once as beyond, and
// would otherwise weigh on the replica for a whole interval.
func (s *replicaState) setLoad(l Load) {
	if l.Known {
		l.beyond = math.Max(0, l.Running+l.Waiting-float64(s.inFlight.Load()))
		if prev := s.load.Load(); prev.Known {
			l.external = math.Min(l.beyond, prev.beyond)
		}
	}
	if l.Known && l.Written > 0 && l.Written < math.Float64frombits(s.written.Swap(math.Float64bits(l.Written))) {
		s.restarts.Add(1) // before the load that shows it: a turn ending now reads both
	}
	if prev := s.load.Load(); l.Known && prev.Known {
		s.rate.observe(*prev, l)
		s.host.observe(*prev, l)
	}
	s.load.Store(&l)
	if l.KVTokens > 0 {
		s.kvTokens.Store(int64(l.KVTokens))
	}
}

// busy is the number of requests the replica is working on: our own in-flight
// count, exact and current, plus other clients' requests as of the last
// scrape. Using the scrape's total instead would count requests that ended
// since as still running.
func (s *replicaState) busy() float64 {
	return float64(s.inFlight.Load()) + s.load.Load().external
}

// take counts a request in flight here, its prompt in pending and the
// part of it the replica must compute (uncached) in its backlog, in the
// same step as its choice (so that concurrent choices see it).
func (s *replicaState) take(prompt, uncached int, now int64, rate float64) {
	s.pending.Add(int64(prompt))
	s.routed.Add(int64(uncached))
	s.backlog.add(float64(uncached), now, rate)
	s.inFlight.Add(1)
}

// untake gives back what take counted.
func (s *replicaState) untake(prompt, uncached int) {
	s.inFlight.Add(-1)
	s.pending.Add(-int64(prompt))
	s.backlog.done(float64(uncached))
}

// kvUsage is the KV-cache fill, 1 when unknown.
func (s *replicaState) kvUsage() float64 {
	l := s.load.Load()
	if !l.Known {
		return 1
	}
	return l.KVUsage
}
