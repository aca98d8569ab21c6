package machine_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/corral-sandbox/corral/internal/pdeath"

	"go.uber.org/goleak"

	"github.com/corral-sandbox/corral/internal/testworker"
	"github.com/corral-sandbox/corral/machine"
	"github.com/corral-sandbox/corral/wire"
	"github.com/corral-sandbox/corral/worker"
)

// These tests run the gateway against the real worker (package worker)
// serving a real socket, in this process; the worker re-executes this test
// binary as machine inits (TestMain calls worker.MaybeRunInit).

// TestMain serves both test packages of machine.
func TestMain(m *testing.M) {
	// The integration tests run the real worker, which re-executes this
	// binary as machine inits.
	worker.MaybeRunInit()
	if sock := os.Getenv(childWorkerEnv); sock != "" {
		runChildWorker(sock) // never returns
	}
	goleak.VerifyTestMain(m, goleak.IgnoreTopFunction(pdeath.SpawnerFunc))
}

type realWorker struct {
	w      *worker.Worker
	cancel context.CancelFunc
	done   chan error
}

// startWorker serves a new worker on sock.
func startWorker(t testing.TB, root, sock string) *realWorker {
	return startWorkerWith(t, root, sock, nil)
}

// startWorkerWith is startWorker with the configuration changed by mod.
func startWorkerWith(t testing.TB, root, sock string, mod func(*worker.Config)) *realWorker {
	t.Helper()
	parent := fmt.Sprintf("corral-machine-test-%d-%d", os.Getpid(), time.Now().UnixNano())
	cfg := worker.Config{
		ProjectsRoot: root,
		StateDir:     t.TempDir(),
		IdleGrace:    time.Minute,
		Limits:       worker.Limits{Memory: 256 << 20, Pids: 128},
		CgroupParent: parent,
		IDRegistry:   testworker.IDRegistry,
		Logger:       slog.New(slog.NewTextHandler(tWriter{t}, &slog.HandlerOptions{Level: slog.LevelWarn})),
	}
	if mod != nil {
		mod(&cfg)
	}
	w, err := worker.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := wire.Listen(sock)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	rw := &realWorker{w: w, cancel: cancel, done: make(chan error, 1)}
	go func() { rw.done <- w.Serve(ctx, ln) }()
	t.Cleanup(func() {
		rw.stop(t)
		for _, c := range []string{"memory", "pids", "cpu"} {
			matches, _ := filepath.Glob(filepath.Join("/sys/fs/cgroup", c, "*", parent))
			matches2, _ := filepath.Glob(filepath.Join("/sys/fs/cgroup", c, "*", "*", parent))
			for _, m := range append(matches, matches2...) {
				_ = os.Remove(m)
			}
		}
	})
	return rw
}

// stop ends Serve (closing every connection) and stops all machines. It is
// idempotent.
func (rw *realWorker) stop(t testing.TB) {
	if rw.cancel == nil {
		return
	}
	rw.cancel()
	rw.cancel = nil
	if err := <-rw.done; err != nil {
		t.Errorf("Serve: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := rw.w.Shutdown(ctx); err != nil {
		t.Errorf("Shutdown: %v", err)
	}
}

type tWriter struct{ t testing.TB }

func (w tWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

type integration struct {
	root, sock string
	project    machine.Project
	g          *machine.Gateway

	mu          sync.Mutex
	interrupted [][]string
}

func newIntegration(t testing.TB) (*integration, *realWorker) {
	t.Helper()
	return newIntegrationWith(t, nil)
}

// newIntegrationWith is newIntegration with the worker's configuration
// changed by mod.
func newIntegrationWith(t testing.TB, mod func(*worker.Config)) (*integration, *realWorker) {
	t.Helper()
	root, ws := projectsRoot(t)
	in := &integration{root: root, sock: filepath.Join(t.TempDir(), "worker.sock"),
		project: machine.Project{ID: 1, Workspace: ws}}
	rw := startWorkerWith(t, root, in.sock, mod)
	in.g = machine.New(machine.SocketTransport{Path: in.sock}, machine.Options{
		MinBackoff: 10 * time.Millisecond, MaxBackoff: 100 * time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(tWriter{t}, nil)),
		OnInterrupted: func(ids []string) {
			in.mu.Lock()
			in.interrupted = append(in.interrupted, ids)
			in.mu.Unlock()
		},
	})
	t.Cleanup(func() { in.g.Close() }) // runs before the worker's cleanup
	return in, rw
}

func (in *integration) req(argv ...string) machine.ExecRequest {
	return machine.ExecRequest{Project: in.project, Account: 1, Lease: "L", Argv: argv, Cwd: "/workspace",
		Env: map[string]string{"PATH": worker.DefaultPath}}
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func TestRealWorkerExec(t *testing.T) {
	in, _ := newIntegration(t)
	ctx := ctxT(t)
	s, err := in.g.Exec(ctx, in.req("sh", "-c", `tr a-z A-Z; echo "to stderr from $(id -u)" >&2; pwd; exit 3`))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	io.WriteString(s.Stdin, "hello machine\n")
	s.Stdin.Close()
	var stdout, stderr []byte
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); stdout, _ = io.ReadAll(s.Stdout) }()
	go func() { defer wg.Done(); stderr, _ = io.ReadAll(s.Stderr) }()
	wg.Wait()
	exit, err := s.Wait()
	if err != nil || exit.Code == nil || *exit.Code != 3 {
		t.Fatalf("Wait = %+v, %v; want code 3", exit, err)
	}
	if string(stdout) != "HELLO MACHINE\n/workspace\n" {
		t.Errorf("stdout %q", stdout)
	}
	if string(stderr) != "to stderr from 1000\n" {
		t.Errorf("stderr %q", stderr)
	}
}

