// Package caddyproc builds Caddy with the warden plugin from cmd/caddy and
// runs it as a child process, with a small client for its admin API. The
// integration tests, the bench module's tests and wardenbench use it to
// exercise the real binary.
package caddyproc

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Module is the path of the repository's root module, the plugin.
const Module = "github.com/lmwarden/caddy-warden"

// Build compiles the command in directory pkg of the repository (e.g.
// "./cmd/caddy", or "./bench/cmd/vllmsim" of the nested bench module) into
// out. It works from any directory of either module: it finds the root
// module from the caller's go.mod and builds pkg in the module that holds it,
// so Caddy always comes from the root module's go.mod.
func Build(ctx context.Context, pkg, out string) error {
	root, err := RootDir(ctx)
	if err != nil {
		return err
	}
	if out, err = filepath.Abs(out); err != nil {
		return err
	}
	cmd := exec.CommandContext(ctx, "go", "build", "-o", out, ".")
	cmd.Dir = filepath.Join(root, filepath.FromSlash(pkg))
	if msg, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("building %s: %v\n%s", pkg, err, msg)
	}
	return nil
}

// RootDir is the directory of the root module: the caller's module, or the
// first directory above it whose go.mod declares Module.
func RootDir(ctx context.Context) (string, error) {
	out, err := exec.CommandContext(ctx, "go", "env", "GOMOD").Output()
	if err != nil {
		return "", fmt.Errorf("finding the module: %v", err)
	}
	gomod := strings.TrimSpace(string(out))
	if gomod == "" || gomod == os.DevNull {
		return "", errors.New("not inside a caddy-warden module")
	}
	for dir := filepath.Dir(gomod); ; {
		if modulePath(filepath.Join(dir, "go.mod")) == Module {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", fmt.Errorf("no go.mod declaring %s at or above %s", Module, filepath.Dir(gomod))
		}
		dir = parent
	}
}

// modulePath reads the module directive of a go.mod file ("" if none).
func modulePath(gomod string) string {
	data, err := os.ReadFile(gomod)
	if err != nil {
		return ""
	}
	for line := range strings.Lines(string(data)) {
		line, _, _ = strings.Cut(line, "//")
		if rest, ok := strings.CutPrefix(strings.TrimSpace(line), "module"); ok && rest != "" && (rest[0] == ' ' || rest[0] == '\t') {
			path := strings.TrimSpace(rest)
			if p, err := strconv.Unquote(path); err == nil {
				path = p
			}
			return path
		}
	}
	return ""
}

// FreeAddr returns a loopback address with a port that was free a moment ago.
func FreeAddr() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer ln.Close()
	return ln.Addr().String(), nil
}

// Process is a running Caddy.
type Process struct {
	// Admin is the admin API's address.
	Admin string

	cmd  *exec.Cmd
	done chan struct{}
	err  error // of the exit, once done is closed
}

// Start runs bin with the config text, a Caddyfile or a JSON config (as
// Adapt writes), which must set the admin address to admin, and waits
// until the admin API answers. Caddy's log goes to logw (nil discards it).
// Its data directory is temporary, removed when it exits.
func Start(bin, config, admin string, logw io.Writer) (*Process, error) {
	return StartIn("", bin, config, admin, logw)
}

// Adapt returns the JSON config `caddy adapt` makes of the Caddyfile, with
// fields of warden models set: modelFields[model][name] = value, a dotted
// name reaching into an object ("load_control.linger"). These are the
// model's JSON fields a Caddyfile does not offer (docs/configuration.md).
func Adapt(bin, caddyfile string, modelFields map[string]map[string]any) (string, error) {
	dir, err := os.MkdirTemp("", "warden-adapt-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(dir)
	path := filepath.Join(dir, "Caddyfile")
	if err := os.WriteFile(path, []byte(caddyfile), 0o600); err != nil {
		return "", err
	}
	var stderr bytes.Buffer
	cmd := exec.Command(bin, "adapt", "--config", path, "--adapter", "caddyfile")
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("caddy adapt: %v\n%s", err, stderr.Bytes())
	}
	var cfg map[string]any
	if err := json.Unmarshal(out, &cfg); err != nil {
		return "", fmt.Errorf("caddy adapt wrote no JSON object: %v", err)
	}
	for model, fields := range modelFields {
		m, ok := lookup(cfg, "apps", "warden", "models", model)
		if !ok {
			return "", fmt.Errorf("the Caddyfile declares no warden model %q", model)
		}
		for name, value := range fields {
			path := strings.Split(name, ".")
			parent := m
			for _, key := range path[:len(path)-1] {
				child, ok := parent[key].(map[string]any)
				if !ok {
					child = map[string]any{}
					parent[key] = child
				}
				parent = child
			}
			parent[path[len(path)-1]] = value
		}
	}
	data, err := json.Marshal(cfg)
	return string(data), err
}

