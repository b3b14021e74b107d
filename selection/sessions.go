package selection

import (
	"sync"
)

// sessionShards spreads the session table over independent locks so that
// concurrent requests of different conversations rarely contend.
const sessionShards = 64

// MinMaxSessions is the smallest session table: one conversation per shard.
const MinMaxSessions = sessionShards

// session is one pinned conversation. Entries form a per-shard list ordered by
// last use (most recent first), which gives LRU eviction, TTL expiry and the
// "active conversation" window with pointer moves only.
type session struct {
	key      uint64
	pin      *replicaState
	lastSeen int64 // unix nanoseconds
	placedAt int64 // when pinned to pin by load (placed, replaced, compacted)
	active   bool  // used within the active window; counted in pin.active
	// compacted: a summarising request was seen; the next request starts a
	// new prefix and is placed anew.
	compacted bool
	// busy counts the conversation's requests in flight on its pin;
	// released is set when the last one ended, with relWritten the pin's
	// Written, relRouted the prompt tokens we had sent it to compute, and
	// relFree its free KV tokens then: the conversation's blocks joined
	// the end of the pin's free queue, behind relFree tokens, and are
	// evicted once the pin has written more than that (cached.go).
	busy                           int32
	released                       bool
	relWritten, relRouted, relFree float64
	relRestarts                    uint64 // the pin's restarts then
	lastPrompt                     int
	// moves counts the repins, so that the end of a request sent before
	// one is not counted in busy (Router.ended).
	moves uint32
	// chain is what the pin's KV cache events tell of the conversation.
	chain      chain
	prev, next *session
}

type sessionShard struct {
	mu    sync.Mutex
	byKey map[uint64]*session
	head  *session // most recently used
	tail  *session // least recently used
	// oldestActive is the last entry of the active prefix of the list: the
	// list is ordered by lastSeen, so active entries are exactly a prefix.
	oldestActive *session
	capacity     int
}

// sessionTable maps hashed conversation keys to their pinned replica.
type sessionTable struct {
	shards [sessionShards]sessionShard
}

func newSessionTable(maxSessions int) *sessionTable {
	t := &sessionTable{}
	t.setCapacity(maxSessions)
	for i := range t.shards {
		t.shards[i].byKey = make(map[uint64]*session)
	}
	return t
}

// setCapacity bounds the table; shrinking evicts on the next insert.
func (t *sessionTable) setCapacity(maxSessions int) {
	for i := range t.shards {
		s := &t.shards[i]
		s.mu.Lock()
		s.capacity = shardCapacity(maxSessions, i)
		s.mu.Unlock()
	}
}

// shardCapacity is shard i's share of maxSessions: the shards' capacities
// add up to exactly maxSessions.
func shardCapacity(maxSessions, i int) int {
	maxSessions = max(maxSessions, MinMaxSessions)
	n := maxSessions / sessionShards
	if i < maxSessions%sessionShards {
		n++
	}
	return n
}

func (t *sessionTable) shard(key uint64) *sessionShard {
	return &t.shards[key%sessionShards]
}

// entry returns the entry of key without marking it used, or nil when the
// key is unknown or idle for longer than ttl.
func (s *sessionShard) entry(key uint64, now, ttl int64) *session {
	if e := s.byKey[key]; e != nil && now-e.lastSeen <= ttl {
		return e
	}
	return nil
}

// touch returns the entry of key and marks it used at now, or nil when the
// key is unknown or idle for longer than ttl (the expired entry is removed).
func (s *sessionShard) touch(key uint64, now, ttl int64) *session {
	e := s.byKey[key]
	if e == nil {
		return nil
	}
	if now-e.lastSeen > ttl {
		s.remove(e)
		return nil
	}
	e.lastSeen = now
	if !e.active {
		e.active = true
		e.pin.active.Add(1)
	}
	s.moveToFront(e)
	if s.oldestActive == nil { // e was an idle head: now the only active entry
		s.oldestActive = e
	}
	return e
}

// insert pins key to pin, evicting the least recently used entries beyond
// capacity, though not one with a request in flight while an idle one is
// left: a flood of new keys must not take the pin of a conversation at
// work. It returns the new entry and the number of entries evicted.
func (s *sessionShard) insert(key uint64, pin *replicaState, now int64) (*session, int) {
	e := &session{key: key, pin: pin, lastSeen: now, placedAt: now, active: true}
	pin.sessions.Add(1)
	pin.active.Add(1)
	s.byKey[key] = e
	s.pushFront(e)
	evicted := 0
	for len(s.byKey) > s.capacity && s.tail != nil {
		victim := s.tail
		for victim != e && victim.busy > 0 {
			victim = victim.prev
		}
		if victim == e { // every other entry at work: the bound holds anyway
			victim = s.tail
		}
		s.remove(victim)
		evicted++
	}
	return e, evicted
}

// repin moves an existing session to another replica.
func (e *session) repin(pin *replicaState) {
	if e.active {
		e.pin.active.Add(-1)
		pin.active.Add(1)
	}
	e.pin.sessions.Add(-1)
	pin.sessions.Add(1)
	e.pin = pin
	// Requests in flight on the old pin no longer say anything of the
	// conversation's cache on the new one.
	e.busy, e.released = 0, false
	e.moves++
}

func (s *sessionShard) remove(e *session) {
	if e.active {
		e.pin.active.Add(-1)
	}
	e.pin.sessions.Add(-1)
	s.unlink(e)
	delete(s.byKey, e.key)
}

// sweep drops entries idle past ttl and ends the active state of entries
// idle past activeWindow. Both walk from the old end and stop at the first
// entry still in range, so the cost is proportional to what changes.
func (s *sessionShard) sweep(now, ttl, activeWindow int64) (expired int) {
	for s.oldestActive != nil && now-s.oldestActive.lastSeen > activeWindow {
		e := s.oldestActive
		if e.active { // a retired entry (Router.retire) was already uncounted
			e.active = false
			e.pin.active.Add(-1)
		}
		s.oldestActive = e.prev
	}
	for s.tail != nil && now-s.tail.lastSeen > ttl {
		s.remove(s.tail)
		expired++
	}
	return expired
}

func (s *sessionShard) pushFront(e *session) {
	e.prev = nil
	e.next = s.head
	if s.head != nil {
		s.head.prev = e
	}
	s.head = e
	if s.tail == nil {
		s.tail = e
	}
	if s.oldestActive == nil && e.active {
		s.oldestActive = e
	}
}

func (s *sessionShard) moveToFront(e *session) {
	if s.head == e {
		return
	}
	s.unlink(e)
	s.pushFront(e)
}

func (s *sessionShard) unlink(e *session) {
	if s.oldestActive == e {
		s.oldestActive = e.prev
	}
	if e.prev != nil {
		e.prev.next = e.next
	} else {
		s.head = e.next
	}
	if e.next != nil {
		e.next.prev = e.prev
	} else {
		s.tail = e.prev
	}
	e.prev, e.next = nil, nil
}