func TestRealWorkerNotStartedRejectedCancel(t *testing.T) {
	in, _ := newIntegration(t)
	ctx := ctxT(t)

	s, err := in.g.Exec(ctx, in.req("/no/such/program"))
	if err == nil {
		defer s.Close()
		_, err = s.Wait()
	}
	if !errors.Is(err, machine.ErrNotStarted) {
		t.Errorf("missing program: %v, want ErrNotStarted", err)
	}

	r := in.req("true")
	r.Cwd = "relative"
	_, err = in.g.Exec(ctx, r)
	var rej *machine.RejectedError
	if !errors.As(err, &rej) || !errors.Is(err, machine.ErrBadRequest) {
		t.Errorf("relative cwd: %v, want bad-cwd", err)
	}

	s, err = in.g.Exec(ctx, in.req("sh", "-c", "sleep 100 & sleep 100"))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	// The output streams honour read deadlines.
	dl, ok := s.Stdout.(interface{ SetReadDeadline(time.Time) error })
	if !ok {
		t.Fatalf("stdout is a %T, without read deadlines", s.Stdout)
	}
	if err := dl.SetReadDeadline(time.Now().Add(50 * time.Millisecond)); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Stdout.Read(make([]byte, 1)); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("read past the deadline of a silent command: %v, want a deadline error", err)
	}
	if err := dl.SetReadDeadline(time.Time{}); err != nil {
		t.Fatal(err)
	}
	if err := s.Cancel(ctx); err != nil {
		t.Fatal(err)
	}
	if err := s.Cancel(ctx); err != nil {
		t.Fatal(err)
	}
	exit, err := s.Wait()
	if err != nil || exit.Signal == "" || exit.Code != nil {
		t.Errorf("cancelled: %+v, %v; want a signal", exit, err)
	}
	// Stdout reaches EOF: the whole tree (the background sleep too) is gone.
	done := make(chan struct{})
	go func() { io.Copy(io.Discard, s.Stdout); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Error("stdout still held open after cancel: a descendant survived")
		s.Close()
		<-done
	}
}

func TestRealWorkerRestartInterruptsAndReconnects(t *testing.T) {
	in, rw := newIntegration(t)
	ctx := ctxT(t)
	s, err := in.g.Exec(ctx, in.req("sleep", "100"))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()

	stopped := time.Now()
	rw.stop(t) // the worker goes away
	if _, err := s.Wait(); !errors.Is(err, machine.ErrInterrupted) {
		t.Fatalf("Wait = %v, want ErrInterrupted", err)
	}
	if d := time.Since(stopped); d > 10*time.Second {
		t.Errorf("interruption took %v", d)
	}
	in.mu.Lock()
	got := slices.Clone(in.interrupted)
	in.mu.Unlock()
	if len(got) != 1 || !slices.Equal(got[0], []string{s.ID}) {
		t.Errorf("OnInterrupted calls %v, want [[%s]]", got, s.ID)
	}

	startWorker(t, in.root, in.sock) // a new worker on the same socket
	var out string
	deadline := time.Now().Add(10 * time.Second)
	for {
		s2, err := in.g.Exec(ctx, in.req("echo", "again"))
		if err == nil {
			s2.Stdin.Close()
			b, _ := io.ReadAll(s2.Stdout)
			out = string(b)
			if exit, err := s2.Wait(); err != nil || *exit.Code != 0 {
				t.Fatalf("after restart: %+v, %v", exit, err)
			}
			s2.Close()
			break
		}
		if !errors.Is(err, machine.ErrUnavailable) || time.Now().After(deadline) {
			t.Fatalf("Exec after restart: %v", err)
		}
	}
	if out != "again\n" {
		t.Errorf("stdout %q", out)
	}
}

