package pinstore

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"
	"go.uber.org/zap"
)

// Config is how to reach Redis. Option names follow caddy-storage-redis.
type Config struct {
	Address     string        // host:port; default "127.0.0.1:6379"
	Username    string        // ACL user; empty = default user
	Password    string        // never logged nor reported
	DB          int           // database number
	KeyPrefix   string        // default "warden"
	Timeout     time.Duration // each call's bound; default 50ms
	TLSEnabled  bool          // TLS to Redis, certificate verified
	TLSInsecure bool          // skip certificate verification (tests, self-signed); needs TLSEnabled
}

// Defaults.
const (
	DefaultAddress      = "127.0.0.1:6379"
	DefaultKeyPrefix    = "warden"
	DefaultTimeout      = 50 * time.Millisecond
	DefaultSyncInterval = 5 * time.Second
	// minSyncTimeout bounds a sync batch, which carries many pins and runs
	// in the background, not on a request.
	minSyncTimeout = 2 * time.Second
)

func (c Config) withDefaults() Config {
	if c.Address == "" {
		c.Address = DefaultAddress
	}
	if c.KeyPrefix == "" {
		c.KeyPrefix = DefaultKeyPrefix
	}
	if c.Timeout == 0 {
		c.Timeout = DefaultTimeout
	}
	return c
}

// Validate reports a configuration error without any I/O. Its messages
// never quote the password, nor an address that looks like a URL (which
// may carry one).
func (c Config) Validate() error {
	c = c.withDefaults()
	if strings.Contains(c.Address, "@") || strings.Contains(c.Address, "/") {
		return errors.New("pinstore: address must be host:port, not a URL (give username and password separately)")
	}
	host, port, err := net.SplitHostPort(c.Address)
	if err != nil {
		return fmt.Errorf("pinstore: address %q: want host:port", c.Address)
	}
	if host == "" {
		return fmt.Errorf("pinstore: address %q: empty host", c.Address)
	}
	if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
		return fmt.Errorf("pinstore: address %q: bad port", c.Address)
	}
	if c.DB < 0 {
		return fmt.Errorf("pinstore: db %d: must be >= 0", c.DB)
	}
	if c.Timeout < 0 {
		return fmt.Errorf("pinstore: timeout %v: must be > 0", c.Timeout)
	}
	if strings.ContainsAny(c.KeyPrefix, " \t\r\n") {
		return fmt.Errorf("pinstore: key_prefix %q: no spaces", c.KeyPrefix)
	}
	if c.TLSInsecure && !c.TLSEnabled {
		return errors.New("pinstore: tls_insecure needs tls_enabled")
	}
	return nil
}

// Options are what the model using the store decides.
type Options struct {
	Model        string        // keys are namespaced by model
	TTL          time.Duration // a pin idle this long expires (the model's session_ttl)
	MaxPins      int           // bound on pins kept in Redis for the model (its max_sessions)
	SyncInterval time.Duration // TTL refresh + catch-up period; default 5s (at most TTL/2)
	Logger       *zap.Logger   // nil = zap.NewNop(); the password is never logged
	// Observe, if set, is called after every Redis round trip: op is
	// "claim", "repin", "sync", "ping"; result is "ok", "error", "timeout"
	// or "skipped" (breaker open, no call made). It is called from many
	// goroutines at once and must be quick.
	Observe func(op, result string, d time.Duration)
}

// Pin is one entry of a pin table: a hashed session key and its replica ID.
type Pin struct {
	Key     uint64
	Replica string
}

// Local is the instance's own pin table (implemented by selection.Router;
// in tests, a map).
type Local interface {
	// PinsUsedSince lists this instance's pins used at or after t (the
	// pins whose TTL to refresh).
	PinsUsedSince(t time.Time) []Pin
	// Adopt pins key to replica in the local table, when the replica is
	// usable there: it moves a local pin, or learns one another instance
	// made. It reports whether the table changed.
	Adopt(key uint64, replica string) bool
}

// Store is one instance's handle on the shared pin table of one model.
type Store struct {
	cfg  Config
	opt  Options
	rdb  *redis.Client
	log  *zap.Logger
	brk  breaker
	stat struct {
		claims, claimsLost, repins, repinsLost atomic.Uint64
		adopted, reclaimed, errors, skipped    atomic.Uint64
	}

	pinPrefix string // "<prefix>:<model>:pin:"
	index     string // "<prefix>:<model>:pins"
	marker    string // "<prefix>:<model>:alive"
	channel   string // "<prefix>:<model>:repin"
	ttlMS     int64

	// own holds this instance's re-pins until their message comes back,
	// so that Run does not count its own moves as adoptions.
	ownMu sync.Mutex
	own   map[uint64]ownRepin
}

const maxOwn = 1024

type ownRepin struct {
	replica string
	at      time.Time
}

var errSkipped = errors.New("pinstore: breaker open")

