// Package server serves simulated vLLM engines over HTTP with vLLM's surface: OpenAI chat
// completions and responses, Anthropic messages, models, health and Prometheus metrics, one
// or more data-parallel engines behind one port, and fault switches for reliability tests.
//
// Engines run in simulated time: a step the engine model says takes d takes d/TimeScale of
// wall time, and every time the server reports (TTFT histogram, offload times) is wall time,
// as a client sees it.
package server

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/lmwarden/caddy-warden/bench/vllmsim/dplb"
	"github.com/lmwarden/caddy-warden/bench/vllmsim/engine"
)

// simClock maps wall time to simulated time: simulated = elapsed wall time x scale.
type simClock struct {
	start time.Time
	scale float64
}

func (c simClock) now() time.Duration {
	return time.Duration(float64(time.Since(c.start)) * c.scale)
}

// wallAt is the wall time at which simulated time reaches sim.
func (c simClock) wallAt(sim time.Duration) time.Time {
	return c.start.Add(time.Duration(float64(sim) / c.scale))
}

// Server is a running simulated vLLM server.
type Server struct {
	cfg     Config
	clock   simClock
	engines []*engineRunner

	lbMu sync.Mutex
	lb   *dplb.Balancer

	faultsMu         sync.Mutex
	faults           Faults
	refuseGeneration uint64

	registry      *prometheus.Registry
	httpServer    *http.Server
	controlServer *http.Server
	addr          string
	controlAddr   string

	listenMu sync.Mutex
	listener net.Listener // nil while refusing
	refusing bool
	conns    map[net.Conn]struct{}
	reopen   chan struct{}
	closed   bool
	stop     context.CancelFunc
	done     sync.WaitGroup
}

// New checks cfg and builds a server; Start makes it listen.
func New(cfg Config) (*Server, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	lb, err := dplb.New(cfg.LB, cfg.DataParallelSize)
	if err != nil {
		return nil, err
	}
	s := &Server{
		cfg:    cfg,
		clock:  simClock{start: time.Now(), scale: cfg.TimeScale},
		lb:     lb,
		conns:  map[net.Conn]struct{}{},
		reopen: make(chan struct{}, 1),
	}
	for rank := range cfg.DataParallelSize {
		e, err := engine.New(cfg.Profile)
		if err != nil {
			return nil, err
		}
		if cfg.KVEvents.enabled() {
			e.EnableKVEvents()
		}
		s.engines = append(s.engines, newEngineRunner(rank, e, s.clock))
	}
	s.registry = prometheus.NewRegistry()
	if err := s.registry.Register(vllmCollector{s}); err != nil {
		return nil, err
	}
	s.httpServer = &http.Server{Handler: s.Handler(), ConnState: s.trackConn, ReadHeaderTimeout: 10 * time.Second}
	if cfg.ControlPort != 0 {
		s.controlServer = &http.Server{Handler: s.ControlHandler(), ReadHeaderTimeout: 10 * time.Second}
	}
	return s, nil
}

// Handler serves the vLLM API, /metrics, /health and the /sim/faults control endpoint.
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/chat/completions", s.handleChatCompletions)
	mux.HandleFunc("POST /v1/messages", s.handleMessages)
	mux.HandleFunc("POST /v1/messages/count_tokens", s.handleCountTokens)
	mux.HandleFunc("POST /v1/responses", s.handleResponses)
	mux.HandleFunc("GET /v1/models", s.handleModels)
	mux.HandleFunc("GET /health", s.handleHealth)
	mux.HandleFunc("GET /version", s.handleVersion)
	mux.HandleFunc("GET /metrics", s.handleMetrics)
	mux.HandleFunc("/sim/faults", s.handleFaults)
	return mux
}

// ControlHandler serves only /sim/faults, for the control port that stays open while the
// main port refuses connections.
func (s *Server) ControlHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/sim/faults", s.handleFaults)
	return mux
}

// Start listens on the configured address (and control port), starts the engines and
// returns; the server runs until Close.
func (s *Server) Start() error {
	ln, err := net.Listen("tcp", net.JoinHostPort(s.cfg.Host, fmt.Sprint(s.cfg.Port)))
	if err != nil {
		return err
	}
	s.addr = ln.Addr().String()
	if s.controlServer != nil {
		cln, err := net.Listen("tcp", net.JoinHostPort(s.cfg.Host, fmt.Sprint(s.cfg.ControlPort)))
		if err != nil {
			ln.Close()
			return err
		}
		s.controlAddr = cln.Addr().String()
		s.spawn(func() { s.controlServer.Serve(cln) })
	}
	if err := s.startKVPublishers(); err != nil {
		ln.Close()
		if s.controlServer != nil {
			s.controlServer.Close()
		}
		s.done.Wait()
		return err
	}
	ctx, stop := context.WithCancel(context.Background())
	s.stop = stop
	for _, r := range s.engines {
		s.spawn(func() { r.run(ctx) })
	}
	if s.lb.PublishesStats() {
		s.spawn(func() { s.publishLoads(ctx) })
	}
	s.listenMu.Lock()
	s.listener = ln
	s.listenMu.Unlock()
	s.spawn(func() { s.serve(ln) })
	s.applyFaults(s.cfg.Faults)
	return nil
}

