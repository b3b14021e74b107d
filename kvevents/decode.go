package kvevents

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/vmihailenco/msgpack/v5"
	"github.com/vmihailenco/msgpack/v5/msgpcode"
)

type eventKind uint8

const (
	blockStored eventKind = iota + 1
	blockRemoved
	allBlocksCleared
)

// event is what Chains needs of one vLLM KV cache event.
type event struct {
	kind   eventKind
	hashes []uint64
	parent uint64 // BlockStored's parent_block_hash; 0 for None
}

// decodeBatch reads a KVEventBatch payload. It fails on anything that is not one, so that a
// batch applies whole or not at all.
func decodeBatch(payload []byte) ([]event, error) {
	d := msgpack.NewDecoder(bytes.NewReader(payload))
	var events []event
	if isMap(d) {
		n, err := d.DecodeMapLen()
		if err != nil {
			return nil, err
		}
		for range n {
			key, err := d.DecodeString()
			if err != nil {
				return nil, err
			}
			if key != "events" {
				if err := skip(d); err != nil {
					return nil, err
				}
				continue
			}
			if events, err = decodeEvents(d); err != nil {
				return nil, err
			}
		}
	} else {
		n, err := d.DecodeArrayLen()
		if err != nil {
			return nil, err
		}
		if n < 2 {
			return nil, fmt.Errorf("batch has %d fields, want [ts, events, ...]", n)
		}
		if err := skip(d); err != nil { // ts
			return nil, err
		}
		if events, err = decodeEvents(d); err != nil {
			return nil, err
		}
		for range n - 2 {
			if err := skip(d); err != nil {
				return nil, err
			}
		}
	}
	if _, err := d.PeekCode(); err == nil {
		return nil, errors.New("bytes after the batch")
	}
	return events, nil
}

func isMap(d *msgpack.Decoder) bool {
	c, err := d.PeekCode()
	return err == nil && (msgpcode.IsFixedMap(c) || c == msgpcode.Map16 || c == msgpcode.Map32)
}

func decodeEvents(d *msgpack.Decoder) ([]event, error) {
	n, err := d.DecodeArrayLen()
	if err != nil {
		return nil, err
	}
	var events []event // not sized from n: n comes from the publisher
	hashes := 0
	for range n {
		ev, known, err := decodeEvent(d)
		if err != nil {
			return nil, err
		}
		if hashes += len(ev.hashes); hashes > maxBatchHashes {
			return nil, fmt.Errorf("over %d block hashes in one batch", maxBatchHashes)
		}
		if known {
			events = append(events, ev)
		}
	}
	return events, nil
}

// arrayFields are where the array form puts the fields this package reads (vLLM's field order).
var arrayFields = map[string]struct{ hashes, parent, medium int }{
	"BlockStored":  {hashes: 1, parent: 2, medium: 6},
	"BlockRemoved": {hashes: 1, medium: 2},
}

// decodeEvent reads one event, map- or array-shaped. known is false for event types this
// package does not use and for blocks stored or removed off the GPU.
func decodeEvent(d *msgpack.Decoder) (ev event, known bool, err error) {
	var tag, medium string
	var hashes []uint64
	var parent uint64
	if isMap(d) {
		n, err := d.DecodeMapLen()
		if err != nil {
			return ev, false, err
		}
		for range n {
			key, err := d.DecodeString()
			if err != nil {
				return ev, false, err
			}
			switch key {
			case "type":
				tag, err = d.DecodeString()
			case "block_hashes":
				hashes, err = decodeHashes(d)
			case "parent_block_hash":
				parent, err = decodeOptionalHash(d)
			case "medium":
				medium, err = decodeOptionalString(d)
			default:
				err = skip(d)
			}
			if err != nil {
				return ev, false, err
			}
		}
	} else {
		n, err := d.DecodeArrayLen()
		if err != nil {
			return ev, false, err
		}
		if n < 1 {
			return ev, false, errors.New("event without a tag")
		}
		if tag, err = d.DecodeString(); err != nil {
			return ev, false, err
		}
		at := arrayFields[tag] // zeros for other tags: their fields are all skipped
		for i := 1; i < n; i++ {
			switch i {
			case at.hashes:
				hashes, err = decodeHashes(d)
			case at.parent:
				parent, err = decodeOptionalHash(d)
			case at.medium:
				medium, err = decodeOptionalString(d)
			default:
				err = skip(d)
			}
			if err != nil {
				return ev, false, err
			}
		}
	}
	switch tag {
	case "BlockStored":
		ev.kind = blockStored
	case "BlockRemoved":
		ev.kind = blockRemoved
	case "AllBlocksCleared":
		return event{kind: allBlocksCleared}, true, nil
	case "":
		return ev, false, errors.New("event without a type")
	default:
		return ev, false, nil
	}
	if hashes == nil {
		return ev, false, fmt.Errorf("%s without block_hashes", tag)
	}
	ev.hashes, ev.parent = hashes, parent
	return ev, medium == "" || medium == "GPU", nil
}

