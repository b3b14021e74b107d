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

func parseRedis(d *caddyfile.Dispenser) (*RedisConfig, error) {
	r := &RedisConfig{}
	if d.NextArg() {
		return nil, d.Errf("pin_store redis: unexpected argument %q; options go in its block", d.Val())
	}
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		opt := d.Val()
		var err error
		switch opt {
		case "address":
			// Placeholders are replaced, and checked, at load.
			if err = oneArg(d, &r.Address); err == nil && !strings.Contains(r.Address, "{") {
				err = checkAddress(d, r.Address)
			}
		case "username":
			err = oneArg(d, &r.Username)
		case "password":
			err = oneArg(d, &r.Password)
		case "key_prefix":
			err = oneArg(d, &r.KeyPrefix)
		case "db":
			var s string
			if err = oneArg(d, &s); err == nil {
				if r.DB, err = strconv.Atoi(s); err != nil || r.DB < 0 {
					err = d.Errf("db: expected a database number (0, 1, ...), got %q", s)
				}
			}
		case "timeout":
			r.Timeout, err = duration(d)
		case "sync_interval":
			r.SyncInterval, err = duration(d)
		case "tls_enabled":
			r.TLSEnabled, err = optionalOnOffOrBool(d)
		case "tls_insecure":
			r.TLSInsecure, err = optionalOnOffOrBool(d)
		default:
			return nil, d.Errf("unrecognized pin_store redis option %q; expected address, username, password, db, key_prefix, timeout, sync_interval, tls_enabled or tls_insecure", opt)
		}
		if err != nil {
			return nil, err
		}
		if d.NextArg() {
			return nil, d.Errf("%s: unexpected argument %q", opt, d.Val())
		}
	}
	return r, nil
}

func oneArg(d *caddyfile.Dispenser, into *string) error {
	opt := d.Val()
	if !d.NextArg() {
		return d.Errf("%s: expected a value", opt)
	}
	*into = d.Val()
	return nil
}

// optionalOnOffOrBool reads caddy-storage-redis's true/false as well as
// on/off; no argument means on.
func optionalOnOffOrBool(d *caddyfile.Dispenser) (bool, error) {
	if d.CountRemainingArgs() == 0 {
		return true, nil
	}
	d.NextArg()
	switch d.Val() {
	case "on", "true":
		return true, nil
	case "off", "false":
		return false, nil
	}
	return false, d.Errf("expected on, off, true or false, got %q", d.Val())
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
