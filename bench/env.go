package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime/pprof"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/corral-sandbox/corral/core"
	"github.com/corral-sandbox/corral/internal/workerproc"
	"github.com/corral-sandbox/corral/machine"
	"github.com/corral-sandbox/corral/sandbox"
	"github.com/corral-sandbox/corral/store"
	"github.com/corral-sandbox/corral/wire"
	"github.com/corral-sandbox/corral/worker"
)

// children are the modes the bench re-executes itself in.
var children = map[string]func(args []string) error{
	"__worker": workerChild,
	"__flood":  floodChild,
	"__leases": leasesChild,
	"__agent":  agentChild,
	"__relay":  relayChild,
}

// workerProc is the privileged worker, running as a child process.
type workerProc struct {
	proc         *workerproc.Process
	socket       string
	projectsRoot string
	// cgroupPrefix and the worker's pid name its cgroup parent, which
	// the worker leaves behind (empty) when it stops.
	cgroupPrefix string
}

// newWorkerDirs makes the socket's, projects' and state directories of a
// worker under dir.
func newWorkerDirs(dir string) (w *workerProc, state string, err error) {
	w = &workerProc{
		socket:       filepath.Join(dir, "w.sock"),
		projectsRoot: filepath.Join(dir, "projects"),
	}
	state = filepath.Join(dir, "worker-state")
	for _, d := range []string{w.projectsRoot, state} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, "", err
		}
	}
	return w, state, nil
}

// startWorker starts `bench __worker` and waits until it answers.
func startWorker(dir, profile string) (*workerProc, error) {
	w, state, err := newWorkerDirs(dir)
	if err != nil {
		return nil, err
	}
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	args := []string{"__worker", "-socket", w.socket, "-projects-root", w.projectsRoot, "-state", state}
	if profile != "" {
		args = append(args, "-cpuprofile", filepath.Join(profile, "worker.pprof"))
	}
	w.cgroupPrefix = "corral-bench-"
	if err := w.launch(self, args...); err != nil {
		return nil, err
	}
	return w, nil
}

// startSlimWorker builds bench/slimworker (the worker linked alone) with
// the go command and starts it: an experiment, run from the module root.
func startSlimWorker(dir string) (*workerProc, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	bin := filepath.Join(dir, "slimworker")
	if out, err := exec.Command("go", "build", "-o", bin, "./bench/slimworker").CombinedOutput(); err != nil {
		return nil, fmt.Errorf("go build ./bench/slimworker: %w: %s", err, bytesTrim(out))
	}
	w, state, err := newWorkerDirs(dir)
	if err != nil {
		return nil, err
	}
	w.cgroupPrefix = "corral-bench-slim-"
	if err := w.launch(bin, w.socket, w.projectsRoot, state); err != nil {
		return nil, err
	}
	return w, nil
}

// launch starts exe as w's process and waits until it answers on its
// socket.
func (w *workerProc) launch(exe string, args ...string) error {
	p, err := workerproc.Start(context.Background(), workerproc.Options{
		Exe:          exe,
		Args:         args,
		Socket:       w.socket,
		Stderr:       os.Stderr,
		Pdeathsig:    syscall.SIGTERM,
		ReadyTimeout: 30 * time.Second,
	})
	if err != nil {
		return fmt.Errorf("start worker: %w", err)
	}
	w.proc = p
	return nil
}

// stop ends the worker with SIGTERM (it stops every machine) and waits.
func (w *workerProc) stop() {
	if w == nil || w.proc == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 40*time.Second)
	defer cancel()
	_ = w.proc.Stop(ctx)
	if w.cgroupPrefix != "" {
		removeCgroupParent(w.cgroupPrefix + strconv.Itoa(w.proc.Pid))
	}
	w.proc = nil
}

// removeCgroupParent removes the cgroup directories named parent that a
// stopped worker of ours left, bottom-up: below our own cgroup in each v1
// hierarchy, below the root of the v2 one (as worker.Config.CgroupParent
// places them). rmdir removes only empty cgroups, so a cgroup that still
// has processes stays.
func removeCgroupParent(parent string) {
	b, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return
	}
	var dirs []string
	for line := range strings.Lines(string(b)) {
		f := strings.SplitN(strings.TrimSpace(line), ":", 3)
		if len(f) != 3 {
			continue
		}
		switch {
		case f[1] == "":
			dirs = append(dirs, filepath.Join("/sys/fs/cgroup/unified", parent), filepath.Join("/sys/fs/cgroup", parent))
		case !strings.HasPrefix(f[1], "name="):
			ctrl, _, _ := strings.Cut(f[1], ",")
			dirs = append(dirs, filepath.Join("/sys/fs/cgroup", ctrl, f[2], parent))
		}
	}
	for _, d := range dirs {
		var all []string
		_ = filepath.WalkDir(d, func(p string, e os.DirEntry, err error) error {
			if err == nil && e.IsDir() {
				all = append(all, p)
			}
			return nil
		})
		for i := len(all) - 1; i >= 0; i-- {
			_ = syscall.Rmdir(all[i])
		}
	}
}