func TestRealWorkerDial(t *testing.T) {
	in, _ := newIntegration(t)
	ctx := ctxT(t)
	srv, err := in.g.Exec(ctx, in.req("python3", "-m", "http.server", "--bind", "127.0.0.1", "8000"))
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	defer srv.Cancel(ctx)
	go io.Copy(io.Discard, srv.Stdout)
	go io.Copy(io.Discard, srv.Stderr)

	deadline := time.Now().Add(15 * time.Second)
	for {
		nc, err := in.g.Dial(ctx, in.project, 8000)
		if err == nil {
			defer nc.Close()
			nc.SetDeadline(time.Now().Add(10 * time.Second))
			io.WriteString(nc, "GET / HTTP/1.0\r\n\r\n")
			line, err := bufio.NewReader(nc).ReadString('\n')
			if err != nil || !strings.HasPrefix(line, "HTTP/1.0 200") {
				t.Fatalf("response %q, %v", line, err)
			}
			break
		}
		var rej *machine.RejectedError
		if !errors.As(err, &rej) || !errors.Is(err, machine.ErrDialFailed) || time.Now().After(deadline) {
			t.Fatalf("Dial: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	srv.Cancel(ctx)
	if exit, err := srv.Wait(); err != nil || exit.Signal == "" {
		t.Errorf("server after cancel: %+v, %v", exit, err)
	}
}

const childWorkerEnv = "CORRAL_MACHINE_TEST_CHILD_WORKER"

// startChildWorker starts this test binary as a worker process (see
// runChildWorker) serving sock, with workspaces under root and machine
// cgroups under cgParent, its stderr going to stderr; extra adds to its
// environment. The process is killed at cleanup.
func startChildWorker(t testing.TB, root, sock, cgParent string, stderr io.Writer, extra ...string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), childWorkerEnv+"="+sock, childWorkerEnv+"_ROOT="+root,
		childWorkerEnv+"_STATE="+t.TempDir(), childWorkerEnv+"_CGROUP="+cgParent)
	cmd.Env = append(cmd.Env, extra...)
	cmd.Stderr = stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	return cmd
}

// projectsRoot makes a projects root (symlink-free) holding the workspace
// p1, for a real worker.
func projectsRoot(t testing.TB) (root, ws string) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("the real worker needs root: it creates user namespaces, cgroups and idmapped mounts")
	}
	root, err := filepath.EvalSymlinks(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	ws = filepath.Join(root, "p1")
	if err := os.Mkdir(ws, 0o755); err != nil {
		t.Fatal(err)
	}
	return root, ws
}

// runChildWorker is the body of a worker process started by
// TestRealWorkerKilled: argv carries nothing, the environment the socket,
// projects root, state directory and cgroup parent.
func runChildWorker(sock string) {
	w, err := worker.New(worker.Config{
		ProjectsRoot: os.Getenv(childWorkerEnv + "_ROOT"),
		StateDir:     os.Getenv(childWorkerEnv + "_STATE"),
		CgroupParent: os.Getenv(childWorkerEnv + "_CGROUP"),
		IDRegistry:   testworker.IDRegistry,
		Limits:       worker.Limits{Memory: 256 << 20, Pids: childPids()},
	})
	if err == nil {
		var ln *net.UnixListener
		if ln, err = wire.Listen(sock); err == nil {
			err = w.Serve(context.Background(), ln)
		}
	}
	fmt.Fprintln(os.Stderr, "child worker:", err)
	os.Exit(1)
}

// childPids is the child worker's pids limit: 128 unless the environment
// says otherwise.
func childPids() int64 {
	if n, err := strconv.ParseInt(os.Getenv(childWorkerEnv+"_PIDS"), 10, 64); err == nil {
		return n
	}
	return 128
}

