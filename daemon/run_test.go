package daemon

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/corral-sandbox/corral/client"
	"github.com/corral-sandbox/corral/sandbox"
	"github.com/corral-sandbox/corral/sandbox/sandboxtest"
	"github.com/corral-sandbox/corral/store"
)

// runDaemon runs Run in the background and returns the socket path once
// it listens; the returned stop ends it and returns Run's error.
func runDaemon(t *testing.T, cfg Config) (string, func() error) {
	t.Helper()
	ready := make(chan string, 1)
	cfg.Ready = func(s string) { ready <- s }
	if cfg.Logger == nil {
		cfg.Logger = testLogger(t)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- Run(ctx, cfg) }()
	select {
	case s := <-ready:
		stopped := false
		var err error
		stop := func() error {
			if !stopped {
				stopped = true
				cancel()
				err = <-done
			}
			return err
		}
		t.Cleanup(func() { _ = stop() })
		return s, stop
	case err := <-done:
		cancel()
		t.Fatalf("Run: %v", err)
	case <-time.After(20 * time.Second):
		cancel()
		t.Fatal("the daemon did not start listening")
	}
	return "", nil
}

// seed creates an account with a token, a host project and a managed
// project in the state directory's database, as the CLI does.
func seed(t *testing.T, state string) (tok string, host, managed store.Project) {
	t.Helper()
	ctx := context.Background()
	st, err := store.Open(ctx, filepath.Join(state, "corral.db"), store.Options{Migrate: true})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	a, err := st.CreateAccount(ctx, "alice")
	if err != nil {
		t.Fatal(err)
	}
	tok, _, err = st.CreateToken(ctx, a.ID, "")
	if err != nil {
		t.Fatal(err)
	}
	ps := &Projects{Store: st, StateDir: state}
	root := filepath.Join(state, "host")
	if err := os.Mkdir(root, 0o755); err != nil {
		t.Fatal(err)
	}
	if host, err = ps.Create(ctx, ProjectSpec{Name: "web", Kind: store.ProjectHost, Root: root, Owner: a.ID}); err != nil {
		t.Fatal(err)
	}
	if managed, err = ps.Create(ctx, ProjectSpec{Name: "box", Kind: store.ProjectManaged, Owner: a.ID}); err != nil {
		t.Fatal(err)
	}
	return tok, host, managed
}

func echo(c *client.Client, id int64) (*sandbox.CommandResult, error) {
	return c.RunCommand(context.Background(), id, client.CommandRequest{Command: sandbox.Command{Type: "argv", File: "echo", Args: []string{"ok"}}})
}

// TestRunWithoutWorker: a daemon with no privileged transport serves host
// projects, answers 503 for managed ones, listens on a 0660 socket and
// shuts down cleanly.
func TestRunWithoutWorker(t *testing.T) {
	requireRoot(t)
	state, err := os.MkdirTemp("", "cr")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(state)
	if err := os.MkdirAll(state, 0o711); err != nil {
		t.Fatal(err)
	}
	tok, host, managed := seed(t, state)
	sock, stop := runDaemon(t, Config{StateDir: state})
	if st, err := os.Stat(sock); err != nil || st.Mode().Perm() != SocketMode {
		t.Errorf("socket %s: %v %v", sock, st.Mode(), err)
	}
	c, err := client.New(sock, tok)
	if err != nil {
		t.Fatal(err)
	}
	if res, err := echo(c, host.ID); err != nil || res.Stdout != "ok\n" {
		t.Fatalf("host command: %v %v", res, err)
	}
	_, err = echo(c, managed.ID)
	var ae *client.Error
	if !errors.As(err, &ae) || ae.Status != 503 || ae.Message == "" {
		t.Fatalf("managed command without a worker: %v", err)
	}
	if err := stop(); err != nil {
		t.Fatalf("Run: %v", err)
	}
	if _, err := os.Stat(sock); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("socket left behind: %v", err)
	}
}

// TestRunSupervisesWorker: as root without --worker-socket the daemon
// starts the worker, restarts it when it dies (the gateway reconnects by
// itself), and stops it on shutdown.
func TestRunSupervisesWorker(t *testing.T) {
	requireRoot(t)
	state, err := os.MkdirTemp("", "cs")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(state)
	tok, _, managed := seed(t, state)
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	sock, stop := runDaemon(t, Config{StateDir: state, SuperviseWorker: true, WorkerExe: exe, WorkerLog: testWriter{t}})
	c, err := client.New(sock, tok)
	if err != nil {
		t.Fatal(err)
	}
	run := func() {
		t.Helper()
		// The worker may still be starting: a few 503s are expected.
		deadline := time.Now().Add(15 * time.Second)
		for {
			res, err := echo(c, managed.ID)
			if err == nil && res.Stdout == "ok\n" {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("managed command: %v %v", res, err)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	run()
	workerSock := filepath.Join(state, "worker.sock")
	pids := processesWith(workerSock)
	if len(pids) != 1 {
		t.Fatalf("worker processes %v", pids)
	}
	var pid int
	if _, err := fmtSscan(pids[0], &pid); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "a new worker", func() bool {
		ps := processesWith(workerSock)
		return len(ps) == 1 && ps[0] != pids[0]
	})
	run()
	if err := stop(); err != nil {
		t.Fatalf("Run: %v", err)
	}
	sandboxtest.AssertNoProcesses(t, workerSock)
}

func fmtSscan(s string, v *int) (int, error) { return fmt.Sscan(s, v) }