func decodeOptionalString(d *msgpack.Decoder) (string, error) {
	if c, err := d.PeekCode(); err == nil && c == msgpcode.Nil {
		return "", d.DecodeNil()
	}
	return d.DecodeString()
}

// decodeOptionalHash reads a hash or nil (0).
func decodeOptionalHash(d *msgpack.Decoder) (uint64, error) {
	if c, err := d.PeekCode(); err == nil && c == msgpcode.Nil {
		return 0, d.DecodeNil()
	}
	return decodeHash(d)
}

// maxBatchHashes bounds the block hashes of one batch: an engine step stores or evicts at most
// a few thousand blocks, and a publisher's 4 MiB of one-byte hashes would otherwise take 32 MiB
// and, under the lock routing waits on, a long time to apply.
const maxBatchHashes = 1 << 16

func decodeHashes(d *msgpack.Decoder) ([]uint64, error) {
	n, err := d.DecodeArrayLen()
	if err != nil {
		return nil, err
	}
	if n < 0 {
		return nil, errors.New("block_hashes is nil")
	}
	if n > maxBatchHashes {
		return nil, fmt.Errorf("%d block hashes in one event, over %d", n, maxBatchHashes)
	}
	hashes := []uint64{}
	for range n {
		h, err := decodeHash(d)
		if err != nil {
			return nil, err
		}
		hashes = append(hashes, h)
	}
	return hashes, nil
}

// decodeHash reads one of vLLM's ExternalBlockHash values: an integer (negative ones are the
// same 64 bits), or bytes, of which the last 8 are the integer form.
func decodeHash(d *msgpack.Decoder) (uint64, error) {
	c, err := d.PeekCode()
	if err != nil {
		return 0, err
	}
	switch {
	case c == msgpcode.Uint64:
		return d.DecodeUint64()
	case msgpcode.IsFixedNum(c) || (c >= msgpcode.Uint8 && c <= msgpcode.Int64):
		v, err := d.DecodeInt64()
		return uint64(v), err
	case msgpcode.IsBin(c):
		b, err := d.DecodeBytes()
		if err != nil {
			return 0, err
		}
		if len(b) == 0 || len(b) > 64 {
			return 0, fmt.Errorf("block hash of %d bytes", len(b))
		}
		var last8 [8]byte
		copy(last8[8-min(8, len(b)):], b[max(0, len(b)-8):])
		return binary.BigEndian.Uint64(last8[:]), nil
	}
	return 0, fmt.Errorf("block hash of msgpack type %#x", c)
}

// maxSkipDepth bounds the nesting of a value skipped. msgpack's own Skip recurses once per
// level, so a message nested millions of levels deep (MaxMessageBytes hold that many) would
// overflow the stack, which kills the process; vLLM's fields nest a level or two.
const maxSkipDepth = 32

// skip reads past the next value, refusing one nested past maxSkipDepth.
func skip(d *msgpack.Decoder) error { return skipNested(d, 0) }

func skipNested(d *msgpack.Decoder, depth int) error {
	c, err := d.PeekCode()
	if err != nil {
		return err
	}
	array := msgpcode.IsFixedArray(c) || c == msgpcode.Array16 || c == msgpcode.Array32
	object := msgpcode.IsFixedMap(c) || c == msgpcode.Map16 || c == msgpcode.Map32
	if !array && !object {
		return d.Skip() // a scalar, string, binary or extension: no recursion
	}
	if depth == maxSkipDepth {
		return fmt.Errorf("a value nested over %d levels", maxSkipDepth)
	}
	var n int
	if array {
		n, err = d.DecodeArrayLen()
	} else {
		n, err = d.DecodeMapLen()
		n *= 2 // keys and values
	}
	if err != nil {
		return err
	}
	for range n {
		if err := skipNested(d, depth+1); err != nil {
			return err
		}
	}
	return nil
}
