package worker

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/corral-sandbox/corral/wire"
)

func TestMain(m *testing.M) {
	MaybeRunInit()
	if sock := os.Getenv("CORRAL_TEST_DIAL_AS_OTHER"); sock != "" {
		os.Exit(dialAndHello(sock))
	}
	if sock := os.Getenv("CORRAL_TEST_WORKER_SOCKET"); sock != "" {
		os.Exit(runTestWorker(sock))
	}
	goleak.VerifyTestMain(m, goleak.IgnoreTopFunction("github.com/corral-sandbox/corral/internal/pdeath.spawner"))
}

// runTestWorker serves a worker in this process (a re-executed test
// binary), configured from the environment, until killed.
func runTestWorker(sock string) int {
	ln, err := wire.Listen(sock)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	err = Serve(context.Background(), ln, Config{
		ProjectsRoot: os.Getenv("CORRAL_TEST_PROJECTS"),
		StateDir:     os.Getenv("CORRAL_TEST_STATE"),
		CgroupParent: os.Getenv("CORRAL_TEST_CGROUP"),
	})
	fmt.Fprintln(os.Stderr, err)
	return 1
}

func requireRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("worker tests need root: they create user namespaces, cgroups and idmapped mounts")
	}
}

// testIDRegistry is the id-range registry of every test worker on the host
// (not the real one): test workers get disjoint blocks, and a removed
// temporary state directory frees its block.
var testIDRegistry = filepath.Join(os.TempDir(), "corral-test-id-ranges.json")

type harness struct {
	w    *Worker
	sock string
	root string
}

var cgroupSeq struct {
	sync.Mutex
	n int
}

// newHarness starts an in-process worker serving a real socket.
func newHarness(t testing.TB, mod func(*Config)) *harness {
	t.Helper()
	requireRoot(t)
	root, err := filepath.EvalSymlinks(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	cgroupSeq.Lock()
	cgroupSeq.n++
	parent := fmt.Sprintf("corral-test-%d-%d", os.Getpid(), cgroupSeq.n)
	cgroupSeq.Unlock()
	cfg := Config{
		ProjectsRoot: root,
		StateDir:     t.TempDir(),
		IdleGrace:    time.Minute,
		Limits:       Limits{Memory: 256 << 20, Pids: 128},
		CgroupParent: parent,
		IDRegistry:   testIDRegistry,
		Logger:       slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelWarn})),
	}
	if mod != nil {
		mod(&cfg)
	}
	w, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(t.TempDir(), "worker.sock")
	ln, err := wire.Listen(sock)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Serve(ctx, ln) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
		sctx, scancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer scancel()
		if err := w.Shutdown(sctx); err != nil {
			t.Errorf("Shutdown: %v", err)
		}
		for _, d := range w.cgroups.Parents() {
			_ = os.Remove(d)
		}
	})
	return &harness{w: w, sock: sock, root: root}
}

func ownCgroup(controller string) (string, error) {
	b, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return "", err
	}
	for _, l := range bytes.Split(b, []byte("\n")) {
		parts := bytes.SplitN(l, []byte(":"), 3)
		if len(parts) == 3 {
			for _, c := range bytes.Split(parts[1], []byte(",")) {
				if string(c) == controller {
					return string(parts[2]), nil
				}
			}
		}
	}
	return "", errors.New("not found")
}

type testWriter struct{ t testing.TB }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(string(bytes.TrimRight(p, "\n")))
	return len(p), nil
}

// project creates a workspace for project id.
func (h *harness) project(t testing.TB, id int64) wire.Project {
	t.Helper()
	dir := filepath.Join(h.root, "p"+strconv.FormatInt(id, 10))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return wire.Project{ID: id, Workspace: dir}
}

// dial connects and performs the handshake.
func (h *harness) dial(t testing.TB) *wire.Conn {
	t.Helper()
	c, err := wire.Dial(context.Background(), h.sock)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := wire.ClientHello(c); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

type result struct {
	stdout, stderr string
	exit           *wire.ExecExit
	started        bool
}

func (r result) code() int {
	if r.exit.Code == nil {
		return -1
	}
	return *r.exit.Code
}

func (r result) String() string {
	return fmt.Sprintf("exit=%+v code=%d stdout=%q stderr=%q", *r.exit, r.code(), r.stdout, r.stderr)
}

// recv receives one frame, failing the test on error.
func recv(t testing.TB, c *wire.Conn) wire.Message {
	t.Helper()
	_ = c.UnixConn().SetReadDeadline(time.Now().Add(30 * time.Second))
	m, files, err := c.Recv()
	if err != nil {
		t.Fatalf("recv: %v", err)
	}
	for _, f := range files {
		f.Close()
	}
	return m
}

// start sends exec-start and attaches pipes; it returns the readers of
// stdout and stderr (collected in the background) once exec-started or
// exec-exit arrived.
type running struct {
	id      string
	c       *wire.Conn
	out     chan string
	errOut  chan string
	first   wire.Message
	stdinW  *os.File
	started bool
}

var idSeq struct {
	sync.Mutex
	n int
}

func newID() string {
	idSeq.Lock()
	defer idSeq.Unlock()
	idSeq.n++
	return "s" + strconv.Itoa(idSeq.n)
}

func (h *harness) start(t testing.TB, c *wire.Conn, p wire.Project, argv ...string) *running {
	t.Helper()
	return h.startAs(t, c, p, "", argv...)
}

// startAs is start as user (empty: the machine's default user).
func (h *harness) startAs(t testing.TB, c *wire.Conn, p wire.Project, user string, argv ...string) *running {
	t.Helper()
	id := newID()
	if err := c.Send(&wire.ExecStart{ID: id, Project: p, Argv: argv, Cwd: "/workspace", User: user}); err != nil {
		t.Fatal(err)
	}
	switch m := recv(t, c).(type) {
	case *wire.ExecAccepted:
	default:
		t.Fatalf("exec-start %v: got %#v", argv, m)
	}
	inR, inW, _ := os.Pipe()
	outR, outW, _ := os.Pipe()
	errR, errW, _ := os.Pipe()
	r := &running{id: id, c: c, out: make(chan string, 1), errOut: make(chan string, 1), stdinW: inW}
	collect := func(f *os.File, ch chan string) {
		b, _ := io.ReadAll(f)
		f.Close()
		ch <- string(b)
	}
	go collect(outR, r.out)
	go collect(errR, r.errOut)
	err := c.Send(&wire.ExecAttach{ID: id}, inR, outW, errW)
	inR.Close()
	outW.Close()
	errW.Close()
	if err != nil {
		t.Fatal(err)
	}
	r.first = recv(t, c)
	_, r.started = r.first.(*wire.ExecStarted)
	return r
}

func (r *running) wait(t testing.TB) result {
	t.Helper()
	r.stdinW.Close()
	m := r.first
	if r.started {
		m = recv(t, r.c)
	}
	exit, ok := m.(*wire.ExecExit)
	if !ok {
		t.Fatalf("want exec-exit, got %#v", m)
	}
	if exit.ID != r.id {
		t.Fatalf("exit for %q, want %q", exit.ID, r.id)
	}
	return result{stdout: <-r.out, stderr: <-r.errOut, exit: exit, started: r.started}
}

func (h *harness) run(t testing.TB, c *wire.Conn, p wire.Project, argv ...string) result {
	t.Helper()
	return h.start(t, c, p, argv...).wait(t)
}

// runAs is run as user.
func (h *harness) runAs(t testing.TB, c *wire.Conn, p wire.Project, user string, argv ...string) result {
	t.Helper()
	return h.startAs(t, c, p, user, argv...).wait(t)
}
