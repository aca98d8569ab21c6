package runner_test

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/corral-sandbox/corral/confine"
	"github.com/corral-sandbox/corral/runner"
	"github.com/corral-sandbox/corral/worker"
)

// The test binary plays three roles, chosen by roleEnv:
//   - "runner": `corral runner` itself (runnerMain parses the same flags);
//   - "parent": a parent corral that starts a runner with runner.Start,
//     prints the runner's pid and waits to be killed (parentMain);
//   - unset: the tests.
const (
	roleEnv   = "CORRAL_RUNNER_TEST_ROLE"
	parentEnv = "CORRAL_RUNNER_TEST_PARENT"
)

func TestMain(m *testing.M) {
	confine.MaybeRun()
	worker.MaybeRunInit()
	switch os.Getenv(roleEnv) {
	case "runner":
		os.Exit(runnerMain(os.Args[1:]))
	case "parent":
		os.Exit(parentMain())
	}
	goleak.VerifyTestMain(m, goleak.IgnoreTopFunction("github.com/corral-sandbox/corral/internal/pdeath.spawner"))
}

// runnerMain is `corral runner --state DIR [--lease-ttl D] [--worker-fd N]`
// without cobra.
func runnerMain(args []string) int {
	if len(args) == 0 || args[0] != "runner" {
		fmt.Fprintf(os.Stderr, "runner role: unexpected arguments %q\n", args)
		return 2
	}
	fs := flag.NewFlagSet("runner", flag.ContinueOnError)
	state := fs.String("state", "", "")
	ttl := fs.Duration("lease-ttl", 0, "")
	fd := fs.Int("worker-fd", 0, "")
	if err := fs.Parse(args[1:]); err != nil {
		return 2
	}
	return runner.Main(context.Background(), runner.Options{
		StorePath: filepath.Join(*state, "corral.db"),
		LeaseTTL:  *ttl,
		WorkerFD:  *fd,
		Logger:    slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})),
	})
}

// parentConfig is what the parent role is told, in parentEnv.
type parentConfig struct {
	WorkerSocket string
	StateDir     string
	LeaseTTL     time.Duration
	Job          runner.Job
}

// parentMain starts a runner, prints "pid N" and sleeps until killed.
func parentMain() int {
	var cfg parentConfig
	if err := json.Unmarshal([]byte(os.Getenv(parentEnv)), &cfg); err != nil {
		fmt.Fprintln(os.Stderr, "parent role:", err)
		return 2
	}
	p, err := runner.Start(context.Background(), runner.StartOptions{
		StateDir:     cfg.StateDir,
		WorkerSocket: cfg.WorkerSocket,
		Job:          cfg.Job,
		LeaseTTL:     cfg.LeaseTTL,
		Env:          runnerEnv(),
		Stderr:       os.Stderr,
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, "parent role:", err)
		return 1
	}
	fmt.Printf("pid %d\n", p.Pid())
	time.Sleep(time.Hour)
	return 0
}

// runnerEnv is the environment of a runner started by the tests: this
// process's, minus the parent's configuration (which names the worker's
// socket), plus the runner role.
func runnerEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, parentEnv+"=") && !strings.HasPrefix(kv, roleEnv+"=") {
			env = append(env, kv)
		}
	}
	return append(env, roleEnv+"=runner")
}
