package main

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/corral-sandbox/corral/worker"
)

// TestParallelRunsShareWorker: twenty `corral run --project` processes at
// once on one state directory, over two projects, all succeed (the first
// starts the state directory's shared worker, the others use it), and once
// they are done the idle worker exits, its machines with it.
func TestParallelRunsShareWorker(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("managed projects need root (CI runs as root)")
	}
	state := t.TempDir()
	var projects [2]string
	for i := range projects {
		projects[i] = filepath.Join(t.TempDir(), "proj"+strconv.Itoa(i))
		if err := os.Mkdir(projects[i], 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Chown(projects[i], 4242, 4242); err != nil {
			t.Fatal(err)
		}
	}
	const runs = 20
	var wg sync.WaitGroup
	errs := make([]error, runs)
	for i := range runs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cmd := exec.Command(os.Args[0], "run", "--state", state, "--worker-idle", "1s",
				"--project", projects[i%2], "--", "sh", "-c", fmt.Sprintf("echo %d > f%d && cat f%d", i, i, i))
			cmd.Env = append(os.Environ(), "CORRAL_TEST_AS_MAIN=1")
			var out, stderr bytes.Buffer
			cmd.Stdout, cmd.Stderr = &out, &stderr
			err := cmd.Run()
			if err != nil || out.String() != fmt.Sprintf("%d\n", i) {
				errs[i] = fmt.Errorf("run %d: %v, stdout %q, stderr %q", i, err, out.String(), stderr.String())
			}
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	for i := range runs {
		if b, err := os.ReadFile(filepath.Join(projects[i%2], "f"+strconv.Itoa(i))); err != nil || string(b) != fmt.Sprintf("%d\n", i) {
			t.Errorf("run %d's file: %q %v", i, b, err)
		}
	}
	pid := sharedWorkerPid(t, state)
	awaitExit(t, pid, 30*time.Second)
	ws, err := filepath.EvalSymlinks(filepath.Join(state, "worker"))
	if err != nil {
		t.Fatal(err)
	}
	parent := worker.DefaultCgroupParent(ws)
	for depth := "*"; len(depth) < 12; depth += "/*" {
		if m, _ := filepath.Glob(filepath.Join("/sys/fs/cgroup", depth, parent)); len(m) > 0 {
			t.Errorf("the idle worker left its machines' cgroups: %v", m)
		}
	}
	if _, err := os.Stat(filepath.Join(state, sharedSocket)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the idle worker left its socket: %v", err)
	}
}

// sharedWorkerPid is the pid of the shared worker a run started for state.
func sharedWorkerPid(t *testing.T, state string) int {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(state, sharedPid))
	if err != nil {
		t.Fatalf("no shared worker: %v", err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		t.Fatal(err)
	}
	return pid
}

// awaitExit waits until process pid is gone (reaped, or a zombie of a
// parent that has not reaped it yet).
func awaitExit(t *testing.T, pid int, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		st, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil || isZombie(st) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("process %d still runs after %v", pid, within)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func isZombie(stat []byte) bool {
	i := bytes.LastIndexByte(stat, ')')
	return i >= 0 && i+2 < len(stat) && stat[i+2] == 'Z'
}

// stopSharedWorker ends the shared worker that in-process runs on state
// started, if it still runs (tests' runs keep the default idle time).
func stopSharedWorker(t *testing.T, state string) {
	b, err := os.ReadFile(filepath.Join(state, sharedPid))
	if err != nil {
		return
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		return
	}
	// Still that worker, not a process that got its pid since.
	cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil || !bytes.Contains(cmdline, []byte(filepath.Join(state, sharedSocket))) {
		return
	}
	if syscall.Kill(pid, syscall.SIGTERM) == nil {
		awaitExit(t, pid, 40*time.Second)
	}
}
