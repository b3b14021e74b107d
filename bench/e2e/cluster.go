package e2e

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/lmwarden/caddy-warden/internal/caddyproc"
	"github.com/lmwarden/caddy-warden/internal/redisproc"
)

// Pin stores the Caddy instances of a run can share.
const (
	PinStoreNone  = "none"  // each instance keeps its own pins
	PinStoreRedis = "redis" // a private redis-server, shared by every instance
)

// InstanceHeader is the response header in which each Caddy instance of a
// cluster names itself ("i0", "i1", ...), so that a client behind the front
// can tell which instance served a request.
const InstanceHeader = "X-Warden-Instance"

// redisTimeout is pin_store redis's timeout in every instance's config; it
// is a network budget on loopback, so it is not divided by the time scale.
const redisTimeout = "50ms"

// ClusterOptions lay out the Caddy side of a run.
type ClusterOptions struct {
	// Instances is how many identically configured Caddy instances run;
	// with more than one, a front Caddy spreads requests over them at random.
	Instances int
	// PinStore is PinStoreNone (or empty) or PinStoreRedis.
	PinStore string
	// Bin is the Caddy binary (cmd/caddy).
	Bin string
	// DataDir holds each instance's storage directory (its pin snapshots),
	// kept across that instance's restarts.
	DataDir string
	// Front is how the front retries and keeps dead instances out.
	Front FrontSettings
	// Log receives Caddy's and Redis's output; nil discards it.
	Log io.Writer
	// ModelFields are JSON fields of every instance's warden models Models
	// (nil: m) that a Caddyfile does not offer (docs/configuration.md), set
	// in the JSON `caddy adapt` makes of the instance's Caddyfile.
	ModelFields map[string]any
	Models      []string
}

// FrontSettings are the front Caddy's reverse_proxy options, in wall time.
type FrontSettings struct {
	// TryDuration is lb_try_duration: how long a request may go on trying
	// instances (a dead one refuses the connection at once).
	TryDuration time.Duration
	// TryInterval is lb_try_interval.
	TryInterval time.Duration
	// FailDuration is fail_duration: how long an instance that failed a
	// request stays out of the random choice.
	FailDuration time.Duration
}

// DefaultFront is the front of a benchmark run.
var DefaultFront = FrontSettings{TryDuration: 5 * time.Second, TryInterval: 50 * time.Millisecond, FailDuration: 2 * time.Second}

func (o ClusterOptions) check() error {
	if o.Instances < 1 {
		return errors.New("at least one Caddy instance")
	}
	switch o.PinStore {
	case "", PinStoreNone, PinStoreRedis:
		return nil
	}
	return fmt.Errorf("unknown pin store %q: none or redis", o.PinStore)
}

// Cluster is the Caddy side of a run: one instance, or several behind a
// front, and the Redis they share.
type Cluster struct {
	// Site is where clients send requests: the front's, or the only
	// instance's.
	Site      string
	Instances []*Instance
	// Front is nil with a single instance.
	Front *caddyproc.Process
	// Redis is nil without a Redis pin store.
	Redis *redisproc.Server

	o ClusterOptions
}

// Instance is one warden Caddy of a cluster.
type Instance struct {
	// Name is what it answers in InstanceHeader: "i0", "i1", ...
	Name string
	// Site and Admin are its listen and admin addresses, kept across
	// restarts; DataDir is its storage.
	Site    string
	Admin   string
	DataDir string
	Proc    *caddyproc.Process
	// config is its config as last started or loaded.
	config string
}

// Global is the lines an instance's `warden { }` global block needs for the
// cluster's pin store (none without one).
func (c *Cluster) Global() string {
	if c.Redis == nil {
		return ""
	}
	return fmt.Sprintf(`		pin_store redis {
			address %s
			key_prefix warden
			timeout %s
		}
`, c.Redis.Addr, redisTimeout)
}

// SiteDirectives is what an instance's site block adds: its name in the
// responses.
func (inst *Instance) SiteDirectives() string {
	return fmt.Sprintf("\theader %s %s\n", InstanceHeader, inst.Name)
}

