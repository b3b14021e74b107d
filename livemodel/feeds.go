package livemodel

import (
	"go.uber.org/zap"

	"github.com/lmwarden/caddy-warden/kvevents"
)

// kvFeed follows one replica's KV cache events for the live loads that
// list it; it outlives a reload that keeps its replica, endpoint and
// topic, with what it learnt of the replica's cache.
type kvFeed struct {
	key  feedKey
	sub  *kvevents.Subscriber
	refs int // live loads using it
}

type feedKey struct {
	replica string
	opts    kvevents.Options
}

// acquireFeedsLocked gives l a feed for each replica it says publishes its
// KV cache events, sharing those another live load already follows.
// Called as l is activated, so a config rejected before it starts opens
// none.
func (m *Model) acquireFeedsLocked(l *Load) {
	l.feeds = map[string]*kvFeed{}
	for id, opts := range l.spec.KVEvents {
		key := feedKey{id, opts}
		f := m.feeds[key]
		if f == nil {
			sub, err := kvevents.Subscribe(opts)
			if err != nil { // the caller validates endpoints: not expected
				l.spec.Logger.Error("following KV cache events", zap.String("model", m.name), zap.String("replica", id), zap.Error(err))
				continue
			}
			f = &kvFeed{key: key, sub: sub}
			m.feeds[key] = f
		}
		f.refs++
		l.feeds[id] = f
	}
}

// releaseFeedsLocked drops l's feeds and returns those no live load uses,
// for the caller to close once model.mu is released.
func (m *Model) releaseFeedsLocked(l *Load) (unused []*kvevents.Subscriber) {
	for _, f := range l.feeds {
		if f.refs--; f.refs == 0 {
			unused = append(unused, f.sub)
			delete(m.feeds, f.key)
		}
	}
	l.feeds = nil
	return unused
}

// followFeeds has the routing judge residency by l's feeds, and by the
// counters on the replicas l follows no events of.
func (l *Load) followFeeds() {
	view := l.plan.View()
	for _, r := range l.spec.Fleet.Replicas {
		if f := l.feeds[r.ID]; f != nil {
			view.FollowChains(r.ID, f.sub)
		} else {
			view.FollowChains(r.ID, nil)
		}
	}
}

// KVEvents is the endpoint and counters of the feed l follows for replica
// id; ok is false when it follows none.
func (l *Load) KVEvents(id string) (endpoint string, st kvevents.Stats, ok bool) {
	l.model.mu.Lock()
	f := l.feeds[id]
	l.model.mu.Unlock()
	if f == nil {
		return "", kvevents.Stats{}, false
	}
	return f.key.opts.Endpoint, f.sub.Stats(), true
}
