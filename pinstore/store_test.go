package pinstore

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/lmwarden/caddy-warden/internal/redisproc"
	"github.com/lmwarden/caddy-warden/internal/testrun"
	"go.uber.org/goleak"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
)

func TestValidate(t *testing.T) {
	if err := (Config{}).Validate(); err != nil {
		t.Fatalf("defaults: %v", err)
	}
	for _, c := range []Config{
		{Address: "redis://user:hunter2@10.0.0.5:6379"},
		{Address: "user:hunter2@10.0.0.5:6379"},
		{Address: "10.0.0.5"},
		{Address: ":6379"},
		{Address: "10.0.0.5:0"},
		{Address: "10.0.0.5:http"},
		{DB: -1},
		{Timeout: -time.Second},
		{KeyPrefix: "a b"},
		{TLSInsecure: true},
	} {
		err := c.Validate()
		if err == nil {
			t.Errorf("%+v: no error", c)
			continue
		}
		if strings.Contains(err.Error(), "hunter2") {
			t.Errorf("error quotes the password: %v", err)
		}
	}
}

func TestOpenDoesNoIOAndChecksOptions(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan struct{}, 1)
	go func() {
		if c, err := ln.Accept(); err == nil {
			c.Close()
			accepted <- struct{}{}
		}
	}()
	s := open(t, ln.Addr().String(), nil)
	// go-redis dials only for a command (no idle connections are kept
	// warm), so an empty pool after Open means it did no I/O.
	if st := s.rdb.PoolStats(); st.TotalConns != 0 || st.Misses != 0 {
		t.Fatalf("Open dialled: pool %+v", st)
	}
	select {
	case <-accepted:
		t.Fatal("Open connected")
	default:
	}
	if s.opt.SyncInterval != 50*time.Second {
		t.Fatalf("sync interval %v", s.opt.SyncInterval)
	}

	ok := Options{Model: "m", TTL: 4 * time.Second, MaxPins: 10}
	s2, err := Open(Config{}, ok)
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	if s2.opt.SyncInterval != 2*time.Second || s2.cfg.Timeout != DefaultTimeout || s2.cfg.Address != DefaultAddress {
		t.Fatalf("defaults: %v %v %q", s2.opt.SyncInterval, s2.cfg.Timeout, s2.cfg.Address)
	}
	for _, edit := range []func(*Options){
		func(o *Options) { o.Model = "" },
		func(o *Options) { o.TTL = 0 },
		func(o *Options) { o.MaxPins = 0 },
		func(o *Options) { o.SyncInterval = o.TTL },
	} {
		o := ok
		edit(&o)
		if _, err := Open(Config{}, o); err == nil {
			t.Errorf("%+v: no error", o)
		}
	}
}

// Two stores on one server, as two Caddy instances, place the same new
// session at once: one claim wins and everybody gets its answer.
func TestClaimRace(t *testing.T) {
	srv := redisproc.StartTest(t)
	stores := []*Store{open(t, srv.Addr, nil), open(t, srv.Addr, nil)}
	const key, perStore = 0xfeedbeef, 8
	answers := make(chan string, 2*perStore)
	var wg sync.WaitGroup
	for i, s := range stores {
		for j := range perStore {
			wg.Go(func() {
				pinned, ok := s.Claim(key, fmt.Sprintf("r%d-%d", i, j))
				if !ok {
					t.Error("claim not answered")
				}
				answers <- pinned
			})
		}
	}
	wg.Wait()
	close(answers)
	winner := srv.Do("GET", pinKeyName(key))
	for a := range answers {
		if a != winner {
			t.Errorf("answer %q, pin in Redis %q", a, winner)
		}
	}
	a, b := stores[0].Status(), stores[1].Status()
	if a.Claims+b.Claims != 1 || a.ClaimsLost+b.ClaimsLost != 2*perStore-1 {
		t.Fatalf("claims won %d+%d, lost %d+%d", a.Claims, b.Claims, a.ClaimsLost, b.ClaimsLost)
	}
	if !a.Up || !b.Up {
		t.Fatalf("not up: %+v %+v", a, b)
	}

	// A lost claim returns the winner and does not touch the pin.
	if pinned, ok := stores[1].Claim(key, "other"); !ok || pinned != winner {
		t.Fatalf("lost claim: %q %v, want %q", pinned, ok, winner)
	}
	// Keys hold the hashed key, the TTL and the index entry.
	if ttl := atoi(t, srv.Do("PTTL", pinKeyName(key))); ttl <= 50_000 || ttl > 60_000 {
		t.Fatalf("PTTL %d, want about 60s", ttl)
	}
	if srv.Do("ZSCORE", "warden:m:pins", fmt.Sprintf("%016x", key)) == "" {
		t.Fatal("no index entry")
	}
}

