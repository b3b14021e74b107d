package caddymodule

import (
	"go.uber.org/zap"

	"github.com/lmwarden/caddy-warden/kvevents"
)

// kvFeed follows one replica's KV cache events for the running config
// loads that list it; it outlives a reload that keeps its replica,
// endpoint and topic, with what it learnt of the replica's cache.
type kvFeed struct {
	key  kvFeedKey
	sub  *kvevents.Subscriber
	refs int // live loads using it
}

type kvFeedKey struct {
	replica string
	cfg     KVEventsConfig
}

// acquireFeedsLocked gives l a feed for each replica it says publishes its
// KV cache events, sharing those another live load already follows.
// Called as l starts, so a config Caddy rejects in Provision opens none.
func (m *model) acquireFeedsLocked(l *modelLoad) {
	l.feeds = map[string]*kvFeed{}
	for id, cfg := range l.cfg.kvEvents() {
		key := kvFeedKey{id, cfg}
		f := m.feeds[key]
		if f == nil {
			sub, err := kvevents.Subscribe(kvevents.Options{Endpoint: cfg.Endpoint, Topic: cfg.Topic})
			if err != nil { // validated at provision: not expected
				l.logger.Error("following KV cache events", zap.String("model", m.name), zap.String("replica", id), zap.Error(err))
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
func (m *model) releaseFeedsLocked(l *modelLoad) (unused []*kvevents.Subscriber) {
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
func (l *modelLoad) followFeeds() {
	view := l.plan.View()
	for _, r := range l.cfg.replicas() {
		if f := l.feeds[r.ID]; f != nil {
			view.FollowChains(r.ID, f.sub)
		} else {
			view.FollowChains(r.ID, nil)
		}
	}
}

// kvEventsStatus is the applied load's feed of replica id, nil when none.
func (l *modelLoad) kvEventsStatus(id string) *KVEventsStatus {
	l.model.mu.Lock()
	f := l.feeds[id]
	l.model.mu.Unlock()
	if f == nil {
		return nil
	}
	return &KVEventsStatus{Endpoint: f.key.cfg.Endpoint, Stats: f.sub.Stats()}
}
