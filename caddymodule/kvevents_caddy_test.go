package caddymodule_test

import (
	"context"
	"encoding/binary"
	"fmt"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/lmwarden/caddy-warden/internal/testnet"
	"github.com/lmwarden/caddy-warden/internal/testrun"
	"github.com/lmwarden/caddy-warden/panel"
)

// kvPublisher is a vLLM KV cache events publisher on loopback.
type kvPublisher struct {
	endpoint string
	sock     zmq4.Socket
	seq      uint64
}

func startKVPublisher(t *testing.T) *kvPublisher {
	t.Helper()
	p := &kvPublisher{endpoint: fmt.Sprintf("tcp://127.0.0.1:%d", testnet.Port(t)), sock: zmq4.NewPub(context.Background())}
	if err := p.sock.Listen(p.endpoint); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.sock.Close() })
	return p
}

// publish sends one batch storing a block, as vLLM frames it.
func (p *kvPublisher) publish(t *testing.T, block uint64) {
	t.Helper()
	payload, err := msgpack.Marshal([]any{float64(time.Now().Unix()), []any{map[string]any{
		"type": "BlockStored", "block_hashes": []uint64{block}, "parent_block_hash": nil,
		"token_ids": []uint32{1}, "block_size": 16, "medium": "GPU"}}, 0})
	if err != nil {
		t.Fatal(err)
	}
	if err := p.sock.Send(zmq4.NewMsgFrom([]byte("kv-events"), binary.BigEndian.AppendUint64(nil, p.seq), payload)); err != nil {
		t.Fatal(err)
	}
	p.seq++
}

// kvEventsOf is replica addr's kv_events in the admin JSON.
func kvEventsOf(t *testing.T, f *fleet, addr string) *panel.KVEventsStatus {
	t.Helper()
	for _, r := range f.status(t).Replicas {
		if r.Address == addr {
			return r.KVEvents
		}
	}
	t.Fatalf("no replica %s", addr)
	return nil
}

// Caddy follows the KV cache events of the replicas whose block says where
// they publish them; a reload that keeps the endpoint keeps the feed and
// what it learnt, one Caddy rejects changes nothing, and one that drops
// the endpoint stops following it.
func TestKVEventsFollowedAcrossReloads(t *testing.T) {
	a, b := startFakeVLLM(t, "a", 1), startFakeVLLM(t, "b", 1)
	pub, other := startKVPublisher(t), startKVPublisher(t)
	f := startFleetWith(t, caddySetup{
		modelBlock:     fmt.Sprintf("replica %s {\n\t\t\t\tkv_events %s kv-events\n\t\t\t}\n\t\t\treplica %s", a.addr, pub.endpoint, b.addr),
		siteDirectives: "warden_stop_reason", // the events need the replies' usage
	}, a, b)
	// PUB drops batches until the subscription arrives.
	testrun.Eventually(t, 10*time.Second, "a batch followed", func() bool {
		pub.publish(t, pub.seq+1)
		ev := kvEventsOf(t, f, a.addr)
		return ev != nil && ev.Batches > 0
	})
	followed := kvEventsOf(t, f, a.addr)
	if followed.Endpoint != pub.endpoint || followed.Garbage != 0 || followed.Blocks == 0 {
		t.Fatalf("replica a's events: %+v", followed)
	}
	if ev := kvEventsOf(t, f, b.addr); ev != nil {
		t.Fatalf("replica b publishes nothing, yet %+v", ev)
	}

	var running map[string]any
	if err := f.caddy.Do(http.MethodGet, "/config/", nil, &running); err != nil {
		t.Fatal(err)
	}
	withEvents := func(endpoint any, threshold int) map[string]any {
		cfg := clone(t, running)
		m := dig(cfg, "apps", "warden", "models", "m")
		m["spill_threshold"] = threshold
		replica := m["replicas"].([]any)[0].(map[string]any)
		if endpoint == nil {
			delete(replica, "kv_events")
		} else {
			replica["kv_events"] = map[string]any{"endpoint": endpoint, "topic": "kv-events"}
		}
		return cfg
	}
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	for _, breakIt := range []func(cfg map[string]any){
		func(cfg map[string]any) { // refused in warden's Provision
			dig(cfg, "apps", "warden", "models")["n"] = map[string]any{"replicas": []any{map[string]any{"address": "127.0.0.1:1"}}, "max_num_seqs": -1}
		},
		func(cfg map[string]any) { // refused in the http app's Start, maybe after warden's
			dig(cfg, "apps", "http", "servers")["taken"] = map[string]any{"listen": []any{taken.Addr().String()}}
		},
	} {
		for range 4 { // apps start in map order: meet both
			bad := withEvents(other.endpoint, 7)
			breakIt(bad)
			if err := f.caddy.Do(http.MethodPost, "/load", bad, nil); err == nil {
				t.Fatal("Caddy accepted the broken config")
			}
		}
		if ev := kvEventsOf(t, f, a.addr); ev == nil || ev.Endpoint != pub.endpoint || ev.Batches < followed.Batches {
			t.Fatalf("after a rejected load: %+v, want the feed of %s kept (%d batches)", ev, pub.endpoint, followed.Batches)
		}
	}
	if err := f.caddy.Do(http.MethodPost, "/load", withEvents(pub.endpoint, 7), nil); err != nil {
		t.Fatal(err)
	}
	if ev := kvEventsOf(t, f, a.addr); ev == nil || ev.Endpoint != pub.endpoint || ev.Batches < followed.Batches || ev.Blocks < followed.Blocks {
		t.Fatalf("after a load keeping the endpoint: %+v, want the feed kept (%+v)", ev, followed)
	}
	if err := f.caddy.Do(http.MethodPost, "/load", withEvents(nil, 7), nil); err != nil {
		t.Fatal(err)
	}
	if ev := kvEventsOf(t, f, a.addr); ev != nil {
		t.Fatalf("after a load without kv_events: %+v", ev)
	}
	if err := f.caddy.Do(http.MethodPost, "/load", withEvents("tcp://*:5557", 7), nil); err == nil {
		t.Fatal("Caddy accepted kv_events tcp://*:5557")
	}
}
