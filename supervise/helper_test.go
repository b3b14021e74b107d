//go:build linux

package supervise

import (
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// The test binary doubles as the supervised programs: with roleEnv set it
// runs one of the roles below instead of the tests.
const roleEnv = "SUPERVISE_TEST_ROLE"

func TestMain(m *testing.M) {
	switch os.Getenv(roleEnv) {
	case "child":
		childMain(os.Args[1:])
	case "grandchild":
		grandchildMain(os.Args[1:])
	case "supervisor":
		supervisorMain(os.Args[1:])
	default:
		goleak.VerifyTestMain(m)
	}
}

// childMain is a stand-in for vLLM: an HTTP server on 127.0.0.1 whose /health
// turns 200 after a delay and whose / answers with its PID.
func childMain(args []string) {
	fs := flag.NewFlagSet("child", flag.ExitOnError)
	port := fs.Int("port", 0, "port to serve on")
	readyAfter := fs.Duration("ready-after", 0, "/health answers 503 until then")
	exitCode := fs.Int("exit-code", -1, "exit at once with this code")
	ignoreTerm := fs.Bool("ignore-term", false, "report SIGTERM and carry on")
	grandchild := fs.Bool("grandchild", false, "start a grandchild that shares the output")
	grandchildIgnoresTerm := fs.Bool("grandchild-ignore-term", false, "the grandchild reports SIGTERM and carries on")
	escape := fs.Bool("escape", false, "the grandchild leaves the process group (setsid)")
	longLine := fs.Int("long-line", 0, "write one line of this many x")
	fs.Parse(args)

	dir, _ := os.Getwd()
	fmt.Printf("child pid=%d value=%s dir=%s\n", os.Getpid(), os.Getenv("SUPERVISE_TEST_VALUE"), dir)
	fmt.Fprintln(os.Stderr, "child stderr line")
	if *longLine > 0 {
		fmt.Println(strings.Repeat("x", *longLine))
	}
	if *exitCode >= 0 {
		os.Exit(*exitCode)
	}
	handleTerm("child", *ignoreTerm)
	if *grandchild {
		startGrandchild(*grandchildIgnoresTerm, *escape)
	}

	start := time.Now()
	mux := http.NewServeMux()
	mux.HandleFunc("/health", func(w http.ResponseWriter, r *http.Request) {
		if time.Since(start) < *readyAfter {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
	})
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, os.Getpid())
	})
	err := http.ListenAndServe(net.JoinHostPort("127.0.0.1", strconv.Itoa(*port)), mux)
	fmt.Fprintln(os.Stderr, "child:", err)
	os.Exit(1)
}

func startGrandchild(ignoreTerm, escape bool) {
	args := []string{}
	if ignoreTerm {
		args = append(args, "--ignore-term")
	}
	cmd := exec.Command(os.Args[0], args...)
	cmd.Env = append(os.Environ(), roleEnv+"=grandchild")
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: escape}
	if err := cmd.Start(); err != nil {
		fmt.Println("child: grandchild:", err)
		os.Exit(1)
	}
}

// grandchildMain stands for a vLLM worker: it only waits for a signal.
func grandchildMain(args []string) {
	fs := flag.NewFlagSet("grandchild", flag.ExitOnError)
	ignoreTerm := fs.Bool("ignore-term", false, "report SIGTERM and carry on")
	fs.Parse(args)
	handleTerm("grandchild", *ignoreTerm)
	// Reported only now, so that tests know SIGTERM is handled.
	fmt.Printf("grandchild pid=%d\n", os.Getpid())
	select {} // until a signal ends it
}

// handleTerm makes SIGTERM visible in the output: the process says it got it,
// then exits with status 0 or, if ignore, carries on.
func handleTerm(who string, ignore bool) {
	terms := make(chan os.Signal, 1)
	signal.Notify(terms, syscall.SIGTERM)
	go func() {
		for range terms {
			if ignore {
				fmt.Println(who, "ignores SIGTERM")
				continue
			}
			fmt.Println(who, "got SIGTERM")
			os.Exit(0)
		}
	}()
}

// supervisorMain stands for Caddy: it supervises a child and reports the
// child's PID, until it is killed.
func supervisorMain(args []string) {
	self, _ := os.Executable()
	port := args[0]
	spec := Spec{
		Command:   []string{self, "--port", port},
		Env:       map[string]string{roleEnv: "child"},
		HealthURL: "http://127.0.0.1:" + port + "/health",
	}
	sup, err := New(spec, Options{OnState: func(st State) {
		if st.State == Starting {
			fmt.Printf("supervised pid=%d\n", st.PID)
		}
	}})
	if err != nil {
		fmt.Println("supervisor:", err)
		os.Exit(1)
	}
	sup.Start()
	select {} // until a signal ends it
}
