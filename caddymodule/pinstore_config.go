package caddymodule

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"

	"github.com/lmwarden/caddy-warden/pinstore"
)

// PinStoreConfig says where a model's pins are shared. Empty, they are the
// instance's own (kept across restarts by the pin snapshot).
type PinStoreConfig struct {
	// Redis shares pins with every Caddy instance that uses the same server,
	// database and key prefix, so that a conversation whose turns reach
	// different instances stays on one replica.
	Redis *RedisConfig `json:"redis,omitempty"`
}

// RedisConfig reaches the Redis server of a shared pin store. The option
// names are caddy-storage-redis's; fields accept placeholders such as
// {env.REDIS_PASSWORD}, replaced at load.
type RedisConfig struct {
	// Address is host:port (default 127.0.0.1:6379).
	Address  string `json:"address,omitempty"`
	Username string `json:"username,omitempty"`
	Password string `json:"password,omitempty"`
	DB       int    `json:"db,omitempty"`
	// KeyPrefix starts every key (default "warden"): instances share pins
	// when they share the prefix and the model's name.
	KeyPrefix string `json:"key_prefix,omitempty"`
	// Timeout bounds each call (default 50ms); a request whose conversation
	// is new to this instance waits at most this long for the store.
	Timeout     caddy.Duration `json:"timeout,omitempty"`
	TLSEnabled  bool           `json:"tls_enabled,omitempty"`
	TLSInsecure bool           `json:"tls_insecure,omitempty"`
	// SyncInterval is how often the pins used meanwhile have their expiry
	// refreshed and are compared with the store's, in one batch (default 5s).
	SyncInterval caddy.Duration `json:"sync_interval,omitempty"`
}

// pinStore is the model's store: its own, else the app's; nil means local.
func (c *ModelConfig) pinStore(app *PinStoreConfig) *RedisConfig {
	if c.PinStore != nil {
		return c.PinStore.Redis
	}
	if app != nil {
		return app.Redis
	}
	return nil
}

// storeConfig is c with its placeholders replaced, as the client needs it.
func (c *RedisConfig) storeConfig() pinstore.Config {
	repl := caddy.NewReplacer()
	return pinstore.Config{
		Address:     repl.ReplaceKnown(c.Address, ""),
		Username:    repl.ReplaceKnown(c.Username, ""),
		Password:    repl.ReplaceKnown(c.Password, ""),
		DB:          c.DB,
		KeyPrefix:   repl.ReplaceKnown(c.KeyPrefix, ""),
		Timeout:     time.Duration(c.Timeout),
		TLSEnabled:  c.TLSEnabled,
		TLSInsecure: c.TLSInsecure,
	}
}

// parsePinStore reads `pin_store local` or `pin_store redis { ... }`.
func parsePinStore(d *caddyfile.Dispenser) (*PinStoreConfig, error) {
	if !d.NextArg() {
		return nil, d.Err("pin_store: expected local or redis")
	}
	switch kind := d.Val(); kind {
	case "local":
		if d.NextBlock(d.Nesting()) {
			return nil, d.Err("pin_store local takes no block")
		}
		return &PinStoreConfig{}, nil
	case "redis":
		r, err := parseRedis(d)
		if err != nil {
			return nil, err
		}
		return &PinStoreConfig{Redis: r}, nil
	default:
		return nil, d.Errf("pin_store: expected local or redis, got %q", kind)
	}
}

// removedRedisOptions are the pin_store redis options a Caddyfile no
// longer takes.
var removedRedisOptions = map[string]string{
	"sync_interval": redisField("sync_interval"),
	"tls_insecure":  redisField("tls_insecure"),
}

func redisField(name string) string {
	return fmt.Sprintf("%s is no longer a Caddyfile option: set %q in the pin store's JSON (pin_store.redis), see docs/shared-pins.md", name, name)
}

func parseRedis(d *caddyfile.Dispenser) (*RedisConfig, error) {
	r := &RedisConfig{}
	if d.NextArg() {
		return nil, d.Errf("pin_store redis: unexpected argument %q; options go in its block", d.Val())
	}
	text := func(into *string) option {
		return option{parse: func(d *caddyfile.Dispenser) error {
			if !d.Args(into) {
				return d.Errf("%s: expected a value", d.Val())
			}
			return nil
		}}
	}
	address := text(&r.Address)
	err := parseBlock(d, "pin_store redis", map[string]option{
		"address": {parse: func(d *caddyfile.Dispenser) error {
			if err := address.parse(d); err != nil {
				return err
			}
			if strings.Contains(r.Address, "{") { // a placeholder, replaced and checked at load
				return nil
			}
			return checkAddress(d, r.Address)
		}},
		"username":   text(&r.Username),
		"password":   text(&r.Password),
		"key_prefix": text(&r.KeyPrefix),
		"db": {parse: func(d *caddyfile.Dispenser) (err error) {
			r.DB, err = argument(d, "a database number (0, 1, ...)", func(s string) (int, bool) {
				n, err := strconv.Atoi(s)
				return n, err == nil && n >= 0
			})
			return err
		}},
		"timeout": {parse: func(d *caddyfile.Dispenser) (err error) {
			r.Timeout, err = duration(d)
			return err
		}},
		"tls_enabled": {parse: func(d *caddyfile.Dispenser) (err error) {
			r.TLSEnabled, err = onOff(d)
			return err
		}},
	}, removedRedisOptions)
	return r, err
}

// validatePinStore checks the store's settings; errors name the model.
func validatePinStore(name string, r *RedisConfig) error {
	if r == nil {
		return nil
	}
	if r.Timeout < 0 || r.SyncInterval < 0 {
		return fmt.Errorf("model %q: pin_store redis: timeout and sync_interval must not be negative", name)
	}
	if err := r.storeConfig().Validate(); err != nil {
		return fmt.Errorf("model %q: pin_store redis: %v", name, err)
	}
	return nil
}
