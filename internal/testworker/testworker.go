// Package testworker starts a real privileged worker in the test process,
// on a real socket, for tests of the packages above it. The test binary's
// TestMain must call worker.MaybeRunInit first (the worker re-executes it as
// machine inits).
package testworker

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/corral-sandbox/corral/worker"
)

// Worker is a running in-process worker.
type Worker struct {
	*worker.Worker
	// Socket is the path of its protocol-2 socket.
	Socket string
	// ProjectsRoot is where workspaces must live.
	ProjectsRoot string

	cancel context.CancelFunc
	done   chan error
}

// Options tune Start; the zero value is fine.
type Options struct {
	IdleGrace   time.Duration
	Limits      worker.Limits
	MaxSessions int
	// MaxProjects is worker.Config.MaxProjects (0: its default).
	MaxProjects int
	// ProjectsRoot is where workspaces must live; empty means a new
	// temporary directory.
	ProjectsRoot string
	// Logger receives the worker's logs; nil discards them.
	Logger *slog.Logger
	// SelfExe is worker.Config.SelfExe (empty: this test binary).
	SelfExe string
}

// IDRegistry is the id-range registry of test workers (not the host's
// real one, idrange.DefaultRegistry): every test worker on the host gets a
// disjoint block, freed when its temporary state directory is removed.
var IDRegistry = filepath.Join(os.TempDir(), "corral-test-id-ranges.json")

// CgroupPrefix starts the name of every cgroup parent this test process's
// in-process workers use, to find their machines' processes.
func CgroupPrefix() string { return fmt.Sprintf("corral-test-%d-", os.Getpid()) }

// Start serves a new worker until the test ends. It skips the test when not
// run as root.
func Start(t testing.TB, opts Options) *Worker {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("the privileged worker needs root (CI runs as root)")
	}
	if opts.IdleGrace == 0 {
		opts.IdleGrace = time.Minute
	}
	if opts.Limits == (worker.Limits{}) {
		opts.Limits = worker.Limits{Memory: 512 << 20, Pids: 256}
	}
	root := opts.ProjectsRoot
	if root == "" {
		root = t.TempDir()
	}
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	parent := CgroupPrefix() + fmt.Sprint(time.Now().UnixNano())
	w, err := worker.New(worker.Config{
		ProjectsRoot: root,
		StateDir:     t.TempDir(),
		IdleGrace:    opts.IdleGrace,
		Limits:       opts.Limits,
		MaxSessions:  opts.MaxSessions,
		MaxProjects:  opts.MaxProjects,
		CgroupParent: parent,
		IDRegistry:   IDRegistry,
		SelfExe:      opts.SelfExe,
		Logger:       log,
		// Test workspaces are made by root, like the daemon's: they are
		// given to their projects, as the daemon's worker does.
		OwnWorkspaces: true,
	})
	if err != nil {
		t.Fatal(err)
	}
	// A short directory: socket paths are limited to 108 bytes, and test
	// names make t.TempDir long.
	sockDir, err := os.MkdirTemp("", "tw")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(sockDir) })
	sock := filepath.Join(sockDir, "worker.sock")
	ln, err := worker.Listen(sock)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	tw := &Worker{Worker: w, Socket: sock, ProjectsRoot: root, cancel: cancel, done: make(chan error, 1)}
	go func() { tw.done <- w.Serve(ctx, ln) }()
	t.Cleanup(tw.Stop)
	return tw
}

// Workspace makes a new workspace directory under the projects root.
func (w *Worker) Workspace(t testing.TB, name string) string {
	t.Helper()
	dir := filepath.Join(w.ProjectsRoot, name)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

// Stop ends serving (closing every connection) and stops every machine. It
// is idempotent.
func (w *Worker) Stop() {
	if w.cancel == nil {
		return
	}
	w.cancel()
	<-w.done
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_ = w.Shutdown(ctx)
	w.cancel = nil
}