func TestRepinCAS(t *testing.T) {
	srv := redisproc.StartTest(t)
	s := open(t, srv.Addr, nil)
	if p, ok := s.Claim(1, "a"); !ok || p != "a" {
		t.Fatalf("claim: %q %v", p, ok)
	}
	if p, ok := s.Repin(1, "a", "b"); !ok || p != "b" {
		t.Fatalf("repin a→b: %q %v", p, ok)
	}
	// Stale: somebody already moved it from a; the current pin comes back.
	if p, ok := s.Repin(1, "a", "c"); !ok || p != "b" {
		t.Fatalf("stale repin a→c: %q %v, want b", p, ok)
	}
	// Absent (expired, or lost by Redis): the move is made.
	if p, ok := s.Repin(2, "x", "y"); !ok || p != "y" {
		t.Fatalf("repin of an absent pin: %q %v", p, ok)
	}
	if got := srv.Do("GET", pinKeyName(1)); got != "b" {
		t.Fatalf("pin %q", got)
	}
	if st := s.Status(); st.Repins != 2 || st.RepinsLost != 1 {
		t.Fatalf("repins %d lost %d", st.Repins, st.RepinsLost)
	}
}

// A re-pin by one instance reaches the other's local table by message.
func TestRepinMessageReachesOtherInstance(t *testing.T) {
	srv := redisproc.StartTest(t)
	a, b := open(t, srv.Addr, nil), open(t, srv.Addr, nil)
	la, lb := newLocal(), newLocal()
	run(t, a, la)
	run(t, b, lb)
	eventually(t, 5*time.Second, "both subscribed", func() bool { return subscribers(t, a) == 2 })
	la.use(7, "r1")
	lb.use(7, "r1")
	if _, ok := a.Claim(7, "r1"); !ok {
		t.Fatal("claim")
	}
	if p, ok := a.Repin(7, "r1", "r2"); !ok || p != "r2" {
		t.Fatalf("repin: %q %v", p, ok)
	}
	eventually(t, 5*time.Second, "b adopts r2", func() bool { return lb.get(7) == "r2" })
	if st := b.Status(); st.Adopted != 1 {
		t.Fatalf("b adopted %d", st.Adopted)
	}
	// a skips its own message (adopting it would be harmless, but it is no
	// adoption). b's re-pin, published after it, reaches a after it.
	la.use(8, "r1")
	if _, ok := b.Claim(8, "r1"); !ok {
		t.Fatal("claim")
	}
	if p, ok := b.Repin(8, "r1", "r2"); !ok || p != "r2" {
		t.Fatalf("b's repin: %q %v", p, ok)
	}
	eventually(t, 5*time.Second, "a adopts b's re-pin", func() bool { return la.get(8) == "r2" })
	if st := a.Status(); st.Adopted != 1 || la.get(7) != "r1" {
		t.Fatalf("a adopted %d re-pins, holds %q for its own: its own was adopted", st.Adopted, la.get(7))
	}
}

// A won claim reaches the other instance, which learns the new pin; a
// lost one publishes nothing.
func TestClaimMessageTeachesOtherInstance(t *testing.T) {
	srv := redisproc.StartTest(t)
	a, b := open(t, srv.Addr, nil), open(t, srv.Addr, nil)
	la, lb := newLocal(), newLocal()
	run(t, a, la)
	run(t, b, lb)
	eventually(t, 5*time.Second, "both subscribed", func() bool { return subscribers(t, a) == 2 })
	la.use(9, "r2")
	if p, ok := a.Claim(9, "r2"); !ok || p != "r2" {
		t.Fatalf("claim: %q %v", p, ok)
	}
	eventually(t, 5*time.Second, "b learns r2", func() bool { return lb.get(9) == "r2" })
	if p, ok := b.Claim(9, "r1"); !ok || p != "r2" { // lost: adopts, publishes nothing
		t.Fatalf("b's claim: %q %v", p, ok)
	}
	// b's next won claim, published after the lost one, reaches a after it.
	lb.use(10, "r1")
	if p, ok := b.Claim(10, "r1"); !ok || p != "r1" {
		t.Fatalf("b's claim of another: %q %v", p, ok)
	}
	eventually(t, 5*time.Second, "a learns b's claim", func() bool { return la.get(10) == "r1" })
	if la.get(9) != "r2" || a.Status().Adopted != 1 || b.Status().Adopted != 1 {
		t.Fatalf("a holds %q, adopted a %d (want only b's won claim) b %d", la.get(9), a.Status().Adopted, b.Status().Adopted)
	}
}