// Open checks c and o and prepares a client. It does no network I/O (it is
// called from Caddy's Provision); Run and the first calls connect.
func Open(c Config, o Options) (*Store, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	c = c.withDefaults()
	switch {
	case o.Model == "":
		return nil, errors.New("pinstore: no model")
	case o.TTL < time.Millisecond:
		return nil, fmt.Errorf("pinstore: model %q: ttl %v: must be at least 1ms", o.Model, o.TTL)
	case o.MaxPins <= 0:
		return nil, fmt.Errorf("pinstore: model %q: max pins %d: must be > 0", o.Model, o.MaxPins)
	case o.SyncInterval < 0 || (o.SyncInterval > 0 && o.SyncInterval >= o.TTL):
		return nil, fmt.Errorf("pinstore: model %q: sync interval %v: must be > 0 and below the ttl %v", o.Model, o.SyncInterval, o.TTL)
	case o.SyncInterval == 0:
		// A pin must be refreshed before it expires: at least twice per TTL.
		o.SyncInterval = min(DefaultSyncInterval, o.TTL/2)
	}
	if o.Logger == nil {
		o.Logger = zap.NewNop()
	}
	syncTimeout := max(minSyncTimeout, c.Timeout)
	ropt := &redis.Options{
		Addr:     c.Address,
		Username: c.Username,
		Password: c.Password,
		DB:       c.DB,
		// RESP2: nothing here needs RESP3, and without a password or DB the
		// handshake then costs no command at all.
		Protocol:        2,
		DisableIdentity: true, // no CLIENT SETINFO (Redis < 7.2 lacks it)
		DialTimeout:     c.Timeout,
		DialerRetries:   1, // one attempt: a refused dial must not retry past Timeout
		PoolTimeout:     c.Timeout,
		MaxRetries:      -1, // no retries: the breaker and the next sync retry
		// Socket deadlines wide enough for a sync batch; the context of
		// each Claim or Repin cuts it to Timeout.
		ReadTimeout:           syncTimeout,
		WriteTimeout:          syncTimeout,
		ContextTimeoutEnabled: true, // each call's context (Timeout) bounds it
		MaintNotificationsConfig: &maintnotifications.Config{
			Mode: maintnotifications.ModeDisabled,
		},
	}
	if c.TLSEnabled {
		host, _, _ := net.SplitHostPort(c.Address)
		ropt.TLSConfig = &tls.Config{
			ServerName:         host,
			MinVersion:         tls.VersionTLS12,
			InsecureSkipVerify: c.TLSInsecure, //nolint:gosec // the user's explicit choice
		}
	}
	p := c.KeyPrefix + ":" + o.Model + ":"
	s := &Store{
		cfg:       c,
		opt:       o,
		rdb:       redis.NewClient(ropt),
		log:       o.Logger.With(zap.String("pin_store", c.Address), zap.String("model", o.Model)),
		pinPrefix: p + "pin:",
		index:     p + "pins",
		marker:    p + "alive",
		channel:   p + "repin",
		ttlMS:     o.TTL.Milliseconds(),
		own:       map[uint64]ownRepin{},
	}
	return s, nil
}

func hexKey(key uint64) string { return fmt.Sprintf("%016x", key) }

// args are the common script arguments for key (see scripts.go).
func (s *Store) args(hex string, extra ...any) ([]string, []any) {
	return []string{s.pinPrefix + hex, s.index},
		append([]any{hex, s.ttlMS, s.opt.MaxPins, s.pinPrefix}, extra...)
}

// Claim pins key to replica unless a pin exists, in one round trip, and
// returns the pin in force (replica itself when the claim won). ok=false
// when the store could not answer (breaker open: no call made; error;
// timeout): the caller keeps its local decision.
func (s *Store) Claim(key uint64, replica string) (pinned string, ok bool) {
	hex := hexKey(key)
	keys, args := s.args(hex, replica, s.channel)
	var code int64
	err := s.call("claim", s.cfg.Timeout, func(ctx context.Context) error {
		var err error
		code, pinned, err = scriptReply(claimScript.Run(ctx, s.rdb, keys, args...).Slice())
		return err
	})
	if err != nil {
		return "", false
	}
	if code == 1 {
		s.stat.claims.Add(1)
	} else {
		s.stat.claimsLost.Add(1)
	}
	return pinned, true
}

// Repin moves key's pin from → to only if it is still from, absent (or
// already to), publishes the move to the other instances, and returns the
// pin in force. ok as for Claim.
func (s *Store) Repin(key uint64, from, to string) (pinned string, ok bool) {
	hex := hexKey(key)
	keys, args := s.args(hex, from, to, s.channel)
	s.ownMu.Lock()
	if len(s.own) >= maxOwn { // Run is not consuming them
		clear(s.own)
	}
	s.own[key] = ownRepin{to, time.Now()}
	s.ownMu.Unlock()
	var code int64
	err := s.call("repin", s.cfg.Timeout, func(ctx context.Context) error {
		var err error
		code, pinned, err = scriptReply(repinScript.Run(ctx, s.rdb, keys, args...).Slice())
		return err
	})
	if err != nil || code != 1 {
		s.ownMu.Lock()
		delete(s.own, key)
		s.ownMu.Unlock()
	}
	if err != nil {
		return "", false
	}
	if code == 1 {
		s.stat.repins.Add(1)
	} else {
		s.stat.repinsLost.Add(1)
	}
	return pinned, true
}