func (s *Server) spawn(f func()) {
	s.done.Add(1)
	go func() {
		defer s.done.Done()
		f()
	}()
}

// Addr is the address the API listens on (host:port), known after Start.
func (s *Server) Addr() string { return s.addr }

// ControlAddr is the control port's address, or "" without one.
func (s *Server) ControlAddr() string { return s.controlAddr }

// ID names this server in the X-Vllmsim-Engine header: the configured ID, or its address.
func (s *Server) ID() string {
	if s.cfg.ID != "" {
		return s.cfg.ID
	}
	return s.addr
}

// serve runs the API on ln, and again on a new listener each time a refusal ends.
func (s *Server) serve(ln net.Listener) {
	for ln != nil {
		if err := s.httpServer.Serve(ln); errors.Is(err, http.ErrServerClosed) {
			return
		}
		ln = s.awaitReopen()
	}
}

// awaitReopen waits until the refusal ends and listens on the same address again. It returns
// nil when the server closes instead.
func (s *Server) awaitReopen() net.Listener {
	for range s.reopen {
		s.listenMu.Lock()
		if s.closed {
			s.listenMu.Unlock()
			return nil
		}
		if s.refusing {
			s.listenMu.Unlock()
			continue
		}
		ln, err := net.Listen("tcp", s.addr)
		for try := 0; err != nil && try < 50; try++ { // the port may take a moment to free up
			time.Sleep(20 * time.Millisecond)
			ln, err = net.Listen("tcp", s.addr)
		}
		if err != nil {
			s.listenMu.Unlock()
			panic(fmt.Sprintf("vllmsim: cannot listen on %s again after a refusal: %v", s.addr, err))
		}
		s.listener = ln
		s.listenMu.Unlock()
		return ln
	}
	return nil
}

// setRefusing closes the port and every connection, or opens the port again.
func (s *Server) setRefusing(refuse bool) {
	s.listenMu.Lock()
	defer s.listenMu.Unlock()
	s.refusing = refuse
	if s.closed {
		return
	}
	if refuse && s.listener != nil {
		s.listener.Close()
		s.listener = nil
		for c := range s.conns {
			c.Close()
		}
	}
	if !refuse && s.listener == nil {
		s.wakeServe()
	}
}

// wakeServe makes awaitReopen look at the state again; the caller holds listenMu.
func (s *Server) wakeServe() {
	select {
	case s.reopen <- struct{}{}:
	default: // a wake-up is already pending
	}
}

func (s *Server) trackConn(c net.Conn, state http.ConnState) {
	s.listenMu.Lock()
	defer s.listenMu.Unlock()
	switch state {
	case http.StateNew:
		if s.listener == nil {
			c.Close() // accepted just before a refusal closed the port
			return
		}
		s.conns[c] = struct{}{}
	case http.StateClosed, http.StateHijacked:
		delete(s.conns, c)
	}
}

// Close stops the engines, closes the ports and drops open connections.
func (s *Server) Close() error {
	s.listenMu.Lock()
	if s.closed {
		s.listenMu.Unlock()
		return nil
	}
	s.closed = true
	s.wakeServe()
	s.listenMu.Unlock()
	if s.stop != nil {
		s.stop()
	}
	err := s.httpServer.Close()
	if s.controlServer != nil {
		s.controlServer.Close()
	}
	s.done.Wait()
	s.closeKVPublishers()
	return err
}

// startKVPublishers binds each rank's KV events socket, if the config asks for them.
func (s *Server) startKVPublishers() error {
	if !s.cfg.KVEvents.enabled() {
		return nil
	}
	for _, r := range s.engines {
		pub, err := newKVPublisher(s.cfg.KVEvents, r.rank, s.cfg.Profile.BlockSize)
		if err != nil {
			s.closeKVPublishers()
			return err
		}
		r.kvEvents = pub
	}
	return nil
}

func (s *Server) closeKVPublishers() {
	for _, r := range s.engines {
		if r.kvEvents != nil {
			r.kvEvents.sock.Close()
			r.kvEvents = nil
		}
	}
}

// KVEventsEndpoint is where rank's KV events are published (tcp://127.0.0.1:PORT), or "" when
// they are off. Known after Start.
func (s *Server) KVEventsEndpoint(rank int) string {
	if rank < 0 || rank >= len(s.engines) || s.engines[rank].kvEvents == nil {
		return ""
	}
	return s.engines[rank].kvEvents.endpoint()
}

// publishLoads plays the DP coordinator: every dplb.StatsInterval of simulated time it sends
// the engines' queue lengths to the balancer.
func (s *Server) publishLoads(ctx context.Context) {
	ticker := time.NewTicker(time.Duration(float64(dplb.StatsInterval) / s.cfg.TimeScale))
	defer ticker.Stop()
	loads := make([]dplb.EngineLoad, len(s.engines))
	for {
		select {
		case <-ctx.Done():
			return
		case <-ticker.C:
		}
		for i, r := range s.engines {
			st := r.stats()
			loads[i] = dplb.EngineLoad{Waiting: st.Waiting, Running: st.Running, KVUsage: st.KVUsage}
		}
		s.lbMu.Lock()
		s.lb.Publish(loads)
		s.lbMu.Unlock()
	}
}