// workspace makes a new workspace directory under the projects root.
func (w *workerProc) workspace(name string) (string, error) {
	dir := filepath.Join(w.projectsRoot, name)
	return dir, os.MkdirAll(dir, 0o755)
}

// workerChild serves protocol 2 as `corral worker` does, with the defaults
// of a production worker, until SIGTERM.
func workerChild(args []string) error {
	fs := flag.NewFlagSet("__worker", flag.ContinueOnError)
	sock := fs.String("socket", "", "")
	root := fs.String("projects-root", "", "")
	state := fs.String("state", "", "")
	prof := fs.String("cpuprofile", "", "")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *prof != "" {
		f, err := os.Create(*prof)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer pprof.StopCPUProfile()
	}
	w, err := worker.New(worker.Config{
		ProjectsRoot: *root,
		StateDir:     *state,
		CgroupParent: fmt.Sprintf("corral-bench-%d", os.Getpid()),
		Logger:       slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})),
		Name:         "corral-bench-worker",
	})
	if err != nil {
		return err
	}
	ln, err := wire.Listen(*sock)
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	serveErr := w.Serve(ctx, ln)
	sctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	return errors.Join(serveErr, w.Shutdown(sctx))
}

// corral is a built core with the projects the bench uses.
type corral struct {
	core *core.Core
	ctl  *sandbox.Control
	st   store.Store
	w    *workerProc

	alice sandbox.Actor // member of every project, not trusted
	bob   sandbox.Actor // trusted member of the host project
	host  store.Project
	// managed is the warm project (its machine stays up).
	managed store.Project
	coldN   int
}

// buildCorral builds a core over a fresh store in dir, talking to w (nil:
// no managed projects).
func buildCorral(ctx context.Context, dir string, w *workerProc) (*corral, error) {
	opts := core.Options{
		StorePath: filepath.Join(dir, "corral.db"),
		Migrate:   true,
		Logger:    slog.Default(),
	}
	if w != nil {
		opts.PrivilegedTransport = machine.SocketTransport{Path: w.socket}
	}
	c, err := core.Build(ctx, opts)
	if err != nil {
		return nil, err
	}
	cr := &corral{core: c, st: c.Store(), w: w}
	if cr.ctl, err = c.Sandbox(); err != nil {
		c.Close()
		return nil, err
	}
	fail := func(err error) (*corral, error) { c.Close(); return nil, err }
	a, err := cr.st.CreateAccount(ctx, "alice")
	if err != nil {
		return fail(err)
	}
	b, err := cr.st.CreateAccount(ctx, "bob")
	if err != nil {
		return fail(err)
	}
	cr.alice, cr.bob = sandbox.Actor{AccountUserID: a.ID}, sandbox.Actor{AccountUserID: b.ID}
	hostRoot := filepath.Join(dir, "hostproject")
	if err := os.MkdirAll(hostRoot, 0o755); err != nil {
		return fail(err)
	}
	if cr.host, err = cr.project(ctx, store.ProjectHost, "host", hostRoot); err != nil {
		return fail(err)
	}
	if _, err := cr.st.AddMember(ctx, store.Member{Project: cr.host.ID, Account: b.ID, Role: store.RoleMember, Trusted: true}); err != nil {
		return fail(err)
	}
	if w != nil {
		ws, err := w.workspace("warm")
		if err != nil {
			return fail(err)
		}
		if cr.managed, err = cr.project(ctx, store.ProjectManaged, "warm", ws); err != nil {
			return fail(err)
		}
	}
	return cr, nil
}

// project creates a project with alice as its owner.
func (cr *corral) project(ctx context.Context, kind store.ProjectKind, name, root string) (store.Project, error) {
	p, err := cr.st.CreateProject(ctx, store.NewProject{Kind: kind, Name: name, Root: root})
	if err != nil {
		return p, err
	}
	_, err = cr.st.AddMember(ctx, store.Member{Project: p.ID, Account: cr.alice.AccountUserID, Role: store.RoleOwner})
	return p, err
}

// coldProject creates a new managed project: its first command starts a
// machine.
func (cr *corral) coldProject(ctx context.Context) (store.Project, error) {
	cr.coldN++
	name := fmt.Sprintf("cold%d", cr.coldN)
	ws, err := cr.w.workspace(name)
	if err != nil {
		return store.Project{}, err
	}
	return cr.project(ctx, store.ProjectManaged, name, ws)
}

func input(p store.Project, argv ...string) sandbox.ExecInput {
	return sandbox.ExecInput{
		Command:   sandbox.Command{Type: sandbox.CommandTypeArgv, File: argv[0], Args: argv[1:]},
		LeaseKind: sandbox.LeaseTerminal,
		Project:   sandbox.ProjectRef{Kind: sandbox.ProjectKind(p.Kind), ProjectID: p.ID},
	}
}

// runTrue runs `true` through RunCommand and checks it exited 0.
func (cr *corral) runTrue(ctx context.Context, p store.Project, actor sandbox.Actor) error {
	res, err := cr.ctl.RunCommand(ctx, input(p, "true"), &actor, nil)
	if err != nil {
		return err
	}
	if res.Code == nil || *res.Code != 0 {
		return fmt.Errorf("true: code %v signal %q", res.Code, res.Signal)
	}
	return nil
}
