package pinstore

import (
	"context"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"
)

// Run keeps local and Redis in step until ctx is done:
//   - it subscribes to the other instances' re-pins and adopts them;
//   - at start and every SyncInterval it refreshes, in one pipelined batch,
//     the pins local used since the last successful sync: TTL extended,
//     a differing value adopted (a missed message), a missing pin claimed
//     again without overwriting (expired, Redis restarted empty, or made
//     while Redis was down). A failed sync does not move "since", so the
//     next one covers the outage; if Redis lost its data (the marker key
//     is gone), every local pin is re-claimed;
//   - while the breaker is open it PINGs every probeInterval and, when
//     Redis answers, closes the breaker and syncs at once.
func (s *Store) Run(ctx context.Context, local Local) {
	var wg sync.WaitGroup
	wg.Go(func() { s.subscribe(ctx, local) })
	defer wg.Wait()

	since := s.sync(local, time.Time{})
	syncTick := time.NewTicker(s.opt.SyncInterval)
	defer syncTick.Stop()
	probeTick := time.NewTicker(probeInterval)
	defer probeTick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-syncTick.C:
			since = s.sync(local, since)
		case <-probeTick.C:
			if s.brk.open.Load() && s.probe() {
				since = s.sync(local, since)
			}
		}
	}
}

// subscribe adopts the re-pins other instances publish. go-redis
// resubscribes by itself after a lost connection; messages sent meanwhile
// are lost, and the next sync repairs the pins this instance is using.
func (s *Store) subscribe(ctx context.Context, local Local) {
	ps := s.rdb.Subscribe(ctx, s.channel)
	defer ps.Close()
	ch := ps.Channel() // PINGs an idle connection every 3s
	for {
		select {
		case <-ctx.Done():
			return
		case m, ok := <-ch:
			if !ok {
				return
			}
			hex, replica, _ := strings.Cut(m.Payload, " ")
			key, err := strconv.ParseUint(hex, 16, 64)
			if err != nil || replica == "" {
				s.log.Debug("pin store: bad re-pin message", zap.String("payload", m.Payload))
				continue
			}
			if !s.ownMessage(key, replica) && local.Adopt(key, replica) {
				s.stat.adopted.Add(1)
			}
		}
	}
}

// ownMessage reports (and forgets) a message this instance's Repin sent.
func (s *Store) ownMessage(key uint64, replica string) bool {
	s.ownMu.Lock()
	defer s.ownMu.Unlock()
	if o, ok := s.own[key]; ok && o.replica == replica {
		delete(s.own, key)
		return true
	}
	return false
}

// probe PINGs a down store and closes the breaker if it answers.
func (s *Store) probe() bool {
	ctx, cancel := context.WithTimeout(context.Background(), s.cfg.Timeout)
	defer cancel()
	start := time.Now()
	err := s.rdb.Ping(ctx).Err()
	d := time.Since(start)
	if err != nil {
		result := "error"
		if isTimeout(err) {
			result = "timeout"
		}
		s.observe("ping", result, d)
		s.brk.mu.Lock()
		s.brk.lastError = s.sanitize(err)
		s.brk.mu.Unlock()
		return false
	}
	s.observe("ping", "ok", d)
	down := s.brk.closeAfterProbe()
	s.log.Info("pin store up again", zap.Duration("down", down))
	return true
}

// sync refreshes the pins used since `since` and returns the next `since`:
// the start of this sync if it succeeded, else `since` unchanged.
func (s *Store) sync(local Local, since time.Time) time.Time {
	start := time.Now()
	lost, err := s.refresh(local, local.PinsUsedSince(since), true)
	if err != nil {
		return since
	}
	if lost && !since.IsZero() {
		s.log.Info("pin store lost its data; re-claiming every local pin")
		if _, err := s.refresh(local, local.PinsUsedSince(time.Time{}), false); err != nil {
			return since
		}
	}
	s.ownMu.Lock()
	for k, o := range s.own { // messages that never came back
		if start.Sub(o.at) > s.opt.SyncInterval {
			delete(s.own, k)
		}
	}
	s.ownMu.Unlock()
	return start
}

// refresh runs syncScript for pins in one pipeline (with checkMarker, it
// also sets the marker key and reports whether it was missing).
func (s *Store) refresh(local Local, pins []Pin, checkMarker bool) (lost bool, err error) {
	var marker *redis.BoolCmd
	type reply struct {
		code    int64
		replica string
	}
	replies := make([]reply, len(pins))
	timeout := max(minSyncTimeout, s.cfg.Timeout)
	err = s.call("sync", timeout, func(ctx context.Context) error {
		pipe := s.rdb.Pipeline()
		if len(pins) > 0 {
			// Loaded in the same round trip, so EVALSHA cannot miss after a
			// Redis restart.
			pipe.ScriptLoad(ctx, syncSource)
		}
		if checkMarker {
			marker = pipe.SetNX(ctx, s.marker, "1", 0)
		}
		cmds := make([]*redis.Cmd, len(pins))
		for i, p := range pins {
			keys, args := s.args(hexKey(p.Key), p.Replica)
			cmds[i] = pipe.EvalSha(ctx, syncScript.Hash(), keys, args...)
		}
		if pipe.Len() == 0 {
			return nil
		}
		if _, err := pipe.Exec(ctx); err != nil {
			return err
		}
		for i, c := range cmds {
			var err error
			if replies[i].code, replies[i].replica, err = scriptReply(c.Slice()); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return false, err
	}
	for i, r := range replies {
		switch {
		case r.code == syncDiffers && r.replica != pins[i].Replica:
			if local.Adopt(pins[i].Key, r.replica) {
				s.stat.adopted.Add(1)
			}
		case r.code == syncReclaimed:
			s.stat.reclaimed.Add(1)
		}
	}
	return checkMarker && marker.Val(), nil
}
