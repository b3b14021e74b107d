package engine

import (
	"flag"
	"fmt"
	"math"
	"time"
)

// Profile holds every number the engine model needs: scheduler limits, KV cache geometry and
// the step-time model of one GPU running one model.
type Profile struct {
	// Name identifies the profile (a key of Profiles for the built-in ones).
	Name string
	// MaxNumSeqs caps the requests running at once (vLLM --max-num-seqs).
	MaxNumSeqs int
	// MaxNumBatchedTokens is the token budget of one step (vLLM --max-num-batched-tokens).
	MaxNumBatchedTokens int
	// NumGPUBlocks is the number of KV cache blocks.
	NumGPUBlocks int
	// BlockSize is the number of tokens per KV cache block.
	BlockSize int
	// MaxModelLen caps prompt plus output tokens of one request.
	MaxModelLen int
	// GPUMemoryUtilization is reported in cache_config_info; it does not change the model.
	GPUMemoryUtilization float64
	// ReserveFullPrompt admits a waiting request only when its whole prompt fits in the free
	// blocks, not just its first chunk (vLLM's scheduler_reserve_full_isl, on by default).
	ReserveFullPrompt bool

	// StepOverhead is the fixed cost of every step (scheduling, kernel launches, sampling).
	StepOverhead time.Duration
	// PrefillTokenCost is the compute cost of each prompt (or recomputed) token in a step.
	PrefillTokenCost time.Duration
	// WeightsBytes is read from GPU memory once per step.
	WeightsBytes float64
	// KVBytesPerToken is read once per step for every context token of every scheduled request.
	KVBytesPerToken float64
	// MemBandwidth is the GPU memory bandwidth in bytes per second.
	MemBandwidth float64
	// MemEfficiency is the share of MemBandwidth a step achieves (0..1].
	MemEfficiency float64

	// KVOffloadingSize is the host-memory KV tier in GiB (vLLM --kv-offloading-size); 0 means
	// no tier. Its blocks hold as many tokens as the GPU's.
	KVOffloadingSize float64
	// KVOffloadingBackend is vLLM's --kv-offloading-backend; only "native" (the
	// OffloadingConnector with its CPU spec) is simulated.
	KVOffloadingBackend string
	// KVOffloadBandwidth is the host-GPU link's bytes per second, each way: how fast blocks
	// are copied to the tier and loaded back from it.
	KVOffloadBandwidth float64
}

// Profiles are the built-in profiles by name.
var Profiles = map[string]Profile{
	// 1 x RTX A4000 16 GiB running Qwen3-4B-Instruct-2507 in bf16 with vLLM defaults and
	// max_num_seqs 32, as in the seed's measurements (DESIGN §5).
	"a4000-qwen3-4b": {
		Name:                 "a4000-qwen3-4b",
		MaxNumSeqs:           32,
		MaxNumBatchedTokens:  2048,
		NumGPUBlocks:         2500,
		BlockSize:            16,
		MaxModelLen:          32768,
		GPUMemoryUtilization: 0.9,
		ReserveFullPrompt:    true,
		StepOverhead:         2 * time.Millisecond,
		PrefillTokenCost:     190 * time.Microsecond,
		WeightsBytes:         8.05e9,
		KVBytesPerToken:      2 * 36 * 8 * 128 * 2,
		MemBandwidth:         448e9,
		MemEfficiency:        0.8,
		KVOffloadingBackend:  "native",
		// PCIe 4.0 x16; the README's calibration says where the figure comes from.
		KVOffloadBandwidth: 25e9,
	},
	// 1 x RTX 5090 32 GiB running Gemma-3-27B with 4-bit weights, one card per replica, as in
	// the seed's agent farm (seven of them). The KV figures count the 10 global-attention
	// layers only (vLLM's hybrid allocator keeps the 52 sliding-window layers to their 1,024
	// tokens); the README's calibration section says where each number comes from.
	"rtx5090-gemma3-27b": {
		Name:                 "rtx5090-gemma3-27b",
		MaxNumSeqs:           64,
		MaxNumBatchedTokens:  2048,
		NumGPUBlocks:         8192,
		BlockSize:            16,
		MaxModelLen:          131072,
		GPUMemoryUtilization: 0.9,
		ReserveFullPrompt:    true,
		StepOverhead:         4 * time.Millisecond,
		PrefillTokenCost:     490 * time.Microsecond,
		WeightsBytes:         16.5e9,
		KVBytesPerToken:      2 * 10 * 16 * 128 * 2,
		MemBandwidth:         1792e9,
		MemEfficiency:        0.8,
		KVOffloadingBackend:  "native",
		// PCIe 5.0 x16, about 50 GB/s one way for DMA copies of blocks over 1 MB.
		KVOffloadBandwidth: 50e9,
	},
}

