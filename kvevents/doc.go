// Package kvevents follows a vLLM replica's prefix cache from the KV cache events it publishes,
// without Caddy: a Subscriber connects a ZMQ SUB socket to one replica's publisher, decodes each
// event batch and keeps the tree of blocks the replica stored (Chains): which block each one
// extends and whether it is still cached. Cached says how many leading blocks of a prompt's
// block-hash chain the replica would serve from its cache; Tail and Evicted follow a
// conversation's chain without hashing its prompt, so without the model's tokenizer, which is
// what rehoming reads (selection/chains.go).
//
// # Wire format
//
// Checked against vllm/distributed/kv_events.py (ZmqEventPublisher, KVEventBatch, BlockStored,
// BlockRemoved, AllBlocksCleared) and against captures from vLLM 0.26.0 reported by its
// consumers. vLLM (--kv-events-config '{"enable_kv_cache_events": true, "publisher": "zmq",
// "endpoint": "tcp://*:5557", "topic": "kv-events"}') binds a PUB socket; DP rank r publishes on
// the endpoint's port + r. Each message has three frames:
//
//	topic | sequence (8 bytes, big-endian, from 0 per publisher) | msgpack payload
//
// The payload is a KVEventBatch, the msgspec array [ts, events, data_parallel_rank]. Since vLLM
// PR #42892 (June 2026, so in 0.26) each event is a msgspec map tagged by "type":
//
//	{"type": "BlockStored", "block_hashes": [h...], "parent_block_hash": h|nil,
//	 "token_ids": [t...], "block_size": n, "lora_id": nil, "medium": "GPU", "lora_name": nil,
//	 "group_idx": 0, ...}
//	{"type": "BlockRemoved", "block_hashes": [h...], "medium": "GPU", ...}
//	{"type": "AllBlocksCleared"}
//
// Older vLLM encoded events as positional arrays with the tag first (["BlockStored",
// block_hashes, parent_block_hash, token_ids, block_size, lora_id, medium, ...]). Both forms are
// read, as is a map-shaped batch. Block hashes are integers (vLLM's default, up to 2^64-1) or
// bytes, of which the last 8 are read big-endian. Events whose medium is set and is not "GPU"
// (offloaded copies) do not change the tree. Unknown fields and event types are skipped.
//
// # Trust
//
// The publisher is another process: a payload that does not decode is counted and skipped
// whole, the tree holds at most Options.MaxBlocks blocks (evicted ones are forgotten first;
// stores past that are counted, not kept), and a connection that announces a ZMQ message over MaxMessageBytes is dropped before it is read. A
// jump in the sequence numbers means batches were lost (vLLM's PUB socket drops them when a
// subscriber falls behind) and the view may be stale; it is counted in Stats.Gaps. A sequence
// that goes back means the publisher restarted with an empty cache, so the tree is emptied.
package kvevents
