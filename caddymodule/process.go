package caddymodule

import (
	"fmt"
	"net"
	"strconv"
	"sync"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/lmwarden/caddy-warden/supervise"
)

// processes holds the supervised vLLM servers by identity. A reload that
// keeps a process's command, environment and directory takes the same
// supervisor (and so the same running process) before the old config lets
// go of it; a changed one gets a new process and the old one is stopped.
var processes = caddy.NewUsagePool()

// fromProcesses completes the model from its processes' command lines:
// addresses from --port, the ranks from --data-parallel-size.
func (c *ModelConfig) fromProcesses() error {
	for i := range c.Replicas {
		r := &c.Replicas[i]
		if err := r.Process.fillAddress(&r.Address); err != nil {
			return err
		}
	}
	if c.Server == nil || c.Server.Process == nil {
		return nil
	}
	if err := c.Server.Process.fillAddress(&c.Server.Address); err != nil {
		return err
	}
	if c.Server.Ranks == 0 {
		ranks, found, err := supervise.IntFlag(c.Server.Process.Command, "--data-parallel-size")
		if err != nil {
			return err
		}
		if found {
			c.Server.Ranks = ranks
		}
	}
	return nil
}

// fillAddress takes the port from --port when no address is given.
func (p *ProcessConfig) fillAddress(addr *string) error {
	if p == nil || *addr != "" {
		return nil
	}
	port, found, err := supervise.IntFlag(p.Command, "--port")
	if err != nil {
		return err
	}
	if !found {
		return fmt.Errorf("process %v: give the replica an address or the command a --port", p.Command)
	}
	*addr = net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	return nil
}

// resolveMaxNumSeqs sets the max_num_seqs warden routes with and where it
// came from: the config's, else the smallest --max-num-seqs of the
// processes the app launches, else what vLLM runs without the flag.
func (c *ModelConfig) resolveMaxNumSeqs() error {
	if c.MaxNumSeqs > 0 {
		c.maxNumSeqs, c.maxNumSeqsSource = c.MaxNumSeqs, MaxNumSeqsFromConfig
		return nil
	}
	c.maxNumSeqs, c.maxNumSeqsSource = vllmDefaultMaxNumSeqs, MaxNumSeqsVLLMDefault
	for _, p := range c.processSpecs() {
		n, found, err := supervise.IntFlag(p.Command, "--max-num-seqs")
		if err != nil {
			return err
		}
		if found && (c.maxNumSeqsSource != MaxNumSeqsFromProcess || n < c.maxNumSeqs) {
			c.maxNumSeqs, c.maxNumSeqsSource = n, MaxNumSeqsFromProcess
		}
	}
	return nil
}

// processSpecs are the model's processes by server address.
func (c *ModelConfig) processSpecs() map[string]supervise.Spec {
	specs := map[string]supervise.Spec{}
	add := func(addr string, p *ProcessConfig) {
		if p != nil {
			specs[addr] = supervise.Spec{
				Command:        p.Command,
				Env:            p.Env,
				Dir:            p.Dir,
				HealthURL:      "http://" + addr + "/health",
				StartupTimeout: time.Duration(p.StartupTimeout),
				StopGrace:      time.Duration(p.StopGrace),
			}
		}
	}
	for _, r := range c.Replicas {
		add(r.Address, r.Process)
	}
	if c.Server != nil {
		add(c.Server.Address, c.Server.Process)
	}
	return specs
}

// processKey is what makes two specs the same process: timeouts may change
// without restarting a model that took minutes to load.
func processKey(s supervise.Spec) string {
	s.StartupTimeout, s.StopGrace = 0, 0
	return s.Key()
}

// process is one supervised server of a loaded config.
type process struct {
	key  string
	addr string
	sup  *supervise.Supervisor
}

// loadProcesses takes a reference on each process of the model, creating
// (not starting) the ones not running yet.
func loadProcesses(model string, cfg *ModelConfig) ([]process, error) {
	var out []process
	for addr, spec := range cfg.processSpecs() {
		if err := spec.Validate(); err != nil {
			releaseProcesses(out)
			return nil, fmt.Errorf("model %q, server %s: %v", model, addr, err)
		}
		key := processKey(spec)
		v, _, err := processes.LoadOrNew(key, func() (caddy.Destructor, error) {
			return supervise.New(spec, supervise.Options{})
		})
		if err != nil {
			releaseProcesses(out)
			return nil, fmt.Errorf("model %q, server %s: %v", model, addr, err)
		}
		out = append(out, process{key: key, addr: addr, sup: v.(*supervise.Supervisor)})
	}
	return out, nil
}

// releaseProcesses drops the references, in parallel: a process whose last
// reference goes is stopped, and each may take its whole stop grace.
func releaseProcesses(ps []process) {
	var wg sync.WaitGroup
	for _, p := range ps {
		wg.Go(func() { _, _ = processes.Delete(p.key) })
	}
	wg.Wait()
}

// startProcesses starts the supervisors not started yet.
func startProcesses(ps []process) {
	for _, p := range ps {
		p.sup.Start()
	}
}
