package fleet

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"math"
	"time"

	"github.com/lmwarden/caddy-warden/selection"
)

// Pins copies the model's session table, for a snapshot.
func (m *Model) Pins() []selection.Pin { return m.router.Snapshot() }

// PinsUsedSince lists the pins used at or after t, for a shared pin store.
func (m *Model) PinsUsedSince(t time.Time) []selection.Pin { return m.router.PinsUsedSince(t) }

// A pin snapshot is binary, not JSON: it holds only hashes and times that
// no one reads by hand, and at 100,000 sessions rewritten every few
// seconds its size and encoding time matter (about 15 bytes a pin against
// some 60 in JSON). The layout, integers as unsigned varints unless said:
//
//	"WPIN" 2                          magic, version
//	n, then n × (length, bytes)       replica IDs, each once
//	newest                            the latest last use, unix ns
//	count, then count × pin            pin: key (8 bytes LE), replica index,
//	                                        newest - last use (ns),
//	                                        last prompt (tokens, 0: unknown)
//	CRC-32C of all the above (4 bytes LE)
//
// Ages from the newest last use are shorter than absolute times; the
// checksum turns a torn or foreign file into an error, never into pins.
// Version 1, written before the last prompt was kept, is still read (its
// prompts unknown), so that an upgrade keeps the pins.
const (
	pinsMagic   = "WPIN"
	pinsVersion = 2
	// minPinBytes is the smallest encoded pin, which bounds a count read
	// from the file before anything is allocated for it.
	minPinBytes = 8 + 1 + 1
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// EncodePins writes pins in the snapshot format.
func EncodePins(pins []selection.Pin) []byte {
	index := map[string]uint64{}
	var ids []string
	newest := int64(math.MinInt64)
	for _, p := range pins {
		if _, ok := index[p.Replica]; !ok {
			index[p.Replica] = uint64(len(ids))
			ids = append(ids, p.Replica)
		}
		newest = max(newest, p.LastUse)
	}
	if len(pins) == 0 {
		newest = 0
	}
	b := make([]byte, 0, 16+len(pins)*16)
	b = append(b, pinsMagic...)
	b = append(b, pinsVersion)
	b = binary.AppendUvarint(b, uint64(len(ids)))
	for _, id := range ids {
		b = binary.AppendUvarint(b, uint64(len(id)))
		b = append(b, id...)
	}
	b = binary.AppendVarint(b, newest)
	b = binary.AppendUvarint(b, uint64(len(pins)))
	for _, p := range pins {
		b = binary.LittleEndian.AppendUint64(b, p.Key)
		b = binary.AppendUvarint(b, index[p.Replica])
		b = binary.AppendUvarint(b, uint64(newest-p.LastUse))
		b = binary.AppendUvarint(b, uint64(max(p.Prompt, 0)))
	}
	return binary.LittleEndian.AppendUint32(b, crc32.Checksum(b, castagnoli))
}

// DecodePins reads a snapshot written by EncodePins. Anything else, torn
// or truncated, is an error.
func DecodePins(data []byte) ([]selection.Pin, error) {
	if len(data) < len(pinsMagic)+1+4 || string(data[:len(pinsMagic)]) != pinsMagic {
		return nil, errors.New("not a pin snapshot")
	}
	body, sum := data[:len(data)-4], binary.LittleEndian.Uint32(data[len(data)-4:])
	if crc32.Checksum(body, castagnoli) != sum {
		return nil, errors.New("pin snapshot: checksum mismatch (torn or corrupt)")
	}
	version := body[len(pinsMagic)]
	if version != 1 && version != pinsVersion {
		return nil, fmt.Errorf("pin snapshot: version %d, want 1 or %d", version, pinsVersion)
	}
	d := decoder{b: body[len(pinsMagic)+1:]}
	ids := make([]string, d.count(1))
	for i := range ids {
		ids[i] = string(d.bytes(int(d.count(1))))
	}
	newest := d.varint()
	pins := make([]selection.Pin, d.count(minPinBytes))
	for i := range pins {
		p := &pins[i]
		p.Key = d.uint64()
		if r := d.uvarint(); r < uint64(len(ids)) {
			p.Replica = ids[r]
		} else if d.err == nil {
			d.err = fmt.Errorf("pin %d: replica %d of %d", i, r, len(ids))
		}
		age := d.uvarint()
		if (newest < 0 || age > uint64(newest)) && d.err == nil { // before 1970: not ours
			d.err = fmt.Errorf("pin %d: last use before the epoch", i)
		}
		p.LastUse = newest - int64(age)
		if version >= 2 {
			if prompt := d.uvarint(); prompt <= math.MaxInt32 {
				p.Prompt = int(prompt)
			} else if d.err == nil {
				d.err = fmt.Errorf("pin %d: a prompt of %d tokens", i, prompt)
			}
		}
	}
	if d.err == nil && len(d.b) > 0 {
		d.err = fmt.Errorf("%d bytes after the last pin", len(d.b))
	}
	if d.err != nil {
		return nil, fmt.Errorf("pin snapshot: %w", d.err)
	}
	return pins, nil
}

// decoder reads the snapshot's fields; after the first error every read
// returns zero and consumes nothing.
type decoder struct {
	b   []byte
	err error
}

func (d *decoder) fail(what string) {
	if d.err == nil {
		d.err = fmt.Errorf("truncated or malformed %s", what)
	}
	d.b = nil
}

func (d *decoder) uvarint() uint64 {
	v, n := binary.Uvarint(d.b)
	if n <= 0 {
		d.fail("integer")
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *decoder) varint() int64 {
	v, n := binary.Varint(d.b)
	if n <= 0 {
		d.fail("integer")
		return 0
	}
	d.b = d.b[n:]
	return v
}

// count reads a number of items each at least size bytes long, refusing
// more than the rest of the data can hold.
func (d *decoder) count(size int) uint64 {
	n := d.uvarint()
	if n > uint64(len(d.b)/size) {
		d.fail("count")
		return 0
	}
	return n
}

func (d *decoder) bytes(n int) []byte {
	if n > len(d.b) {
		d.fail("string")
		return nil
	}
	v := d.b[:n]
	d.b = d.b[n:]
	return v
}

func (d *decoder) uint64() uint64 {
	if len(d.b) < 8 {
		d.fail("key")
		return 0
	}
	v := binary.LittleEndian.Uint64(d.b)
	d.b = d.b[8:]
	return v
}