// DefaultProfile is the name of the profile used when none is chosen.
const DefaultProfile = "a4000-qwen3-4b"

// KVCapacityTokens is how many tokens the KV cache holds.
func (p Profile) KVCapacityTokens() int {
	return p.NumGPUBlocks * p.BlockSize
}

// KVCacheGiB is the GPU KV cache's size in GiB, the unit a host tier is compared with.
func (p Profile) KVCacheGiB() float64 {
	return float64(p.KVCapacityTokens()) * p.KVBytesPerToken / (1 << 30)
}

// HostTier reports whether the profile has a host-memory KV tier.
func (p Profile) HostTier() bool { return p.KVOffloadingSize > 0 }

// BlockBytes is the size of one KV block, the unit copied to and from the host tier.
func (p Profile) BlockBytes() float64 { return float64(p.BlockSize) * p.KVBytesPerToken }

// NumHostBlocks is the host tier's slot count as vLLM's CPU spec computes it: the tier's
// bytes divided by the bytes of one block (one cross-layer KV tensor, one rank).
func (p Profile) NumHostBlocks() int {
	if !p.HostTier() || p.BlockBytes() <= 0 {
		return 0
	}
	return int(math.Floor(p.KVOffloadingSize * (1 << 30) / p.BlockBytes()))
}

// TransferTime is how long copying bytes over the host-GPU link takes.
func (p Profile) TransferTime(bytes float64) time.Duration {
	return time.Duration(bytes / p.KVOffloadBandwidth * float64(time.Second))
}

// StepTime is the duration of a step that computes prefillTokens prompt tokens and reads the
// KV of contextTokens tokens: fixed overhead, plus prefill compute, plus the memory-bound pass
// over the weights and the KV cache.
func (p Profile) StepTime(prefillTokens, contextTokens int) time.Duration {
	memSeconds := (p.WeightsBytes + float64(contextTokens)*p.KVBytesPerToken) / (p.MemBandwidth * p.MemEfficiency)
	return p.StepOverhead + time.Duration(prefillTokens)*p.PrefillTokenCost + time.Duration(memSeconds*float64(time.Second))
}

// Validate reports the first setting that cannot describe a working engine.
func (p Profile) Validate() error {
	switch {
	case p.MaxNumSeqs < 1:
		return fmt.Errorf("max_num_seqs must be at least 1, got %d", p.MaxNumSeqs)
	case p.MaxNumBatchedTokens < 1:
		return fmt.Errorf("max_num_batched_tokens must be at least 1, got %d", p.MaxNumBatchedTokens)
	case p.BlockSize < 1:
		return fmt.Errorf("block_size must be at least 1, got %d", p.BlockSize)
	case p.NumGPUBlocks < 1:
		return fmt.Errorf("num_gpu_blocks must be at least 1, got %d", p.NumGPUBlocks)
	case p.MaxModelLen < 2:
		return fmt.Errorf("max_model_len must be at least 2, got %d", p.MaxModelLen)
	case p.MaxModelLen > p.KVCapacityTokens():
		// vLLM refuses to start in this case too: one request could never fit.
		return fmt.Errorf("max_model_len %d exceeds the KV cache capacity of %d tokens (%d blocks of %d)",
			p.MaxModelLen, p.KVCapacityTokens(), p.NumGPUBlocks, p.BlockSize)
	case p.MemBandwidth <= 0 || p.MemEfficiency <= 0 || p.MemEfficiency > 1:
		return fmt.Errorf("memory bandwidth %g B/s at efficiency %g is not usable", p.MemBandwidth, p.MemEfficiency)
	case p.StepOverhead < 0 || p.PrefillTokenCost < 0 || p.WeightsBytes < 0 || p.KVBytesPerToken < 0:
		return fmt.Errorf("step costs must not be negative")
	case p.KVOffloadingSize < 0 || math.IsNaN(p.KVOffloadingSize):
		return fmt.Errorf("kv_offloading_size must be 0 (no host tier) or a positive number of GiB, got %g", p.KVOffloadingSize)
	}
	if !p.HostTier() {
		return nil
	}
	switch {
	case p.KVOffloadingBackend != "native":
		return fmt.Errorf("kv_offloading_backend %q is not simulated: only native", p.KVOffloadingBackend)
	case p.BlockBytes() <= 0:
		return fmt.Errorf("a host tier needs the KV bytes per token, got %g", p.KVBytesPerToken)
	case p.NumHostBlocks() < 1:
		return fmt.Errorf("kv_offloading_size %g GiB holds no block of %.0f bytes", p.KVOffloadingSize, p.BlockBytes())
	case !(p.KVOffloadBandwidth > 0):
		return fmt.Errorf("kv offload bandwidth %g B/s is not usable", p.KVOffloadBandwidth)
	}
	return nil
}