// TestRealWorkerKilled kills -9 a worker process mid-command: every caller
// gets a transport error within a second, OnInterrupted first; the next
// command, served by a new worker, succeeds.
func TestRealWorkerKilled(t *testing.T) {
	root, ws := projectsRoot(t)
	sock := filepath.Join(t.TempDir(), "worker.sock")
	cgParent := fmt.Sprintf("corral-machine-kill-%d", os.Getpid())
	t.Cleanup(func() { testworker.RemoveCgroups(cgParent) })
	startChild := func() *exec.Cmd { return startChildWorker(t, root, sock, cgParent, tWriter{t}) }
	child := startChild()
	unique := fmt.Sprintf("1000.%d", os.Getpid()) // recognisable in /proc

	var mu sync.Mutex
	var interrupted []string
	var interruptedAt time.Time
	g := machine.New(machine.SocketTransport{Path: sock}, machine.Options{
		MinBackoff: 10 * time.Millisecond, MaxBackoff: 100 * time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(tWriter{t}, nil)),
		OnInterrupted: func(ids []string) {
			mu.Lock()
			interrupted = append(interrupted, ids...)
			interruptedAt = time.Now()
			mu.Unlock()
		},
	})
	defer g.Close()
	ctx := ctxT(t)
	req := machine.ExecRequest{Project: machine.Project{ID: 1, Workspace: ws}, Argv: []string{"sleep", unique},
		Cwd: "/workspace", Env: map[string]string{"PATH": worker.DefaultPath}}
	var sessions []*machine.Session
	for deadline := time.Now().Add(10 * time.Second); len(sessions) < 3; {
		s, err := g.Exec(ctx, req)
		if errors.Is(err, machine.ErrUnavailable) && time.Now().Before(deadline) {
			time.Sleep(20 * time.Millisecond) // the child is still starting
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		select {
		case <-s.Done():
			// Not what this test is about (a start that failed on a
			// loaded host, say), but it must run to be interrupted:
			// another takes its place.
			exit, err := s.Wait()
			t.Logf("session %s ended before the kill (%+v, %v); starting another", s.ID, exit, err)
			if time.Now().After(deadline) {
				t.Fatal("no session stayed running")
			}
			continue
		default:
		}
		sessions = append(sessions, s)
	}

	if n := countProcs(t, "sleep\x00"+unique); n != len(sessions) {
		for _, s := range sessions {
			select {
			case <-s.Done():
				exit, err := s.Wait()
				t.Logf("session %s already ended: %+v, %v", s.ID, exit, err)
			default:
				t.Logf("session %s running", s.ID)
			}
		}
		t.Fatalf("%d session processes visible before the kill, want %d", n, len(sessions))
	}
	killed := time.Now()
	child.Process.Signal(syscall.SIGKILL)
	var ids []string
	for _, s := range sessions {
		ids = append(ids, s.ID)
		select {
		case <-s.Done():
		case <-time.After(time.Second):
			t.Fatalf("session %s not interrupted within a second of kill -9", s.ID)
		}
		waited := time.Now()
		if _, err := s.Wait(); !errors.Is(err, machine.ErrInterrupted) {
			t.Errorf("Wait = %v, want ErrInterrupted", err)
		}
		mu.Lock()
		if interruptedAt.IsZero() || interruptedAt.After(waited) {
			t.Errorf("OnInterrupted (at %v) not recorded before Wait returned (%v)", interruptedAt, waited)
		}
		mu.Unlock()
	}
	t.Logf("interrupted %v after kill -9", time.Since(killed))
	slices.Sort(ids)
	mu.Lock()
	if !slices.Equal(interrupted, ids) {
		t.Errorf("OnInterrupted got %v, want %v", interrupted, ids)
	}
	mu.Unlock()

	// The killed worker's machines die with it: nothing is left running.
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		n := countProcs(t, "sleep\x00"+unique)
		if n == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Errorf("%d session processes survived kill -9 of their worker", n)
			break
		}
	}

	startChild()
	for deadline := time.Now().Add(10 * time.Second); ; {
		r := req
		r.Argv = []string{"true"}
		s, err := g.Exec(ctx, r)
		if errors.Is(err, machine.ErrUnavailable) && time.Now().Before(deadline) {
			time.Sleep(20 * time.Millisecond)
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		if exit, err := s.Wait(); err != nil || *exit.Code != 0 {
			t.Fatalf("after restart: %+v, %v", exit, err)
		}
		break
	}
}