// Claims and re-pins never call Redis while the breaker is open.
func TestOpenBreakerMakesNoCall(t *testing.T) {
	srv := redisproc.StartTest(t)
	var obs observed
	s := open(t, srv.Addr, func(_ *Config, o *Options) { o.Observe = obs.hook })
	if _, ok := s.Claim(1, "a"); !ok { // a pooled connection, and the script loaded
		t.Fatal("claim")
	}
	s.brk.failure("test", true)
	before := info(t, srv, "stats", "total_commands_processed")
	for i := range 100 {
		if _, ok := s.Claim(uint64(i), "a"); ok {
			t.Fatal("claim answered with the breaker open")
		}
		if _, ok := s.Repin(uint64(i), "a", "b"); ok {
			t.Fatal("repin answered with the breaker open")
		}
	}
	// The INFO command itself is the only one processed in between.
	if after := info(t, srv, "stats", "total_commands_processed"); after != before+1 {
		t.Fatalf("commands processed while open: %d", after-before-1)
	}
	if obs.get("claim skipped") != 100 || obs.get("repin skipped") != 100 || s.Status().Skipped != 200 {
		t.Fatalf("observed %v, status %+v", obs.n, s.Status())
	}
}

// A Redis that accepts connections and never answers: the first call
// times out (it returns at all) and opens the breaker; the next ones make
// no call.
func TestTimeoutOpensBreaker(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	var conns []net.Conn
	var mu sync.Mutex
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}
	}()
	defer func() {
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			c.Close()
		}
	}()
	var obs observed
	const timeout = 100 * time.Millisecond
	s := open(t, ln.Addr().String(), func(c *Config, o *Options) { c.Timeout = timeout; o.Observe = obs.hook })
	if _, ok := s.Claim(1, "a"); ok {
		t.Fatal("answered")
	}
	if obs.get("claim timeout") != 1 {
		t.Fatalf("observed %v", obs.n)
	}
	st := s.Status()
	if st.Up || st.DownSince == nil || st.Errors != 1 {
		t.Fatalf("status %+v", st)
	}
	if _, ok := s.Repin(1, "a", "b"); ok {
		t.Fatal("answered")
	}
	if obs.get("repin skipped") != 1 || obs.get("repin timeout") != 0 || s.Status().Skipped != 1 {
		t.Fatalf("repin with the breaker open: observed %v, status %+v", obs.n, s.Status())
	}
}

// A server on the address that answers the scripts with something other
// than {code, replica} (not the Redis the store expects) counts as failing:
// the breaker opens, so that requests stop paying its round trips.
func TestUnexpectedRepliesOpenBreaker(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go answerScriptsWrongly(c)
		}
	}()
	s := open(t, ln.Addr().String(), nil)
	for i := range errorsToOpen {
		if _, ok := s.Claim(uint64(i), "a"); ok {
			t.Fatal("a claim answered {1, 2} was taken")
		}
	}
	if st := s.Status(); st.Up || st.Errors != errorsToOpen || !strings.Contains(st.LastError, "unexpected script reply") {
		t.Fatalf("after %d replies of the wrong shape: status %+v, want down", errorsToOpen, st)
	}
	if _, ok := s.Claim(9, "a"); ok || s.Status().Skipped != 1 {
		t.Fatalf("with the breaker open, a claim was sent: status %+v", s.Status())
	}
}