// lookup follows keys through nested JSON objects.
func lookup(v map[string]any, keys ...string) (map[string]any, bool) {
	for _, k := range keys {
		next, ok := v[k].(map[string]any)
		if !ok {
			return nil, false
		}
		v = next
	}
	return v, true
}

// isJSON tells a JSON config from a Caddyfile, whose global block also
// opens with a brace.
func isJSON(config string) bool {
	return strings.HasPrefix(strings.TrimSpace(config), "{") && json.Valid([]byte(config))
}

// StartIn is Start with Caddy's data directory (its storage: certificates,
// locks, warden's pin snapshots) under dataDir, which is kept when Caddy
// exits, so that the next Caddy started on it finds what this one left.
// An empty dataDir is Start's temporary one.
func StartIn(dataDir, bin, config, admin string, logw io.Writer) (*Process, error) {
	dir, err := os.MkdirTemp("", "warden-caddy-")
	if err != nil {
		return nil, err
	}
	name, adapter := "Caddyfile", []string{"--adapter", "caddyfile"}
	if isJSON(config) {
		name, adapter = "caddy.json", nil
	}
	path := filepath.Join(dir, name)
	if err := os.WriteFile(path, []byte(config), 0o600); err != nil {
		return nil, err
	}
	if logw == nil {
		logw = io.Discard
	}
	cmd := exec.Command(bin, append([]string{"run", "--config", path}, adapter...)...)
	cmd.Stdout, cmd.Stderr = logw, logw
	if dataDir == "" {
		dataDir = dir
	}
	cmd.Env = append(os.Environ(), "XDG_DATA_HOME="+dataDir, "XDG_CONFIG_HOME="+dir, "HOME="+dir)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	p := &Process{Admin: admin, cmd: cmd, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		os.RemoveAll(dir)
		close(p.done)
	}()
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case <-p.done:
			return nil, fmt.Errorf("caddy exited at start: %v", p.err)
		case <-time.After(50 * time.Millisecond):
		}
		if resp, err := http.Get("http://" + admin + "/config/"); err == nil {
			resp.Body.Close()
			return p, nil
		}
	}
	p.Stop()
	return nil, errors.New("caddy's admin API did not answer within 30s")
}

// Pid is the Caddy process ID.
func (p *Process) Pid() int { return p.cmd.Process.Pid }

// Stop asks Caddy to exit and kills it after 10 s.
func (p *Process) Stop() error {
	_ = p.cmd.Process.Signal(syscall.SIGINT)
	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
		_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
		<-p.done
	}
	return nil
}

// Kill ends Caddy with SIGKILL, as a crash would: no shutdown work (no
// final pin snapshot). It waits for the exit.
func (p *Process) Kill() {
	_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
	<-p.done
}

// adminClient opens a connection per request: every config load replaces
// Caddy's admin server, which closes the old one's idle connections, and a
// request written on one as it closed failed with a reset.
var adminClient = &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}

// ConnectionBroke reports whether a request failed because its connection
// was reset or closed before any response, as one a replaced Caddy
// listener accepted is: sending it again reaches the new one.
func ConnectionBroke(err error) bool {
	return errors.Is(err, syscall.ECONNRESET) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF)
}

// adminTries bounds how many times Do sends a read or a load whose connection
// broke (ConnectionBroke).
const adminTries = 5

// Do sends a request to the admin API and decodes a JSON answer into out
// (when not nil). A status other than 200 is an error with the body.
func (p *Process) Do(method, path string, body any, out any, header ...string) error {
	var rd io.Reader
	switch b := body.(type) {
	case nil:
	case []byte:
		rd = bytes.NewReader(b)
	default:
		data, err := json.Marshal(b)
		if err != nil {
			return err
		}
		rd = bytes.NewReader(data)
	}
	req, err := http.NewRequest(method, "http://"+p.Admin+path, rd)
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := adminClient.Do(req)
	// A config load starts a new admin server, then stops the old one: a
	// connection the old listener accepted meanwhile is reset or closed. A
	// read, or a load (loading a config again ends in the same state), is
	// sent again; the new server answers it.
	resend := method == http.MethodGet || path == "/load"
	for try := 1; err != nil && resend && ConnectionBroke(err) && try < adminTries; try++ {
		if req.GetBody != nil {
			if req.Body, err = req.GetBody(); err != nil {
				return err
			}
		}
		resp, err = adminClient.Do(req)
	}
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s %s: %s: %s", method, path, resp.Status, bytes.TrimSpace(data))
	}
	if out != nil {
		return json.Unmarshal(data, out)
	}
	return nil
}

// Reload posts the running config back to /load, forcing a full reload
// even though it is unchanged.
func (p *Process) Reload() error {
	var cfg json.RawMessage
	if err := p.Do(http.MethodGet, "/config/", nil, &cfg); err != nil {
		return err
	}
	return p.Do(http.MethodPost, "/load", []byte(cfg), nil, "Cache-Control", "must-revalidate")
}
