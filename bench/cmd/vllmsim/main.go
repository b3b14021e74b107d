// Command vllmsim serves simulated vLLM engines on 127.0.0.1: the OpenAI chat completions,
// OpenAI responses and Anthropic messages endpoints, /v1/models, /health and /metrics of a
// vLLM V1 server, with its prefix cache, scheduler and data-parallel balancer modelled in
// simulated time. See bench/vllmsim/README.md.
package main

import (
	"errors"
	"flag"
	"fmt"
	"log"
	"os"
	"os/signal"
	"syscall"

	"github.com/lmwarden/caddy-warden/bench/vllmsim/server"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			os.Exit(0)
		}
		fmt.Fprintln(os.Stderr, "vllmsim:", err)
		os.Exit(2)
	}
}

func run(args []string) error {
	cfg, err := server.ParseFlags(args, os.Stderr)
	if err != nil {
		return err
	}
	srv, err := server.New(cfg)
	if err != nil {
		return err
	}
	if err := srv.Start(); err != nil {
		return err
	}
	p := cfg.Profile
	log.Printf("vllmsim: %s on http://%s: %d engine(s), profile %s, %d blocks of %d tokens, max_num_seqs %d, time scale %g, balancer %s",
		cfg.Model, srv.Addr(), cfg.DataParallelSize, p.Name, p.NumGPUBlocks, p.BlockSize, p.MaxNumSeqs, cfg.TimeScale, cfg.LB)
	if p.HostTier() {
		log.Printf("vllmsim: host KV tier of %g GiB per engine (%d blocks), loads at %.3g GB/s",
			p.KVOffloadingSize, p.NumHostBlocks(), p.KVOffloadBandwidth/1e9)
	}
	if addr := srv.ControlAddr(); addr != "" {
		log.Printf("vllmsim: fault switches on http://%s/sim/faults", addr)
	}
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, os.Interrupt, syscall.SIGTERM)
	<-stop
	return srv.Close()
}
