package fleet

import (
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"math/rand/v2"
	"reflect"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/lmwarden/caddy-warden/selection"
)

func randomPins(rng *rand.Rand, n, replicas int) []selection.Pin {
	pins := make([]selection.Pin, n)
	for i := range pins {
		pins[i] = selection.Pin{
			Key:     rng.Uint64(),
			Replica: "10.0.0." + strconv.Itoa(rng.IntN(replicas)) + ":8000#" + strconv.Itoa(rng.IntN(4)),
			LastUse: t0.UnixNano() - rng.Int64N(int64(time.Hour)),
			Prompt:  rng.IntN(200000),
		}
	}
	return pins
}

func TestPinsRoundTrip(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for _, n := range []int{0, 1, 2, 100, 5000} {
		pins := randomPins(rng, n, 1+rng.IntN(40))
		got, err := DecodePins(EncodePins(pins))
		if err != nil {
			t.Fatalf("%d pins: %v", n, err)
		}
		if len(got) != len(pins) || (n > 0 && !reflect.DeepEqual(got, pins)) {
			t.Fatalf("%d pins came back as %d, or different", n, len(got))
		}
	}
}

// A snapshot written before the last prompt was kept (version 1) still
// gives its pins, their prompts unknown.
func TestDecodePinsReadsVersion1(t *testing.T) {
	body := append([]byte(pinsMagic), 1)
	body = binary.AppendUvarint(body, 1)
	body = binary.AppendUvarint(body, uint64(len("r0")))
	body = append(body, "r0"...)
	body = binary.AppendVarint(body, t0.UnixNano())
	body = binary.AppendUvarint(body, 2)
	for i, age := range []time.Duration{0, time.Minute} {
		body = binary.LittleEndian.AppendUint64(body, uint64(i+7))
		body = binary.AppendUvarint(body, 0)
		body = binary.AppendUvarint(body, uint64(age))
	}
	got, err := DecodePins(withSum(body))
	want := []selection.Pin{{Key: 7, Replica: "r0", LastUse: t0.UnixNano()}, {Key: 8, Replica: "r0", LastUse: t0.Add(-time.Minute).UnixNano()}}
	if err != nil || !reflect.DeepEqual(got, want) {
		t.Fatalf("version 1: %v, %v; want %v", got, err, want)
	}
}

// A torn, truncated or altered file is an error, never pins.
func TestDecodePinsRefusesDamage(t *testing.T) {
	data := EncodePins(randomPins(rand.New(rand.NewPCG(3, 4)), 50, 3))
	for n := range len(data) {
		if _, err := DecodePins(data[:n]); err == nil {
			t.Fatalf("the first %d of %d bytes decoded", n, len(data))
		}
	}
	for i := range len(data) * 8 {
		bad := append([]byte(nil), data...)
		bad[i/8] ^= 1 << (i % 8)
		if _, err := DecodePins(bad); err == nil {
			t.Fatalf("bit %d flipped decoded", i)
		}
	}
	if _, err := DecodePins(append(data, 0)); err == nil {
		t.Fatal("a byte appended decoded")
	}
}

// withSum re-seals a hand-made body, as a file someone else wrote would be.
func withSum(body []byte) []byte {
	return binary.LittleEndian.AppendUint32(body, crc32.Checksum(body, castagnoli))
}

// Files with a valid checksum but impossible contents are refused, without
// allocating for a count the file cannot hold.
func TestDecodePinsRefusesWellSealedNonsense(t *testing.T) {
	head := func(version byte) []byte { return append([]byte(pinsMagic), version) }
	valid := EncodePins([]selection.Pin{{Key: 9, Replica: "a:1", LastUse: 5}})
	body := valid[:len(valid)-4]
	cases := map[string][]byte{
		"version 3":          withSum(append(head(3), body[len(pinsMagic)+1:]...)),
		"a billion replicas": withSum(binary.AppendUvarint(head(1), 1e9)),
		"a billion pins": withSum(binary.AppendUvarint(binary.AppendVarint(
			binary.AppendUvarint(head(1), 0), 0), 1e9)),
		"replica index out of range": withSum(append(binary.AppendUvarint(binary.LittleEndian.AppendUint64(binary.AppendUvarint(binary.AppendVarint(
			binary.AppendUvarint(head(1), 0), 100), 1), 7), 0), 0)),
		// The valid body ends with the pin's age (0) and prompt (0), a byte each.
		"last use before 1970":    withSum(binary.AppendUvarint(binary.AppendUvarint(slices.Clone(body[:len(body)-2]), 6), 0)),
		"a prompt of 2^40 tokens": withSum(binary.AppendUvarint(slices.Clone(body[:len(body)-1]), 1<<40)),
	}
	for name, data := range cases {
		if pins, err := DecodePins(data); err == nil {
			t.Errorf("%s: decoded %+v", name, pins)
		}
	}
	if pins, err := DecodePins(valid); err != nil || len(pins) != 1 || pins[0] != (selection.Pin{Key: 9, Replica: "a:1", LastUse: 5}) {
		t.Fatalf("the valid file the cases derive from: %+v, %v", pins, err)
	}
}

