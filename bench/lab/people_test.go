package lab

import (
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/lmwarden/caddy-warden/selection"
)

func TestParsePeople(t *testing.T) {
	if got, err := ParsePeople("two"); err != nil || !slices.Equal(got, TwoPeople) {
		t.Errorf("two: %v, %v", got, err)
	}
	got, err := ParsePeople("a:3:0s, b:1:1m:2.5")
	if want := []Person{{"a", 3, 0, 0}, {"b", 1, time.Minute, 2.5}}; err != nil || !slices.Equal(got, want) {
		t.Errorf("a:3:0s,b:1:1m:2.5: %v, %v; want %v", got, err, want)
	}
	for _, bad := range []string{"a:3", "a:0:1s", "a:x:1s", "a:1:-1s", "a:1:soon", ":1:1s", "a:1:1s,a:2:1s", "a:1:1s:0", "a:1:1s:x", "a:1:1s:1:1"} {
		if _, err := ParsePeople(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

// Each person's turns reach load control in its own flow, each has its
// own row, and a person's sessions are the same alone and beside others.
func TestPeopleShareTheFleetInTheirOwnFlows(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Duration, cfg.Warmup, cfg.People = time.Minute, 20*time.Second, TwoPeople
	policy, out := runFresh(t, cfg, PolicyAdmission, Sessions(TwoPeople), 1)
	flows := policy.(*admissionPolicy).view.Status().Flows.Counted
	ids := []uint64{}
	for _, f := range flows {
		if f.Admitted == 0 {
			t.Errorf("flow %x admitted no turn", f.ID)
		}
		ids = append(ids, f.ID)
	}
	slices.Sort(ids)
	want := []uint64{selection.HashKey("farm"), selection.HashKey("person")}
	slices.Sort(want)
	if !slices.Equal(ids, want) {
		t.Errorf("flows %x, want farm's and person's %x", ids, want)
	}
	rows := out.rows(PolicyAdmission, cfg.People)[0]
	if len(rows) != 2 || rows[0].Person != "farm" || rows[0].Sessions != 20 || rows[1].Person != "person" ||
		rows[1].Sessions != 2 || rows[1].ThinkTimeS != 30 || rows[0].Requests == 0 || rows[1].Requests == 0 {
		t.Fatalf("rows %+v", rows)
	}
	if rows[0].Requests+rows[1].Requests != out.models[0].summary.Requests {
		t.Errorf("the people's rows count %d and %d requests, the run %d", rows[0].Requests, rows[1].Requests, out.models[0].summary.Requests)
	}

	cfg.OneFlow = true
	policy, _ = runFresh(t, cfg, PolicyAdmission, Sessions(TwoPeople), 1)
	if flows := policy.(*admissionPolicy).view.Status().Flows.Counted; len(flows) != 1 || flows[0].ID != 0 {
		t.Errorf("one flow: %+v", flows)
	}

	alone := cfg
	alone.People = TwoPeople[1:]
	_, aloneOut := runFresh(t, alone, PolicyAdmission, Sessions(alone.People), 1)
	if first, firstAlone := firstSession(out, 1), firstSession(aloneOut, 0); first == "" || first != firstAlone {
		t.Errorf("person's first session %q beside the farm, %q alone", first, firstAlone)
	}
}

// firstSession is the ID of the first session person started in the run.
func firstSession(out *outcome, person int) string {
	s := out.sim
	first := ""
	for _, r := range s.results {
		if s.personOf[r.SessionID] == person && r.SessionIndex == 0 {
			first = r.SessionID
		}
	}
	return first
}

// arrivalsPolicy is the warden policy that records what it is told of each
// request's person.
type arrivalsPolicy struct {
	*wardenPolicy
	flows map[string]float64 // each flow's weight, as sent
}

func (p *arrivalsPolicy) Pick(a Arrival) (int, func()) {
	p.flows[a.Flow] = a.FlowWeight
	return p.wardenPolicy.Pick(a)
}

// Each person's requests carry its name and weight, or, in one flow, none.
func TestArrivalsCarryTheirPersonsFlowAndWeight(t *testing.T) {
	for _, oneFlow := range []bool{false, true} {
		cfg := DefaultConfig()
		cfg.Duration, cfg.Warmup, cfg.OneFlow = 30*time.Second, 0, oneFlow
		cfg.People = []Person{{"farm", 3, 0, 0}, {"person", 1, time.Second, 4}}
		f, err := newFleet(cfg)
		if err != nil {
			t.Fatal(err)
		}
		env := newEnv(cfg, f, 1)
		w, err := newWardenPolicy(true)(env)
		if err != nil {
			t.Fatal(err)
		}
		p := &arrivalsPolicy{wardenPolicy: w.(*wardenPolicy), flows: map[string]float64{}}
		if _, err := simulate(env, p, Sessions(cfg.People), 1); err != nil {
			t.Fatal(err)
		}
		want := map[string]float64{"farm": 0, "person": 4}
		if oneFlow {
			want = map[string]float64{"": 0}
		}
		if !maps.Equal(p.flows, want) {
			t.Errorf("one flow %v: flows and weights %v, want %v", oneFlow, p.flows, want)
		}
	}
}

func TestSweepWithPeopleNeedsTheirSessionsAsTheLevel(t *testing.T) {
	cfg := DefaultConfig()
	cfg.People = TwoPeople
	_, err := Sweep(cfg, Plan{Policies: []string{PolicyAdmission}, Levels: []int{8}, Seeds: []int64{1}}, 1, nil)
	if err == nil || !strings.Contains(err.Error(), "people") {
		t.Fatalf("a level of 8 for 22 people's sessions: %v", err)
	}
}

// A measured window that opens while an engine's step carries a refresh
// (a request no client waits for) opens as any other: seed 1's 10 s person
// has one in flight at 30.127 s.
func TestWindowOpensDuringARefresh(t *testing.T) {
	cfg := DefaultConfig()
	cfg.People, _ = ParsePeople("farm:20:0s,person:2:10s")
	cfg.Warmup, cfg.Duration = 30127*time.Millisecond, 10*time.Second
	env, policy := freshPolicy(t, cfg, PolicyAdmission, 1)
	if _, err := simulate(env, policy, Sessions(cfg.People), 1); err != nil {
		t.Fatal(err)
	}
}