// answerScriptsWrongly speaks just enough RESP for go-redis: HELLO is
// unknown (so it falls back to RESP2), a script gets the array {1, 2},
// anything else OK.
func answerScriptsWrongly(c net.Conn) {
	defer c.Close()
	rd := bufio.NewReader(c)
	for {
		header, err := rd.ReadString('\n')
		if err != nil || !strings.HasPrefix(header, "*") {
			return
		}
		var n int
		fmt.Sscanf(header, "*%d", &n)
		var args []string
		for range n {
			line, err := rd.ReadString('\n')
			size := -1
			if _, scanErr := fmt.Sscanf(line, "$%d", &size); err != nil || scanErr != nil || size < 0 {
				return
			}
			arg := make([]byte, size+2)
			if _, err := io.ReadFull(rd, arg); err != nil {
				return
			}
			args = append(args, strings.ToUpper(string(arg[:size])))
		}
		answer := "+OK\r\n"
		switch {
		case len(args) == 0:
			return
		case args[0] == "HELLO":
			answer = "-ERR unknown command 'HELLO'\r\n"
		case args[0] == "EVALSHA" || args[0] == "EVAL":
			answer = "*2\r\n:1\r\n:2\r\n"
		}
		if _, err := c.Write([]byte(answer)); err != nil {
			return
		}
	}
}

// Redis stops: calls fail fast and the breaker opens; it restarts empty:
// the probe closes the breaker, and pins made during the outage are
// re-claimed without overwriting one another instance claimed meanwhile.
func TestOutageAndRecovery(t *testing.T) {
	srv := redisproc.StartTest(t)
	var obs observed
	a := open(t, srv.Addr, func(c *Config, o *Options) { c.Timeout = 200 * time.Millisecond; o.Observe = obs.hook })
	b := open(t, srv.Addr, nil)
	la := newLocal()
	la.use(1, "old")
	since := a.sync(la, time.Time{})
	if st := a.Status(); !st.Up || st.Reclaimed != 1 {
		t.Fatalf("after the first sync: %+v", st)
	}

	srv.Stop()
	for i := 0; a.Status().Skipped == 0; i++ {
		if i == 5 {
			t.Fatalf("breaker still closed after %d failed claims: %+v", i, a.Status())
		}
		start := time.Now()
		if _, ok := a.Claim(10, "a"); ok {
			t.Fatal("claim answered by a stopped Redis")
		}
		if d := time.Since(start); d > time.Second {
			t.Fatalf("claim took %v", d)
		}
	}
	st := a.Status()
	if st.Up || st.DownSince == nil || st.LastError == "" {
		t.Fatalf("status while down: %+v", st)
	}
	// Pins made during the outage, locally only.
	la.use(10, "a")
	la.use(11, "a")
	if s := a.sync(la, since); s != since {
		t.Fatal("a failed sync moved since")
	}

	srv.Restart()
	// Meanwhile b, whose breaker never opened, claims session 10 first.
	eventually(t, 5*time.Second, "b claims after the restart", func() bool {
		_, ok := b.Claim(10, "b")
		return ok
	})
	eventually(t, 5*time.Second, "probe answers", a.probe)
	if !a.Status().Up || a.Status().DownSince != nil {
		t.Fatalf("status after the probe: %+v", a.Status())
	}
	a.sync(la, since)
	if got := srv.Do("GET", pinKeyName(10)); got != "b" {
		t.Fatalf("b's pin overwritten: %q", got)
	}
	if la.get(10) != "b" {
		t.Fatalf("a did not adopt b's pin: %q", la.get(10))
	}
	// 11 made during the outage, and 1 from before it (Redis came back
	// empty: the marker is gone, so every local pin is re-claimed).
	for k, want := range map[uint64]string{11: "a", 1: "old"} {
		if got := srv.Do("GET", pinKeyName(k)); got != want {
			t.Fatalf("pin %d in Redis: %q, want %q", k, got, want)
		}
	}
	if st := a.Status(); st.Reclaimed != 1+2 || st.Adopted != 1 {
		t.Fatalf("reclaimed %d adopted %d", st.Reclaimed, st.Adopted)
	}
}

// With Run: the probe brings the store back within a couple of seconds.
func TestRunRecoversAfterRestart(t *testing.T) {
	srv := redisproc.StartTest(t)
	s := open(t, srv.Addr, func(c *Config, o *Options) { c.Timeout = 200 * time.Millisecond })
	l := newLocal()
	run(t, s, l)
	eventually(t, 5*time.Second, "up", func() bool { return s.Status().Up })
	srv.Stop()
	eventually(t, 5*time.Second, "breaker open", func() bool {
		s.Claim(1, "a")
		return s.Status().DownSince != nil
	})
	l.use(1, "a")
	srv.Restart()
	start := time.Now()
	eventually(t, 5*time.Second, "up again", func() bool { return s.Status().Up })
	t.Logf("up again %v after the restart", time.Since(start))
	eventually(t, 5*time.Second, "pin re-claimed", func() bool { return srv.Do("GET", pinKeyName(1)) == "a" })
}