// FuzzDecodePins: any input decodes or fails without panicking, and what
// decodes encodes back to pins equal to it.
func FuzzDecodePins(f *testing.F) {
	f.Add(EncodePins(nil))
	f.Add(EncodePins(randomPins(rand.New(rand.NewPCG(5, 6)), 3, 2)))
	f.Add([]byte(pinsMagic + "\x01garbage"))
	f.Fuzz(func(t *testing.T, data []byte) {
		pins, err := DecodePins(data)
		if err != nil {
			return
		}
		again, err := DecodePins(EncodePins(pins))
		if err != nil || len(again) != len(pins) || (len(pins) > 0 && !reflect.DeepEqual(again, pins)) {
			t.Fatalf("re-encoding %d pins: %d back, %v", len(pins), len(again), err)
		}
	})
}

// A model's pins, written and read back into a new model with the same
// config (a restart), send every conversation to the replica it had.
func TestPinsSurviveANewModel(t *testing.T) {
	spec := Spec{Replicas: servers("a:1", "b:1", "c:1"), Routing: selection.Config{Affinity: true}}
	before := New("m", time.Second, t0, nil)
	p := before.Prepare(spec)
	before.Apply(p)
	observe(before, t0, "a:1", "b:1", "c:1")
	home := map[string]string{}
	for c := range 30 {
		key := fmt.Sprint("conv-", c)
		d := p.View().Pick(selection.Request{Key: key, Now: t0})
		rep, _ := d.Replica()
		home[key] = rep.ID
		d.Release()
	}
	pins, err := DecodePins(EncodePins(before.Pins()))
	if err != nil {
		t.Fatal(err)
	}

	after := New("m", time.Second, t0.Add(time.Minute), nil)
	q := after.Prepare(spec)
	after.Apply(q)
	observe(after, t0.Add(time.Minute), "a:1", "b:1", "c:1")
	if st := q.View().Restore(pins, t0.Add(time.Minute)); st.Restored != 30 {
		t.Fatalf("restored %+v", st)
	}
	for key, want := range home {
		d := q.View().Pick(selection.Request{Key: key, Now: t0.Add(time.Minute)})
		if rep, _ := d.Replica(); rep.ID != want || d.Outcome != selection.Sticky {
			t.Errorf("%s: %v on %s, pinned to %s before", key, d.Outcome, rep.ID, want)
		}
		d.Release()
	}
}

// pinnedModel is a model whose table holds n conversations over 8 replicas,
// used within the last 30 minutes.
func pinnedModel(b *testing.B, n int) (*Model, *Plan) {
	var addrs []string
	for i := range 8 {
		addrs = append(addrs, fmt.Sprintf("10.0.0.%d:8000", i))
	}
	m := New("m", time.Second, t0, nil)
	p := m.Prepare(Spec{Replicas: servers(addrs...), Routing: selection.Config{Affinity: true, MaxSessions: 2 * n}}) // no shard full
	m.Apply(p)
	for i := range n {
		at := t0.Add(time.Duration(i) * 30 * time.Minute / time.Duration(n))
		p.View().Pick(selection.Request{Key: fmt.Sprintf("5f0c8e3a-0000-4000-8000-%012d", i), Now: at}).Release()
	}
	return m, p
}

// The periodic write's CPU part at 100,000 conversations: copy the table
// and encode it.
func BenchmarkSnapshot100k(b *testing.B) {
	m, _ := pinnedModel(b, 100_000)
	if n := len(m.Pins()); n != 100_000 {
		b.Fatalf("%d conversations pinned", n)
	}
	var size int
	for b.Loop() {
		size = len(EncodePins(m.Pins()))
	}
	b.ReportMetric(float64(size), "bytes")
}

// A start's restore at 100,000 conversations: decode and fill an empty table.
func BenchmarkRestore100k(b *testing.B) {
	m, p := pinnedModel(b, 100_000)
	data := EncodePins(m.Pins())
	spec := Spec{Replicas: p.View().Replicas(), Routing: selection.Config{Affinity: true, MaxSessions: 200_000}}
	now := t0.Add(30 * time.Minute)
	for b.Loop() {
		b.StopTimer()
		fresh := New("m", time.Second, now, nil)
		q := fresh.Prepare(spec)
		fresh.Apply(q)
		b.StartTimer()
		pins, err := DecodePins(data)
		if err != nil {
			b.Fatal(err)
		}
		if st := q.View().Restore(pins, now); st.Restored != 100_000 {
			b.Fatalf("%+v", st)
		}
	}
}
