package selection

import (
	"cmp"
	"slices"
	"time"
)

// Pin is one conversation of the session table as a snapshot keeps it, so
// that pins can outlive the process: the hashed key (the raw key is never
// kept), the pinned replica's ID, the last use and the last prompt's size,
// which the replica still caches when only the proxy restarted.
type Pin struct {
	Key     uint64 // HashKey of the session key
	Replica string // the pinned replica's ID
	LastUse int64  // unix nanoseconds
	Prompt  int    // tokens of the conversation's last prompt, 0 when unknown
}

// Snapshot copies every conversation of the table. It holds one shard's
// lock at a time, for a copy of that shard only, so requests wait at most
// that long.
func (r *Router) Snapshot() []Pin {
	n := 0
	for i := range r.sessions.shards {
		sh := &r.sessions.shards[i]
		sh.mu.Lock()
		n += len(sh.byKey)
		sh.mu.Unlock()
	}
	out := make([]Pin, 0, n+n/8) // room for sessions placed meanwhile
	for i := range r.sessions.shards {
		sh := &r.sessions.shards[i]
		sh.mu.Lock()
		for e := sh.head; e != nil; e = e.next {
			out = append(out, Pin{Key: e.key, Replica: e.pin.ID, LastUse: e.lastSeen, Prompt: max(e.lastPrompt, 0)})
		}
		sh.mu.Unlock()
	}
	return out
}

// RestoreStats counts what Restore did with a snapshot's pins.
type RestoreStats struct {
	Restored int
	// Expired pins were idle longer than the session TTL.
	Expired int
	// UnknownReplica pins name a replica the view does not list.
	UnknownReplica int
	// OverCapacity pins did not fit in max_sessions; as in eviction, the
	// least recently used of their shard go.
	OverCapacity int
	// Present pins were already in the table (a request placed them since
	// the start, or the snapshot listed them twice): what the table holds wins.
	Present int
}

// Dropped is the number of pins not restored.
func (s RestoreStats) Dropped() int {
	return s.Expired + s.UnknownReplica + s.OverCapacity + s.Present
}

// Restore puts a snapshot's pins back into the table as if each session's
// last request had been made at its last use: ordered by it for eviction
// and expiry, and counted as active only within the view's active window.
// A last use after now is taken as now. The view's max_sessions bounds what
// is restored, so that it can run before the view is applied: before its
// config serves a request.
func (v *View) Restore(pins []Pin, now time.Time) RestoreStats {
	var st RestoreStats
	nowNs := now.UnixNano()
	oldest := nowNs - int64(v.cfg.SessionTTL) // touch's expiry rule: idle > TTL
	type restoring struct {
		key      uint64
		lastSeen int64
		pin      *replicaState
		prompt   int
	}
	valid := make([]restoring, 0, len(pins))
	for _, p := range pins {
		s := v.byID[p.Replica]
		switch {
		case p.LastUse < oldest:
			st.Expired++
		case s == nil:
			st.UnknownReplica++
		default:
			valid = append(valid, restoring{key: p.Key, lastSeen: min(p.LastUse, nowNs), pin: s, prompt: max(p.Prompt, 0)})
		}
	}
	// By shard, each shard's most recent first: so capacity keeps the most
	// recent, and each insertion goes at or after the previous one.
	slices.SortFunc(valid, func(a, b restoring) int {
		return cmp.Or(cmp.Compare(a.key%sessionShards, b.key%sessionShards), cmp.Compare(b.lastSeen, a.lastSeen), cmp.Compare(a.key, b.key))
	})
	window := int64(v.activeWindow())
	for start := 0; start < len(valid); {
		sh := v.router.sessions.shard(valid[start].key)
		sh.mu.Lock()
		var prev *session // insert after it; nil is the head
		next := sh.head
		for ; start < len(valid) && v.router.sessions.shard(valid[start].key) == sh; start++ {
			p := valid[start]
			if sh.byKey[p.key] != nil {
				st.Present++
				continue
			}
			if len(sh.byKey) >= min(sh.capacity, shardCapacity(v.cfg.MaxSessions, int(p.key%sessionShards))) {
				st.OverCapacity++
				continue
			}
			for next != nil && next.lastSeen >= p.lastSeen {
				prev, next = next, next.next
			}
			e := &session{key: p.key, pin: p.pin, lastSeen: p.lastSeen, lastPrompt: p.prompt}
			p.pin.sessions.Add(1)
			sh.byKey[p.key] = e
			sh.insertAfter(prev, e)
			prev = e
			st.Restored++
		}
		sh.settleActive(nowNs, window)
		sh.mu.Unlock()
	}
	return st
}

// insertAfter links e after prev, or at the head when prev is nil. e must
// not be active: settleActive sets that.
func (s *sessionShard) insertAfter(prev, e *session) {
	if prev == nil {
		s.pushFront(e)
		return
	}
	e.prev, e.next = prev, prev.next
	if prev.next != nil {
		prev.next.prev = e
	} else {
		s.tail = e
	}
	prev.next = e
}

// settleActive makes the active entries exactly those used within window
// of now, the list's prefix that sweep and touch expect, after Restore has
// inserted entries anywhere in the list.
func (s *sessionShard) settleActive(now, window int64) {
	s.oldestActive = nil
	active := true
	for e := s.head; e != nil; e = e.next {
		active = active && now-e.lastSeen <= window
		if active != e.active {
			e.active = active
			if active {
				e.pin.active.Add(1)
			} else {
				e.pin.active.Add(-1)
			}
		}
		if active {
			s.oldestActive = e
		}
	}
}