func TestSyncRefreshesAdoptsReclaims(t *testing.T) {
	srv := redisproc.StartTest(t)
	var obs observed
	s := open(t, srv.Addr, func(_ *Config, o *Options) { o.Observe = obs.hook })
	l := newLocal()
	for k := range uint64(50) {
		l.use(k, "r1")
		if _, ok := s.Claim(k, "r1"); !ok {
			t.Fatal("claim")
		}
		srv.Do("PEXPIRE", pinKeyName(k), "1000")
	}
	srv.Do("SET", pinKeyName(3), "r9", "PX", "60000") // a re-pin whose message was missed
	srv.Do("DEL", pinKeyName(4))                      // expired, or evicted
	l.use(99, "r1")                                   // made while Redis was down

	since := s.sync(l, time.Time{})
	if n := obs.get("sync ok"); n != 1 {
		t.Fatalf("%d sync round trips, want 1 batch", n)
	}
	for k := range uint64(50) {
		if k == 3 {
			continue
		}
		if ttl := atoi(t, srv.Do("PTTL", pinKeyName(k))); ttl < 50_000 {
			t.Fatalf("pin %d: PTTL %d after the refresh", k, ttl)
		}
	}
	if l.get(3) != "r9" || srv.Do("GET", pinKeyName(3)) != "r9" {
		t.Fatalf("pin 3: local %q, Redis %q", l.get(3), srv.Do("GET", pinKeyName(3)))
	}
	for _, k := range []uint64{4, 99} {
		if got := srv.Do("GET", pinKeyName(k)); got != "r1" {
			t.Fatalf("pin %d not re-claimed: %q", k, got)
		}
	}
	if st := s.Status(); st.Adopted != 1 || st.Reclaimed != 2 {
		t.Fatalf("adopted %d reclaimed %d", st.Adopted, st.Reclaimed)
	}

	// The next sync sends only the pins used since.
	srv.Do("DEL", pinKeyName(5), pinKeyName(6))
	l.use(5, "r1")
	s.sync(l, since)
	if srv.Do("GET", pinKeyName(5)) != "r1" || srv.Do("GET", pinKeyName(6)) != "" {
		t.Fatal("the second sync did not send exactly the pin used since")
	}
}

// Run's own ticker refreshes the TTL of a used pin.
func TestRunRefreshesTTL(t *testing.T) {
	srv := redisproc.StartTest(t)
	s := open(t, srv.Addr, func(_ *Config, o *Options) { o.TTL = 4 * time.Second; o.SyncInterval = 200 * time.Millisecond })
	l := newLocal()
	run(t, s, l)
	eventually(t, 5*time.Second, "first sync", func() bool { return s.Status().Up })
	l.use(1, "a")
	s.Claim(1, "a")
	srv.Do("PEXPIRE", pinKeyName(1), "1000")
	l.use(1, "a")
	eventually(t, 5*time.Second, "PTTL grows", func() bool {
		return atoi(t, srv.Do("PTTL", pinKeyName(1))) > 2000
	})
}

// A message sent while the subscriber was cut off is lost; after a Redis
// restart go-redis resubscribes, and the next re-pin reaches the other
// instance.
func TestPubSubResubscribesAfterRestart(t *testing.T) {
	srv := redisproc.StartTest(t)
	a, b := open(t, srv.Addr, nil), open(t, srv.Addr, nil)
	la, lb := newLocal(), newLocal()
	run(t, a, la)
	run(t, b, lb)
	eventually(t, 5*time.Second, "both subscribed", func() bool { return subscribers(t, a) == 2 })
	srv.Restart()
	eventually(t, 10*time.Second, "both subscribed again", func() bool { return subscribers(t, a) == 2 })
	la.use(5, "r1")
	lb.use(5, "r1")
	// The first call after the restart may meet a dead pooled connection.
	eventually(t, 5*time.Second, "repin answered", func() bool {
		p, ok := a.Repin(5, "r1", "r2")
		return ok && p == "r2"
	})
	eventually(t, 5*time.Second, "b adopts r2", func() bool { return lb.get(5) == "r2" })
}