// RegisterFlags exposes every number of the profile as a flag, with p's
// values as defaults; vllmsim and wardenbench share these names.
func (p *Profile) RegisterFlags(fs *flag.FlagSet) {
	fs.StringVar(&p.Name, "profile", p.Name, "engine profile; the flags below override its numbers")
	fs.IntVar(&p.MaxNumSeqs, "max-num-seqs", p.MaxNumSeqs, "most requests running at once per engine")
	fs.IntVar(&p.MaxNumBatchedTokens, "max-num-batched-tokens", p.MaxNumBatchedTokens, "token budget of one step")
	fs.IntVar(&p.NumGPUBlocks, "num-gpu-blocks", p.NumGPUBlocks, "KV cache blocks per engine")
	fs.IntVar(&p.BlockSize, "block-size", p.BlockSize, "tokens per KV cache block")
	fs.IntVar(&p.MaxModelLen, "max-model-len", p.MaxModelLen, "most prompt plus output tokens of one request")
	fs.Float64Var(&p.GPUMemoryUtilization, "gpu-memory-utilization", p.GPUMemoryUtilization, "reported in cache_config_info only")
	fs.BoolVar(&p.ReserveFullPrompt, "scheduler-reserve-full-isl", p.ReserveFullPrompt, "admit a request only when its whole prompt fits in the KV cache")
	fs.DurationVar(&p.StepOverhead, "step-overhead", p.StepOverhead, "fixed cost of every engine step")
	fs.DurationVar(&p.PrefillTokenCost, "prefill-token-cost", p.PrefillTokenCost, "compute cost of each prompt token")
	fs.Float64Var(&p.WeightsBytes, "weights-bytes", p.WeightsBytes, "bytes of weights read every step")
	fs.Float64Var(&p.KVBytesPerToken, "kv-bytes-per-token", p.KVBytesPerToken, "KV cache bytes per token, read every step for each context token")
	fs.Float64Var(&p.MemBandwidth, "mem-bandwidth", p.MemBandwidth, "GPU memory bandwidth in bytes/s")
	fs.Float64Var(&p.MemEfficiency, "mem-efficiency", p.MemEfficiency, "share of the bandwidth a step achieves")
	fs.Float64Var(&p.KVOffloadingSize, "kv-offloading-size", p.KVOffloadingSize, "host-memory KV tier per engine in GiB, as vLLM's flag (0: none)")
	fs.StringVar(&p.KVOffloadingBackend, "kv-offloading-backend", p.KVOffloadingBackend, "host tier backend; only native is simulated")
	fs.Float64Var(&p.KVOffloadBandwidth, "kv-offload-bandwidth", p.KVOffloadBandwidth, "host-GPU link bytes/s each way, for copies to and loads from the host tier")
}

// Args are the flags that give another process (vllmsim) this profile.
func (p Profile) Args() []string {
	var args []string
	fs := flag.NewFlagSet("profile", flag.ContinueOnError)
	p.RegisterFlags(fs)
	fs.VisitAll(func(f *flag.Flag) { args = append(args, "--"+f.Name+"="+f.Value.String()) })
	return args
}
