package caddymodule

import (
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/lmwarden/caddy-warden/metricsfeed"
	"github.com/lmwarden/caddy-warden/selection"
)

// The admin JSON shows load control's settings with the defaults filled
// in, and each replica's KV capacity: the configured one, else its metrics'.
func TestLoadControlStatus(t *testing.T) {
	for _, c := range []struct {
		name       string
		lc         *LoadControlConfig
		want       LoadControlStatus
		capacity   int
		noMetrics  bool
		noCapacity bool
	}{
		{name: "lc-off", want: LoadControlStatus{
			Fill: selection.DefaultAdmissionFill, LingerSeconds: selection.DefaultAdmissionLinger.Seconds(),
			MaxWaitSeconds: selection.DefaultAdmissionWait.Seconds(), MaxQueue: selection.DefaultAdmissionQueue,
		}, capacity: 40000},
		{name: "lc-set", lc: &LoadControlConfig{Enabled: true, Fill: 0.8, Linger: caddy.Duration(3 * time.Second),
			MaxWait: caddy.Duration(time.Minute), MaxQueue: 8, CapacityTokens: 1000},
			want:     LoadControlStatus{Enabled: true, Fill: 0.8, LingerSeconds: 3, MaxWaitSeconds: 60, MaxQueue: 8, CapacityTokens: 1000},
			capacity: 1000},
		{name: "lc-unknown", lc: &LoadControlConfig{Enabled: true}, noMetrics: true, noCapacity: true, want: LoadControlStatus{
			Enabled: true, Fill: selection.DefaultAdmissionFill, LingerSeconds: selection.DefaultAdmissionLinger.Seconds(),
			MaxWaitSeconds: selection.DefaultAdmissionWait.Seconds(), MaxQueue: selection.DefaultAdmissionQueue,
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			l := liveLoad(t, c.name, &ModelConfig{Replicas: []ReplicaConfig{{Address: addrA}}, LoadControl: c.lc})
			if !c.noMetrics {
				l.model.fleet.ObserveScrape(addrA, time.Now(), metricsfeed.Scrape{Engines: []metricsfeed.EngineStats{{
					BlockSize: 16, NumGPUBlocks: 2500,
					Present: metricsfeed.LoadFields | metricsfeed.FieldBlockSize | metricsfeed.FieldNumGPUBlocks,
				}}}, nil)
			}
			st := l.status(time.Now())
			if st.LoadControl != c.want {
				t.Errorf("load_control %+v, want %+v", st.LoadControl, c.want)
			}
			got := st.Replicas[0].KVCapacityTokens
			switch {
			case c.noCapacity && got != nil:
				t.Errorf("kv_capacity_tokens %d without metrics or capacity_tokens, want null", *got)
			case !c.noCapacity && (got == nil || *got != c.capacity):
				t.Errorf("kv_capacity_tokens %v, want %d", got, c.capacity)
			}
		})
	}
}