// countProcs counts processes whose NUL-separated command line starts with
// cmdline.
func countProcs(t *testing.T, cmdline string) int {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err == nil && strings.HasPrefix(string(b), cmdline) {
			n++
		}
	}
	return n
}

// TestRealWorkerFastExecsConcurrent: with exec-attach pipelined behind
// exec-start, a command's whole life (accepted, started, exit) can be read
// before Exec looks at it; every such exec still succeeds.
func TestRealWorkerFastExecsConcurrent(t *testing.T) {
	in, _ := newIntegration(t)
	ctx := ctxT(t)
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 60 {
				s, err := in.g.Exec(ctx, in.req("true"))
				if err != nil {
					errs <- err
					return
				}
				exit, err := s.Wait()
				s.Close()
				if err != nil || exit.Code == nil || *exit.Code != 0 {
					errs <- fmt.Errorf("Wait = %+v, %v", exit, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

// A machine that dies under a started session (its init killed) ends the
// session's Wait with ErrMachineFailed, promptly: the gateway no longer
// ignores the worker's error frame for a started session.
func TestRealWorkerMachineDeathEndsSession(t *testing.T) {
	in, rw := newIntegration(t)
	ctx := ctxT(t)
	s, err := in.g.Exec(ctx, in.req("sleep", "100"))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ms := rw.w.Machines()
	if len(ms) != 1 {
		t.Fatalf("machines %+v", ms)
	}
	if err := syscall.Kill(ms[0].InitPID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	select {
	case <-s.Done():
	case <-ctx.Done():
		t.Fatal("session still running after its machine died")
	}
	if exit, err := s.Wait(); !errors.Is(err, machine.ErrMachineFailed) {
		t.Fatalf("Wait = %+v, %v; want ErrMachineFailed", exit, err)
	}
	// The project gets a new machine.
	s2, err := in.g.Exec(ctx, in.req("true"))
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	if exit, err := s2.Wait(); err != nil || exit.Code == nil || *exit.Code != 0 {
		t.Fatalf("after the machine died: %+v, %v", exit, err)
	}
}

// TestRealWorkerReset: Gateway.Reset is refused "busy" while the machine
// runs a session, then discards guest root's changes outside the
// workspace; an unknown image is a rejection "bad-image".
func TestRealWorkerReset(t *testing.T) {
	in, _ := newIntegration(t)
	ctx := ctxT(t)
	run := func(argv ...string) (machine.Exit, error) {
		s, err := in.g.Exec(ctx, in.req(argv...))
		if err != nil {
			return machine.Exit{}, err
		}
		defer s.Close()
		s.Stdin.Close()
		go io.Copy(io.Discard, s.Stdout)
		go io.Copy(io.Discard, s.Stderr)
		return s.Wait()
	}
	s, err := in.g.Exec(ctx, in.req("sleep", "100"))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	var rej *machine.RejectedError
	if err := in.g.Reset(ctx, in.project); !errors.As(err, &rej) || !errors.Is(err, machine.ErrBusy) {
		t.Fatalf("reset of a busy machine: %v", err)
	}
	if err := s.Cancel(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Wait(); err != nil {
		t.Fatal(err)
	}
	// The guest user may write /var/tmp (sticky, in the image): a change
	// of the upper layer.
	if exit, err := run("sh", "-c", "echo x > /var/tmp/mark"); err != nil || exit.Code == nil || *exit.Code != 0 {
		t.Fatalf("write: %+v %v", exit, err)
	}
	if exit, err := run("test", "-e", "/var/tmp/mark"); err != nil || exit.Code == nil || *exit.Code != 0 {
		t.Fatalf("the change did not persist: %+v %v", exit, err)
	}
	if err := in.g.Reset(ctx, in.project); err != nil {
		t.Fatalf("reset: %v", err)
	}
	if exit, err := run("test", "-e", "/var/tmp/mark"); err != nil || exit.Code == nil || *exit.Code != 1 {
		t.Fatalf("the change survived a reset: %+v %v", exit, err)
	}
	r := in.req("true")
	r.Project.ID, r.Project.Image = 2, "no-such-image"
	if _, err := in.g.Exec(ctx, r); !errors.As(err, &rej) || !errors.Is(err, machine.ErrBadRequest) {
		t.Fatalf("unknown image: %v", err)
	}
}
