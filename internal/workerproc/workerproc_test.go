package workerproc_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/corral-sandbox/corral/internal/testworker"
	"github.com/corral-sandbox/corral/internal/workerproc"
	"github.com/corral-sandbox/corral/wire"
	"github.com/corral-sandbox/corral/worker"
)

// The test binary re-executes itself as the worker: childMode selects what
// the child does.
const childMode = "CORRAL_WORKERPROC_CHILD"

// muted are the mute child's connections, kept open and never answered.
var muted []net.Conn

func TestMain(m *testing.M) {
	worker.MaybeRunInit()
	switch os.Getenv(childMode) {
	case "":
		os.Exit(m.Run())
	case "serve": // a real worker
		sock, state := os.Args[len(os.Args)-2], os.Args[len(os.Args)-1]
		w, err := worker.New(worker.Config{
			ProjectsRoot: state, StateDir: state, IDRegistry: testworker.IDRegistry,
			CgroupParent: fmt.Sprintf("corral-testwp-%d", os.Getpid()),
		})
		if err == nil {
			var ln *net.UnixListener
			if ln, err = wire.Listen(sock); err == nil {
				err = w.Serve(context.Background(), ln)
			}
		}
		fmt.Fprintln(os.Stderr, "worker:", err)
		os.Exit(1)
	case "fail": // a worker that cannot start
		fmt.Fprintln(os.Stderr, "some noise")
		fmt.Fprintln(os.Stderr, "worker: bad --state: no such directory")
		os.Exit(2)
	case "mute": // listens, but never answers the handshake
		ln, err := wire.Listen(os.Args[len(os.Args)-2])
		if err != nil {
			os.Exit(1)
		}
		for {
			c, err := ln.Accept()
			if err != nil {
				os.Exit(1)
			}
			muted = append(muted, c)
		}
	}
	os.Exit(3)
}

func opts(t *testing.T, mode string) workerproc.Options {
	sock := filepath.Join(t.TempDir(), "w.sock")
	return workerproc.Options{
		Exe:       os.Args[0],
		Args:      []string{"-test.run=^$", sock, t.TempDir()},
		Env:       append(os.Environ(), childMode+"="+mode),
		Socket:    sock,
		Pdeathsig: syscall.SIGKILL,
	}
}

// cleanup removes the cgroup parent a worker leaves.
func cleanup(t *testing.T, p *workerproc.Process) {
	t.Cleanup(func() {
		p.Kill()
		testworker.RemoveCgroups(fmt.Sprintf("corral-testwp-%d", p.Pid))
	})
}

func needRoot(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("the privileged worker needs root (CI runs as root)")
	}
}

// A started worker answers the handshake at once; Stop ends it with
// SIGTERM, reaps it, and is idempotent.
func TestStartReadyStop(t *testing.T) {
	needRoot(t)
	p, err := workerproc.Start(context.Background(), opts(t, "serve"))
	if err != nil {
		t.Fatal(err)
	}
	cleanup(t, p)
	c, err := wire.Dial(context.Background(), p.Socket)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := wire.ClientHello(c); err != nil {
		t.Fatalf("handshake after Start: %v", err)
	}
	c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := p.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case <-p.Done():
	default:
		t.Fatal("Stop returned before the worker was reaped")
	}
	var ee *exec.ExitError
	if err := p.Wait(); !errors.As(err, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGTERM {
		// The test child does not handle SIGTERM: it dies of it.
		t.Fatalf("Wait = %v, want death by SIGTERM", err)
	}
	if err := syscall.Kill(p.Pid, 0); !errors.Is(err, syscall.ESRCH) {
		t.Fatalf("pid %d after Stop: kill 0 = %v, want ESRCH (reaped)", p.Pid, err)
	}
	if err := p.Stop(ctx); err != nil {
		t.Fatalf("second Stop: %v", err)
	}
	p.Kill() // idempotent too
}

// A worker that exits at start fails Start, with its stderr in the error.
func TestStartExitedGivesStderr(t *testing.T) {
	var seen strings.Builder
	o := opts(t, "fail")
	o.Stderr = &seen
	p, err := workerproc.Start(context.Background(), o)
	if err == nil {
		p.Kill()
		t.Fatal("Start succeeded for a worker that exits")
	}
	if !strings.Contains(err.Error(), "bad --state: no such directory") || !strings.Contains(err.Error(), "exit status 2") {
		t.Fatalf("error = %q, want the exit status and the worker's stderr", err)
	}
	if !strings.Contains(seen.String(), "bad --state") {
		t.Fatalf("Stderr got %q, want the worker's stderr too", seen.String())
	}
}

// Readiness is a protocol-2 handshake, not a connect: a process that
// accepts connections but never answers is not ready, and Start kills it.
func TestStartNeedsHandshake(t *testing.T) {
	o := opts(t, "mute")
	o.ReadyTimeout = 500 * time.Millisecond
	p, err := workerproc.Start(context.Background(), o)
	if err == nil {
		p.Kill()
		t.Fatal("Start succeeded for a process that never answers the handshake")
	}
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("error = %v, want the ready timeout", err)
	}
}

// A worker killed with SIGKILL is reported by Wait and Done.
func TestKilledWorkerReported(t *testing.T) {
	needRoot(t)
	p, err := workerproc.Start(context.Background(), opts(t, "serve"))
	if err != nil {
		t.Fatal(err)
	}
	cleanup(t, p)
	if err := syscall.Kill(p.Pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-p.Done()
	var ee *exec.ExitError
	if err := p.Wait(); !errors.As(err, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
		t.Fatalf("Wait = %v, want death by SIGKILL", err)
	}
	if err := p.Stop(context.Background()); err != nil {
		t.Fatalf("Stop of a dead worker: %v", err)
	}
}

// A cancelled ctx ends the wait: Start stops the worker and says why.
func TestStartCancelled(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	p, err := workerproc.Start(ctx, opts(t, "mute"))
	if err == nil {
		p.Kill()
		t.Fatal("Start succeeded with a cancelled context")
	}
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("error = %v, want context.Canceled", err)
	}
}

// TestArgs: the worker's command line, spelled once.
func TestArgs(t *testing.T) {
	got := strings.Join(workerproc.Args{Socket: "/s/w.sock", ProjectsRoot: "/p", State: "/s/worker", Images: "/s/images",
		OwnWorkspaces: true, AllowUID: 0, Extra: []string{"--memory", "1G"}}.Argv(), " ")
	if want := "worker --socket /s/w.sock --projects-root /p --state /s/worker --images /s/images --own-workspaces --allow-uid 0 --memory 1G"; got != want {
		t.Errorf("daemon's worker: %q, want %q", got, want)
	}
	got = strings.Join(workerproc.Args{Socket: "/s/w.sock", ProjectsRoot: "/", GrantWorkspaces: true, AllowUID: -1, ExitIdle: time.Minute, IdleLock: "/s/users.lock"}.Argv(), " ")
	if want := "worker --socket /s/w.sock --projects-root / --grant-workspaces --exit-idle 1m0s --idle-lock /s/users.lock"; got != want {
		t.Errorf("shared worker: %q, want %q", got, want)
	}
}
