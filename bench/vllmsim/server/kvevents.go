package server

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/lmwarden/caddy-warden/bench/vllmsim/engine"
)

// KVEventsConfig is vLLM's --kv-events-config, as far as the simulator implements it: a ZMQ
// PUB socket per DP rank on 127.0.0.1, no replay socket.
type KVEventsConfig struct {
	EnableKVCacheEvents bool   `json:"enable_kv_cache_events"`
	Publisher           string `json:"publisher"` // "zmq" (the default when enabled) or "null"
	Endpoint            string `json:"endpoint"`  // tcp://127.0.0.1:PORT; rank r binds PORT+r
	Topic               string `json:"topic"`
}

// defaultKVEventsEndpoint is vLLM's default port, on loopback.
const defaultKVEventsEndpoint = "tcp://127.0.0.1:5557"

// kvEventsHWM is vLLM's default PUB high-water mark: batches past it are dropped.
const kvEventsHWM = 100_000

// ParseKVEventsConfig reads the flag's JSON; keys the simulator does not implement are errors.
func ParseKVEventsConfig(s string) (KVEventsConfig, error) {
	var c KVEventsConfig
	d := json.NewDecoder(strings.NewReader(s))
	d.DisallowUnknownFields()
	if err := d.Decode(&c); err != nil {
		return c, fmt.Errorf("--kv-events-config: %w", err)
	}
	if c.enabled() {
		if c.Publisher == "" {
			c.Publisher = "zmq"
		}
		if c.Endpoint == "" {
			c.Endpoint = defaultKVEventsEndpoint
		}
	}
	return c, c.validate()
}

func (c KVEventsConfig) enabled() bool { return c.EnableKVCacheEvents && c.Publisher != "null" }

func (c KVEventsConfig) validate() error {
	if !c.enabled() {
		return nil
	}
	if c.Publisher != "zmq" {
		return fmt.Errorf("kv events publisher %q: only zmq and null exist", c.Publisher)
	}
	_, err := c.port()
	return err
}

// port reads the endpoint, which must be on 127.0.0.1: the simulator never listens elsewhere.
func (c KVEventsConfig) port() (int, error) {
	hostPort, ok := strings.CutPrefix(c.Endpoint, "tcp://")
	host, port, err := net.SplitHostPort(hostPort)
	if !ok || err != nil || host != "127.0.0.1" {
		return 0, fmt.Errorf("kv events endpoint %q: want tcp://127.0.0.1:PORT", c.Endpoint)
	}
	p, err := strconv.Atoi(port)
	if err != nil || p < 0 || p > 65535 {
		return 0, fmt.Errorf("kv events endpoint %q: bad port", c.Endpoint)
	}
	return p, nil
}

// endpoint is rank's address: vLLM offsets the port by the DP rank (port 0 stays 0: any).
func (c KVEventsConfig) endpoint(rank int) string {
	p, _ := c.port()
	if p != 0 {
		p += rank
	}
	return fmt.Sprintf("tcp://127.0.0.1:%d", p)
}

// kvPublisher is one rank's ZmqEventPublisher: [topic, sequence, KVEventBatch] per step that
// changed the cache.
type kvPublisher struct {
	sock      zmq4.Socket
	topic     []byte
	rank      int
	blockSize int
	published atomic.Uint64 // batches sent so far, which is also the next sequence number
}

func newKVPublisher(c KVEventsConfig, rank, blockSize int) (*kvPublisher, error) {
	sock := zmq4.NewPub(context.Background())
	if err := sock.SetOption(zmq4.OptionHWM, kvEventsHWM); err != nil {
		sock.Close()
		return nil, err
	}
	if err := sock.Listen(c.endpoint(rank)); err != nil {
		sock.Close()
		return nil, fmt.Errorf("kv events: %w", err)
	}
	return &kvPublisher{sock: sock, topic: []byte(c.Topic), rank: rank, blockSize: blockSize}, nil
}

// endpoint is where subscribers connect.
func (p *kvPublisher) endpoint() string { return "tcp://" + p.sock.Addr().String() }

// publish sends one step's events as a batch. It never blocks on subscribers.
func (p *kvPublisher) publish(events []engine.KVEvent) error {
	payload, err := encodeKVBatch(time.Now(), events, p.rank, p.blockSize)
	if err != nil {
		return err
	}
	seq := binary.BigEndian.AppendUint64(nil, p.published.Load())
	if err := p.sock.Send(zmq4.NewMsgFrom(p.topic, seq, payload)); err != nil {
		return err
	}
	p.published.Add(1)
	return nil
}

// The batch as vLLM 0.26's msgspec encodes it (vllm/distributed/kv_events.py): the batch an
// array, each event a map tagged by "type", fields in declaration order.
type kvBatch struct {
	_msgpack         struct{} `msgpack:",as_array"`
	TS               float64
	Events           []any
	DataParallelRank int
}

type blockStoredMsg struct {
	Type            string   `msgpack:"type"`
	BlockHashes     []uint64 `msgpack:"block_hashes"`
	ParentBlockHash *uint64  `msgpack:"parent_block_hash"`
	TokenIDs        []uint32 `msgpack:"token_ids"`
	BlockSize       int      `msgpack:"block_size"`
	LoraID          *int     `msgpack:"lora_id"`
	Medium          string   `msgpack:"medium"`
	LoraName        *string  `msgpack:"lora_name"`
	GroupIdx        *int     `msgpack:"group_idx,omitempty"`
	KVCacheSpecKind string   `msgpack:"kv_cache_spec_kind,omitempty"`
}

type blockRemovedMsg struct {
	Type        string   `msgpack:"type"`
	BlockHashes []uint64 `msgpack:"block_hashes"`
	Medium      string   `msgpack:"medium"`
	GroupIdx    *int     `msgpack:"group_idx,omitempty"`
}

// gpuGroup is the KV cache group of every GPU block: a dense model has one. The
// OffloadingConnector's host-tier events leave group_idx and kv_cache_spec_kind at their
// defaults, which msgspec omits; they also carry no parent and no tokens.
var gpuGroup = new(int)

func encodeKVBatch(ts time.Time, events []engine.KVEvent, rank, blockSize int) ([]byte, error) {
	batch := kvBatch{TS: float64(ts.UnixNano()) / 1e9, DataParallelRank: rank, Events: make([]any, len(events))}
	for i, ev := range events {
		gpu := ev.Medium == engine.MediumGPU
		switch ev.Kind {
		case engine.BlockStored:
			m := blockStoredMsg{Type: "BlockStored", BlockHashes: ev.BlockHashes, TokenIDs: ev.TokenIDs,
				BlockSize: blockSize, Medium: ev.Medium.String()}
			if ev.ParentBlockHash != 0 {
				m.ParentBlockHash = &ev.ParentBlockHash
			}
			if gpu {
				m.GroupIdx, m.KVCacheSpecKind = gpuGroup, "full_attention"
			} else {
				m.TokenIDs = []uint32{}
			}
			batch.Events[i] = m
		case engine.BlockRemoved:
			m := blockRemovedMsg{Type: "BlockRemoved", BlockHashes: ev.BlockHashes, Medium: ev.Medium.String()}
			if gpu {
				m.GroupIdx = gpuGroup
			}
			batch.Events[i] = m
		default:
			return nil, fmt.Errorf("unknown KV event kind %d", ev.Kind)
		}
	}
	var buf bytes.Buffer
	err := msgpack.NewEncoder(&buf).Encode(batch)
	return buf.Bytes(), err
}
