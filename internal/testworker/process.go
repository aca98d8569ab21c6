package testworker

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/corral-sandbox/corral/internal/workerproc"
	"github.com/corral-sandbox/corral/worker"
)

const childEnv = "CORRAL_TESTWORKER_CHILD"

// MaybeRunChild must be called by TestMain (after worker.MaybeRunInit) in
// test binaries that use StartProcess: in a worker child it serves and never
// returns.
func MaybeRunChild() {
	sock := os.Getenv(childEnv)
	if sock == "" {
		return
	}
	w, err := worker.New(worker.Config{
		ProjectsRoot: os.Getenv(childEnv + "_ROOT"),
		StateDir:     os.Getenv(childEnv + "_STATE"),
		CgroupParent: os.Getenv(childEnv + "_CGROUP"),
		IDRegistry:   IDRegistry,
		Limits:       worker.Limits{Memory: 512 << 20, Pids: 256},
		// Test workspaces are made by root, like the daemon's.
		OwnWorkspaces: true,
	})
	if err == nil {
		var ln *net.UnixListener
		if ln, err = worker.Listen(sock); err == nil {
			err = w.Serve(context.Background(), ln)
		}
	}
	fmt.Fprintln(os.Stderr, "testworker child:", err)
	os.Exit(1)
}

// Process is a worker running as a child process of the test, so that a
// test can kill it with SIGKILL.
type Process struct {
	Socket       string
	ProjectsRoot string
	state        string
	cgroup       string
	proc         *workerproc.Process
}

// StartProcess starts a worker child process. It skips the test when not
// run as root.
func StartProcess(t testing.TB) *Process {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("the privileged worker needs root (CI runs as root)")
	}
	p := &Process{
		Socket:       filepath.Join(t.TempDir(), "worker.sock"),
		ProjectsRoot: t.TempDir(),
		state:        t.TempDir(),
		cgroup:       fmt.Sprintf("corral-testproc-%d-%d", os.Getpid(), time.Now().UnixNano()),
	}
	p.Start(t)
	t.Cleanup(p.cleanup)
	return p
}

// Start (re)starts the worker on the same socket and waits until it answers.
func (p *Process) Start(t testing.TB) {
	t.Helper()
	proc, err := workerproc.Start(context.Background(), workerproc.Options{
		Exe:  os.Args[0],
		Args: []string{"-test.run=^$"},
		Env: append(os.Environ(), childEnv+"="+p.Socket, childEnv+"_ROOT="+p.ProjectsRoot,
			childEnv+"_STATE="+p.state, childEnv+"_CGROUP="+p.cgroup),
		Socket:    p.Socket,
		Stderr:    os.Stderr,
		Pdeathsig: syscall.SIGKILL,
	})
	if err != nil {
		t.Fatalf("worker child: %v", err)
	}
	p.proc = proc
}

// Workspace makes a new workspace directory under the projects root.
func (p *Process) Workspace(t testing.TB, name string) string {
	t.Helper()
	dir := filepath.Join(p.ProjectsRoot, name)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

// Kill sends SIGKILL to the worker and waits for it to end. It is
// idempotent.
func (p *Process) Kill() {
	if p.proc == nil {
		return
	}
	p.proc.Kill()
	p.proc = nil
	os.Remove(p.Socket)
}

// cleanup removes the cgroups a killed worker left (its machines die with
// it, their groups empty out).
func (p *Process) cleanup() {
	p.Kill()
	RemoveCgroups(p.cgroup)
}

// RemoveCgroups removes, in every hierarchy, the empty cgroup directories
// named parent (anywhere below the mount) and their children, retrying for
// a short while as dying processes leave them.
func RemoveCgroups(parent string) {
	deadline := time.Now().Add(3 * time.Second)
	for {
		var left int
		for _, pattern := range []string{"/sys/fs/cgroup/*/" + parent, "/sys/fs/cgroup/*/*/" + parent, "/sys/fs/cgroup/*/*/*/" + parent, "/sys/fs/cgroup/*/*/*/*/" + parent} {
			dirs, _ := filepath.Glob(pattern)
			for _, d := range dirs {
				kids, _ := filepath.Glob(filepath.Join(d, "*", "cgroup.procs"))
				for _, k := range kids {
					_ = os.Remove(filepath.Dir(k))
				}
				if err := os.Remove(d); err != nil && !os.IsNotExist(err) {
					left++
				}
			}
		}
		if left == 0 || time.Now().After(deadline) {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
}