func TestPasswordNeverShown(t *testing.T) {
	const secret, wrong = "s3cret-pass", "wr0ng-pass"
	srv := redisproc.StartTest(t, "--requirepass", secret)
	core, logs := observer.New(zapcore.DebugLevel)
	bad := open(t, srv.Addr, func(c *Config, o *Options) { c.Password = wrong; o.Logger = zap.New(core) })
	for range 3 {
		if _, ok := bad.Claim(1, "a"); ok {
			t.Fatal("claim with a wrong password answered")
		}
	}
	st := bad.Status()
	if st.LastError == "" || st.Up {
		t.Fatalf("status %+v", st)
	}
	js, _ := json.Marshal(st)
	var all strings.Builder
	all.Write(js)
	for _, e := range logs.All() {
		fmt.Fprintf(&all, "%s %v\n", e.Message, e.ContextMap())
	}
	if strings.Contains(all.String(), wrong) || strings.Contains(all.String(), secret) {
		t.Fatalf("password shown: %s", all.String())
	}
	t.Logf("status: %s", js)

	good := open(t, srv.Addr, func(c *Config, _ *Options) { c.Password = secret })
	if _, ok := good.Claim(1, "a"); !ok {
		t.Fatalf("claim with the password: %+v", good.Status())
	}
}

// A flood of distinct sessions keeps Redis bounded by MaxPins.
func TestFloodBoundedByMaxPins(t *testing.T) {
	srv := redisproc.StartTest(t)
	s := open(t, srv.Addr, nil) // MaxPins 1000
	const n, workers = 20_000, 8
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for i := w; i < n; i += workers {
				if _, ok := s.Claim(spread(i), "r"); !ok {
					t.Errorf("claim %d: %+v", i, s.Status())
					return
				}
			}
		})
	}
	wg.Wait()
	if got := atoi(t, srv.Do("ZCARD", "warden:m:pins")); got != 1000 {
		t.Fatalf("index holds %d", got)
	}
	if got := atoi(t, srv.Do("DBSIZE")); got > 1001 {
		t.Fatalf("DBSIZE %d, want <= 1000 pins + the index", got)
	}
	// The newest survives. (The workers' last claims need not be the
	// newest: one worker may run a thousand claims ahead of the others.)
	if _, ok := s.Claim(spread(n), "r"); !ok {
		t.Fatalf("a claim after the flood: %+v", s.Status())
	}
	if srv.Do("GET", pinKeyName(spread(n))) != "r" || atoi(t, srv.Do("ZCARD", "warden:m:pins")) != 1000 {
		t.Fatal("the newest pin was trimmed, or the index grew")
	}
}

// Pins idle past the TTL leave the index as well as Redis.
func TestIdlePinsLeaveIndex(t *testing.T) {
	srv := redisproc.StartTest(t)
	s := open(t, srv.Addr, func(_ *Config, o *Options) { o.TTL = 300 * time.Millisecond; o.SyncInterval = 100 * time.Millisecond })
	for k := range uint64(20) {
		s.Claim(k, "r")
	}
	// Each claim trims the index of the pins idle past the TTL.
	eventually(t, 10*time.Second, "the index holds only the newest pin", func() bool {
		s.Claim(100, "r")
		return atoi(t, srv.Do("ZCARD", "warden:m:pins")) == 1
	})
}

// spread turns i into a well-spread 64-bit key, as selection.HashKey would.
func spread(i int) uint64 { return uint64(i) * 0x9e3779b97f4a7c15 }

// After Run returns and Close, no goroutine of the store or of go-redis
// is left (caddymodule's tests check Caddy for leaks), even after an outage
// that saturated go-redis's dial back-off: its pool's tryDial sleeps 1s
// between attempts and sees Close only when it wakes, so allow 3s.
func TestNoGoroutineLeft(t *testing.T) {
	before := goleak.IgnoreCurrent()
	defer func() {
		testrun.Eventually(t, 3*time.Second, "no goroutine of the store left", func() bool { return goleak.Find(before) == nil })
	}()
	srv := redisproc.StartTest(t)
	s, err := Open(Config{Address: srv.Addr, Timeout: testTimeout}, Options{Model: "m", TTL: time.Minute, MaxPins: 10})
	if err != nil {
		t.Fatal(err)
	}
	l := newLocal()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); s.Run(ctx, l) }()
	eventually(t, 5*time.Second, "up", func() bool { return s.Status().Up })
	srv.Stop()
	for range 30 {
		s.Claim(1, "a")
		s.brk.open.Store(false) // keep dialling until go-redis's pool backs off
	}
	cancel()
	<-done
	s.Close()
}
