package supervise

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// Defaults for the zero values of Spec's durations, sized for vLLM: loading
// and compiling a model can take many minutes, and freeing GPU memory on exit
// takes a few seconds.
const (
	DefaultStartupTimeout = 15 * time.Minute
	DefaultStopGrace      = 30 * time.Second
)

// Spec is what to run and how to judge and end it. Two specs with the same
// Key describe the same process, so a config reload that keeps the key can
// keep the running process.
type Spec struct {
	// Command is the program and its arguments; a program name without a
	// slash is looked up in PATH.
	Command []string `json:"command"`
	// Env is added to the environment Caddy itself runs with.
	Env map[string]string `json:"env,omitempty"`
	// Dir is the working directory; empty means Caddy's own.
	Dir string `json:"dir,omitempty"`
	// HealthURL is polled until it answers 200, e.g. http://127.0.0.1:8001/health.
	HealthURL string `json:"health_url"`
	// StartupTimeout bounds the time from launch to the first 200 from
	// HealthURL; after it the process is stopped and restarted. Zero means
	// DefaultStartupTimeout.
	StartupTimeout time.Duration `json:"startup_timeout,omitempty"`
	// StopGrace is how long the process group has between SIGTERM and
	// SIGKILL. Zero means DefaultStopGrace.
	StopGrace time.Duration `json:"stop_grace,omitempty"`
}

// Key identifies the spec: equal specs have equal keys, whatever the order
// Env was filled in, and any change to a field changes it.
func (s Spec) Key() string {
	// encoding/json writes map keys sorted, so the encoding is canonical; it
	// cannot fail on strings, a string map and durations.
	b, _ := json.Marshal(s)
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

// Validate reports what makes the spec unusable.
func (s Spec) Validate() error {
	if len(s.Command) == 0 || s.Command[0] == "" {
		return errors.New("process: no command")
	}
	for k, v := range s.Env {
		if k == "" || strings.ContainsAny(k, "=\x00") || strings.ContainsRune(v, 0) {
			return fmt.Errorf("process: bad environment variable %q", k)
		}
	}
	u, err := url.Parse(s.HealthURL)
	if err != nil {
		return fmt.Errorf("process: health URL: %v", err)
	}
	if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return fmt.Errorf("process: health URL %q: want http://host:port/path", s.HealthURL)
	}
	if s.StartupTimeout < 0 || s.StopGrace < 0 {
		return errors.New("process: startup_timeout and stop_grace must not be negative")
	}
	return nil
}

func (s Spec) startupTimeout() time.Duration {
	if s.StartupTimeout == 0 {
		return DefaultStartupTimeout
	}
	return s.StartupTimeout
}

func (s Spec) stopGrace() time.Duration {
	if s.StopGrace == 0 {
		return DefaultStopGrace
	}
	return s.StopGrace
}

// environ lists Env as KEY=VALUE entries.
func (s Spec) environ() []string {
	env := make([]string, 0, len(s.Env))
	for k, v := range s.Env {
		env = append(env, k+"="+v)
	}
	return env
}

// FlagValue finds a long option such as "--max-num-seqs" in a command line,
// written "--max-num-seqs 32" or "--max-num-seqs=32", and returns the value of
// its last occurrence, as argparse does. Like vLLM's parser it treats '_' and
// '-' in option names alike, so "--max_num_seqs" matches too. found is true
// when the option is present, even with no value after it (value is then "").
func FlagValue(args []string, flag string) (value string, found bool) {
	want := normalizeOption(flag)
	for i, arg := range args {
		if !strings.HasPrefix(arg, "--") {
			continue
		}
		name, inline, hasInline := strings.Cut(arg, "=")
		if normalizeOption(name) != want {
			continue
		}
		switch {
		case hasInline:
			value = inline
		case i+1 < len(args):
			value = args[i+1]
		default:
			value = ""
		}
		found = true
	}
	return value, found
}

// IntFlag is FlagValue for an integer option such as "--port".
func IntFlag(args []string, flag string) (n int, found bool, err error) {
	v, found := FlagValue(args, flag)
	if !found {
		return 0, false, nil
	}
	n, err = strconv.Atoi(v)
	if err != nil {
		return 0, true, fmt.Errorf("%s: want an integer, got %q", flag, v)
	}
	return n, true, nil
}

// normalizeOption maps "--max_num_seqs" and "--max-num-seqs" to one form.
func normalizeOption(name string) string {
	return strings.ReplaceAll(name, "_", "-")
}
