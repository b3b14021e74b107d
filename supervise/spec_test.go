package supervise

import (
	"strings"
	"testing"
	"time"
)

func TestFlagValue(t *testing.T) {
	cases := []struct {
		args      string
		flag      string
		wantValue string
		wantFound bool
	}{
		{"serve m --port 8001", "--port", "8001", true},
		{"serve m --port=8001", "--port", "8001", true},
		{"serve m --port 8001 --port=8002", "--port", "8002", true},
		{"serve m --max_num_seqs 16", "--max-num-seqs", "16", true},
		{"serve m --max-num-seqs=16", "--max_num_seqs", "16", true},
		{"serve m --port-offset 3", "--port", "", false},
		{"serve m port 8001", "--port", "", false},
		{"serve m --port", "--port", "", true},
		{"serve m --port=", "--port", "", true},
		{"serve m", "--port", "", false},
	}
	for _, c := range cases {
		value, found := FlagValue(strings.Fields(c.args), c.flag)
		if value != c.wantValue || found != c.wantFound {
			t.Errorf("FlagValue(%q, %q) = %q, %v; want %q, %v", c.args, c.flag, value, found, c.wantValue, c.wantFound)
		}
	}
}

func TestIntFlag(t *testing.T) {
	args := strings.Fields("vllm serve Qwen/Qwen3-4B --port 8001 --max-num-seqs=thirty")
	if n, found, err := IntFlag(args, "--port"); n != 8001 || !found || err != nil {
		t.Errorf("--port: %d, %v, %v", n, found, err)
	}
	if _, found, err := IntFlag(args, "--max-num-seqs"); !found || err == nil {
		t.Errorf("--max-num-seqs=thirty: found %v, err %v; want an error", found, err)
	}
	if n, found, err := IntFlag(args, "--data-parallel-size"); n != 0 || found || err != nil {
		t.Errorf("absent flag: %d, %v, %v", n, found, err)
	}
}

func baseSpec() Spec {
	return Spec{
		Command:        []string{"vllm", "serve", "m", "--port", "8001"},
		Env:            map[string]string{"CUDA_VISIBLE_DEVICES": "0", "HF_HOME": "/srv/hf"},
		Dir:            "/srv/models",
		HealthURL:      "http://127.0.0.1:8001/health",
		StartupTimeout: 15 * time.Minute,
		StopGrace:      30 * time.Second,
	}
}

func TestSpecKey(t *testing.T) {
	a, b := baseSpec(), baseSpec()
	b.Env = map[string]string{}
	b.Env["HF_HOME"] = "/srv/hf" // filled in another order
	b.Env["CUDA_VISIBLE_DEVICES"] = "0"
	if a.Key() != b.Key() {
		t.Fatal("equal specs have different keys")
	}
	changes := map[string]func(*Spec){
		"argument":        func(s *Spec) { s.Command[4] = "8002" },
		"argument split":  func(s *Spec) { s.Command = []string{"vllm", "serve", "m", "--port 8001"} },
		"env value":       func(s *Spec) { s.Env["CUDA_VISIBLE_DEVICES"] = "1" },
		"env added":       func(s *Spec) { s.Env["X"] = "" },
		"dir":             func(s *Spec) { s.Dir = "/srv" },
		"health URL":      func(s *Spec) { s.HealthURL = "http://127.0.0.1:8002/health" },
		"startup timeout": func(s *Spec) { s.StartupTimeout = time.Minute },
		"stop grace":      func(s *Spec) { s.StopGrace = time.Second },
	}
	for name, change := range changes {
		s := baseSpec()
		change(&s)
		if s.Key() == a.Key() {
			t.Errorf("changing the %s keeps the key", name)
		}
	}
}

func TestSpecValidate(t *testing.T) {
	if err := baseSpec().Validate(); err != nil {
		t.Fatalf("valid spec: %v", err)
	}
	bad := map[string]func(*Spec){
		"no command":       func(s *Spec) { s.Command = nil },
		"empty program":    func(s *Spec) { s.Command = []string{""} },
		"env name with =":  func(s *Spec) { s.Env["A=B"] = "1" },
		"empty env name":   func(s *Spec) { s.Env[""] = "1" },
		"no health URL":    func(s *Spec) { s.HealthURL = "" },
		"health URL host":  func(s *Spec) { s.HealthURL = "127.0.0.1:8001/health" },
		"negative timeout": func(s *Spec) { s.StartupTimeout = -time.Second },
	}
	for name, change := range bad {
		s := baseSpec()
		change(&s)
		if s.Validate() == nil {
			t.Errorf("%s: no error", name)
		}
	}
}

func TestBackoffDoublesUpToMax(t *testing.T) {
	o := Options{BackoffMin: time.Second, BackoffMax: 5 * time.Second}
	if err := o.fillDefaults(); err != nil {
		t.Fatal(err)
	}
	want := []time.Duration{1, 2, 4, 5, 5}
	for i, w := range want {
		if got := o.backoff(i + 1); got != w*time.Second {
			t.Errorf("backoff(%d) = %v, want %v", i+1, got, w*time.Second)
		}
	}
	if got := o.backoff(200); got != 5*time.Second {
		t.Errorf("backoff(200) = %v", got)
	}
}

func TestOptionsRejected(t *testing.T) {
	for name, o := range map[string]Options{
		"negative interval": {HealthInterval: -1},
		"max below min":     {BackoffMin: time.Minute, BackoffMax: time.Second},
	} {
		if err := o.fillDefaults(); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
}