// StartCluster starts Redis (if asked), the instances, each with the config
// config writes, and the front (with more than one instance). An
// instance's config must set `admin` to inst.Admin, serve http://inst.Site,
// and hold c.Global() inside its global `warden { }` block and
// inst.SiteDirectives() inside its site block.
func StartCluster(ctx context.Context, o ClusterOptions, config func(c *Cluster, inst *Instance) string) (*Cluster, error) {
	if err := o.check(); err != nil {
		return nil, err
	}
	if o.Front == (FrontSettings{}) {
		o.Front = DefaultFront
	}
	// Every address at once: free ports taken one at a time may repeat,
	// and Caddy listens with SO_REUSEPORT, so two of its listeners on one
	// port would share its connections.
	addrs, err := FreeAddrs(2*o.Instances + 3)
	if err != nil {
		return nil, err
	}
	next := func() string { a := addrs[0]; addrs = addrs[1:]; return a }
	c := &Cluster{o: o}
	redisAddr := next()
	if o.PinStore == PinStoreRedis {
		r, err := redisproc.Start(ctx, redisproc.Options{Addr: redisAddr, Log: o.Log})
		if err != nil {
			return nil, err
		}
		c.Redis = r
	}
	for i := range o.Instances {
		inst := &Instance{Name: fmt.Sprintf("i%d", i), DataDir: filepath.Join(o.DataDir, fmt.Sprintf("caddy-i%d", i))}
		if err := os.MkdirAll(inst.DataDir, 0o755); err != nil {
			c.Stop()
			return nil, err
		}
		inst.Site, inst.Admin = next(), next()
		if inst.config, err = c.Config(config(c, inst)); err != nil {
			c.Stop()
			return nil, fmt.Errorf("caddy instance %s: %v", inst.Name, err)
		}
		if inst.Proc, err = caddyproc.StartIn(inst.DataDir, o.Bin, inst.config, inst.Admin, o.Log); err != nil {
			c.Stop()
			return nil, fmt.Errorf("caddy instance %s: %v", inst.Name, err)
		}
		c.Instances = append(c.Instances, inst)
	}
	c.Site = c.Instances[0].Site
	if o.Instances == 1 {
		return c, nil
	}
	site, admin := next(), next()
	if c.Front, err = caddyproc.Start(o.Bin, c.frontConfig(site, admin), admin, o.Log); err != nil {
		c.Stop()
		return nil, fmt.Errorf("front caddy: %v", err)
	}
	c.Site = site
	return c, nil
}

// FreeAddrs returns n distinct loopback addresses whose ports were free a
// moment ago (all held open together, then closed).
func FreeAddrs(n int) ([]string, error) {
	var addrs []string
	var lns []net.Listener
	defer func() {
		for _, ln := range lns {
			ln.Close()
		}
	}()
	for range n {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		lns = append(lns, ln)
		addrs = append(addrs, ln.Addr().String())
	}
	return addrs, nil
}

// frontConfig is the front Caddy: every request to a random instance,
// retried on another when the chosen one refuses the connection, or fails
// before answering (the request body is buffered for that).
func (c *Cluster) frontConfig(site, admin string) string {
	var sites []string
	for _, inst := range c.Instances {
		sites = append(sites, inst.Site)
	}
	f := c.o.Front
	return fmt.Sprintf(`{
	admin %s
	default_bind 127.0.0.1
	log {
		level ERROR
	}
}
http://%s {
	reverse_proxy %s {
		lb_policy random
		lb_try_duration %s
		lb_try_interval %s
		fail_duration %s
		lb_retry_match {
			method POST
		}
		request_buffers 4MB
		flush_interval -1
	}
}
`, admin, site, strings.Join(sites, " "), f.TryDuration, f.TryInterval, f.FailDuration)
}

// Do sends the same admin request to every instance.
func (c *Cluster) Do(method, path string, body any) error {
	for _, inst := range c.Instances {
		if err := inst.Proc.Do(method, path, body, nil); err != nil {
			return fmt.Errorf("caddy instance %s: %v", inst.Name, err)
		}
	}
	return nil
}

// Config is an instance's config from its Caddyfile: the Caddyfile itself,
// or with ModelFields the JSON `caddy adapt` makes of it with them set.
func (c *Cluster) Config(caddyfile string) (string, error) {
	if c.o.ModelFields == nil {
		return caddyfile, nil
	}
	models := c.o.Models
	if models == nil {
		models = []string{"m"}
	}
	fields := map[string]map[string]any{}
	for _, m := range models {
		fields[m] = c.o.ModelFields
	}
	return caddyproc.Adapt(c.o.Bin, caddyfile, fields)
}

// Kill ends instance i with SIGKILL (no shutdown work, no final snapshot).
func (c *Cluster) Kill(i int) { c.Instances[i].Proc.Kill() }

// StopInstance stops instance i gracefully (SIGINT: Caddy stops its apps,
// warden writes its pin snapshot).
func (c *Cluster) StopInstance(i int) error { return c.Instances[i].Proc.Stop() }

// StartInstance starts a stopped or killed instance again, on the same
// addresses and storage, with its last config.
func (c *Cluster) StartInstance(i int) error {
	inst := c.Instances[i]
	p, err := caddyproc.StartIn(inst.DataDir, c.o.Bin, inst.config, inst.Admin, c.o.Log)
	if err != nil {
		return fmt.Errorf("caddy instance %s: %v", inst.Name, err)
	}
	inst.Proc = p
	return nil
}

// Stop ends the front, the instances and Redis.
func (c *Cluster) Stop() {
	if c == nil {
		return
	}
	if c.Front != nil {
		c.Front.Stop()
	}
	for _, inst := range c.Instances {
		if inst.Proc != nil {
			inst.Proc.Stop()
		}
	}
	c.Redis.Stop()
}