// errUnexpectedReply is a script reply other than {code, replica}: the
// server on the address is not the Redis the store expects. It counts as a
// failed call, so that the breaker opens instead of every request paying
// the round trip for nothing.
var errUnexpectedReply = errors.New("unexpected script reply")

// scriptReply decodes a script's {code, replica}, or passes err on.
func scriptReply(res []any, err error) (code int64, replica string, _ error) {
	if err != nil {
		return -1, "", err
	}
	if len(res) == 2 {
		code, ok1 := res[0].(int64)
		replica, ok2 := res[1].(string)
		if ok1 && ok2 {
			return code, replica, nil
		}
	}
	return -1, "", fmt.Errorf("%w of %d values", errUnexpectedReply, len(res))
}

// call runs one round trip f, bounded by timeout, through the breaker, and
// reports it to Observe and the counters.
func (s *Store) call(op string, timeout time.Duration, f func(context.Context) error) error {
	if s.brk.open.Load() {
		s.stat.skipped.Add(1)
		s.observe(op, "skipped", 0)
		return errSkipped
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	start := time.Now()
	err := f(ctx)
	s.record(op, err, time.Since(start))
	return err
}

// record feeds a finished call to Observe, the counters and the breaker.
func (s *Store) record(op string, err error, d time.Duration) {
	if err == nil {
		s.observe(op, "ok", d)
		s.brk.success()
		return
	}
	timeout := isTimeout(err)
	result := "error"
	if timeout {
		result = "timeout"
	}
	s.observe(op, result, d)
	s.stat.errors.Add(1)
	msg := s.sanitize(err)
	if s.brk.failure(msg, timeout) {
		s.log.Warn("pin store down; local pins only until it answers",
			zap.String("op", op), zap.String("error", msg))
	} else {
		s.log.Debug("pin store call failed", zap.String("op", op), zap.String("error", msg))
	}
}

func (s *Store) observe(op, result string, d time.Duration) {
	if s.opt.Observe != nil {
		s.opt.Observe(op, result, d)
	}
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.Is(err, context.DeadlineExceeded) || (errors.As(err, &ne) && ne.Timeout())
}

// sanitize is an error's text with the password masked. go-redis errors
// do not contain it (the server answers WRONGPASS without echoing it), but
// the error text reaches logs and the admin API, so mask it anyway.
func (s *Store) sanitize(err error) string {
	msg := err.Error()
	if s.cfg.Password != "" {
		msg = strings.ReplaceAll(msg, s.cfg.Password, "***")
	}
	return msg
}

// Status is the store's state for the admin API. It never contains the
// password.
type Status struct {
	Address    string     `json:"address"`
	Up         bool       `json:"up"`                   // breaker closed and last call fine
	LastError  string     `json:"last_error,omitempty"` // most recent failure, kept after recovery
	DownSince  *time.Time `json:"down_since,omitempty"` // when the breaker opened
	Claims     uint64     `json:"claims"`               // claims won
	ClaimsLost uint64     `json:"claims_lost"`          // another instance had pinned it first
	Repins     uint64     `json:"repins"`
	RepinsLost uint64     `json:"repins_lost"` // CAS failed: someone moved it first
	Adopted    uint64     `json:"adopted"`     // pins adopted from messages or catch-up
	Reclaimed  uint64     `json:"reclaimed"`   // pins re-claimed by sync
	Errors     uint64     `json:"errors"`      // failed or timed-out calls
	Skipped    uint64     `json:"skipped"`     // calls not made while the breaker was open
}

// Status reports the store's state and counters.
func (s *Store) Status() Status {
	up, lastErr, down := s.brk.state()
	st := Status{
		Address:    s.cfg.Address,
		Up:         up,
		LastError:  lastErr,
		Claims:     s.stat.claims.Load(),
		ClaimsLost: s.stat.claimsLost.Load(),
		Repins:     s.stat.repins.Load(),
		RepinsLost: s.stat.repinsLost.Load(),
		Adopted:    s.stat.adopted.Load(),
		Reclaimed:  s.stat.reclaimed.Load(),
		Errors:     s.stat.errors.Load(),
		Skipped:    s.stat.skipped.Load(),
	}
	if !down.IsZero() {
		st.DownSince = &down
	}
	return st
}

// Close closes the connections. Cancel Run's context first.
func (s *Store) Close() error { return s.rdb.Close() }
