package egress_test

import (
	"archive/zip"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/corral-sandbox/corral/egress"
	"github.com/corral-sandbox/corral/internal/testworker"
	"github.com/corral-sandbox/corral/machine"
	"github.com/corral-sandbox/corral/worker"
)

func TestMain(m *testing.M) {
	worker.MaybeRunInit()
	os.Exit(m.Run())
}

type names map[string]string

func (n names) LookupNetIP(_ context.Context, _, host string) ([]netip.Addr, error) {
	if a, ok := n[host]; ok {
		return []netip.Addr{netip.MustParseAddr(a)}, nil
	}
	return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
}

// machineFixture is a real machine (a real worker, a session holding it up)
// whose proxies are armed, and an upstream file server on host loopback.
type machineFixture struct {
	g       *machine.Gateway
	project machine.Project
	m       *egress.Machine
	audit   chan egress.Record
	port    int    // the upstream's
	files   string // what it serves
}

func newMachineFixture(t *testing.T, p egress.Policy) *machineFixture {
	t.Helper()
	tw := testworker.Start(t, testworker.Options{})
	f := &machineFixture{files: t.TempDir(), audit: make(chan egress.Record, 100)}
	f.project = machine.Project{ID: 1, Workspace: tw.Workspace(t, "p1")}
	f.g = machine.New(machine.SocketTransport{Path: tw.Socket}, machine.Options{Logger: slog.New(slog.DiscardHandler)})
	t.Cleanup(func() { f.g.Close() })

	up, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.FileServer(http.Dir(f.files))}
	go srv.Serve(up)
	t.Cleanup(func() { srv.Close() })
	f.port = up.Addr().(*net.TCPAddr).Port

	floor, err := egress.NewFloor([]string{"127.0.0.0/8"}, false)
	if err != nil {
		t.Fatal(err)
	}
	s, err := egress.NewService(egress.Options{Floor: floor,
		Resolver: names{"up.test": "127.0.0.1", "other.test": "127.0.0.1", "evil.test": "169.254.169.254"},
		Audit:    func(r egress.Record) { f.audit <- r }})
	if err != nil {
		t.Fatal(err)
	}
	if f.m, err = s.NewMachine(1, 1, p); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.m.Close() })

	ctx := ctxT(t)
	hold, err := f.g.Exec(ctx, f.req("sleep", "120"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { hold.Cancel(context.Background()); hold.Wait(); hold.Close() })
	deadline := time.Now().Add(20 * time.Second)
	for {
		err := f.m.Arm(ctx, f.g, f.project)
		if err == nil {
			break
		}
		var rej *machine.RejectedError
		if !errors.As(err, &rej) || !errors.Is(err, machine.ErrDialFailed) || time.Now().After(deadline) {
			t.Fatal(err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	return f
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func (f *machineFixture) req(argv ...string) machine.ExecRequest {
	env := egress.Env()
	env["PATH"] = worker.DefaultPath
	env["HOME"] = "/tmp"
	return machine.ExecRequest{Project: f.project, Account: 1, Lease: "L", Argv: argv, Cwd: "/workspace", Env: env}
}

// run runs a shell script in the machine and returns its exit code and
// output.
func (f *machineFixture) run(t *testing.T, script string) (int, string) {
	t.Helper()
	s, err := f.g.Exec(ctxT(t), f.req("sh", "-c", "exec 2>&1\n"+script))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	s.Stdin.Close()
	go io.Copy(io.Discard, s.Stderr)
	out, _ := io.ReadAll(s.Stdout)
	exit, err := s.Wait()
	if err != nil || exit.Code == nil {
		t.Fatalf("%s: %+v, %v", script, exit, err)
	}
	return *exit.Code, string(out)
}

func (f *machineFixture) record(t *testing.T) egress.Record {
	t.Helper()
	select {
	case r := <-f.audit:
		return r
	case <-time.After(20 * time.Second):
		t.Fatal("no audit record")
		return egress.Record{}
	}
}

func TestMachineProxy(t *testing.T) {
	f := newMachineFixture(t, egress.Policy{Mode: egress.ModeProxy, Allow: []string{"up.test", "evil.test"}, Deny: []string{"other.test"}})
	os.WriteFile(filepath.Join(f.files, "hello.txt"), []byte("hello through corral\n"), 0o644)

	// Allowed, through curl honouring the environment.
	code, out := f.run(t, fmt.Sprintf("curl -sS -f http://up.test:%d/hello.txt", f.port))
	if code != 0 || out != "hello through corral\n" {
		t.Fatalf("curl allowed: %d %q", code, out)
	}
	if r := f.record(t); r.Verdict != egress.VerdictAllowed || r.Name != "up.test" || r.Addr != "127.0.0.1" {
		t.Errorf("record %+v", r)
	}
	// Through SOCKS5 (curl resolving nothing itself: socks5h).
	code, out = f.run(t, fmt.Sprintf("curl -sS -f --proxy \"$ALL_PROXY\" http://up.test:%d/hello.txt", f.port))
	if code != 0 || out != "hello through corral\n" {
		t.Fatalf("curl through SOCKS5: %d %q", code, out)
	}
	if r := f.record(t); r.Verdict != egress.VerdictAllowed || r.Protocol != "socks5" {
		t.Errorf("record %+v", r)
	}

	// Denied, not allowed, and allowed-but-on-the-floor: 403 / reply 2.
	for _, tt := range []struct{ host, rule string }{
		{"other.test", "other.test"}, {"nowhere.test", egress.ReasonNoAllowRule}, {"evil.test", egress.ReasonFloor},
	} {
		code, out := f.run(t, fmt.Sprintf("curl -sS -o /dev/null -w '%%{http_code}' http://%s:%d/hello.txt", tt.host, f.port))
		if out != "403" {
			t.Errorf("curl %s: %d %q, want 403", tt.host, code, out)
		}
		if r := f.record(t); r.Verdict != egress.VerdictDenied || r.Rule != tt.rule {
			t.Errorf("%s: record %+v", tt.host, r)
		}
		code, out = f.run(t, fmt.Sprintf("curl -sS --proxy \"$ALL_PROXY\" http://%s:%d/hello.txt", tt.host, f.port))
		if code == 0 || !strings.Contains(out, "not allowed") && !strings.Contains(out, "(97)") && !strings.Contains(out, "denied") {
			t.Errorf("curl SOCKS5 %s: %d %q", tt.host, code, out)
		}
		if r := f.record(t); r.Verdict != egress.VerdictDenied || r.Protocol != "socks5" {
			t.Errorf("%s: record %+v", tt.host, r)
		}
	}

	// Programs that ignore the proxy reach nothing: the machine has only
	// its loopback, where nothing listens on the upstream's port.
	code, out = f.run(t, fmt.Sprintf("curl -sS --noproxy '*' --max-time 5 http://127.0.0.1:%d/hello.txt", f.port))
	if code == 0 || strings.Contains(out, "hello through corral") {
		t.Errorf("curl --noproxy: %d %q", code, out)
	}
	code, out = f.run(t, fmt.Sprintf(`python3 -c '
import socket
for host in ("127.0.0.1", "1.1.1.1", "169.254.169.254"):
    try:
        socket.create_connection((host, %d), timeout=3)
        print("connected", host)
    except OSError as e:
        print("refused", host, e.errno)
'`, f.port))
	if code != 0 || strings.Contains(out, "connected") {
		t.Errorf("python sockets: %d %q", code, out)
	}

	// A policy change applies to the next connection.
	if err := f.m.SetPolicy(egress.Policy{Mode: egress.ModeProxy, Allow: []string{"up.test"}, Deny: []string{"up.test"}}); err != nil {
		t.Fatal(err)
	}
	if _, out := f.run(t, fmt.Sprintf("curl -sS -o /dev/null -w '%%{http_code}' http://up.test:%d/hello.txt", f.port)); out != "403" {
		t.Errorf("after deny: %q", out)
	}
	f.record(t)
}

func TestMachineGitAndPip(t *testing.T) {
	f := newMachineFixture(t, egress.Policy{Mode: egress.ModeProxy, Allow: []string{"up.test"}})
	// A bare repository served as dumb HTTP.
	src := t.TempDir()
	for _, args := range [][]string{
		{"init", "-q", "-b", "main", src},
		{"-C", src, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "--allow-empty", "-m", "first"},
		{"clone", "-q", "--bare", src, filepath.Join(f.files, "repo.git")},
		{"-C", filepath.Join(f.files, "repo.git"), "update-server-info"},
	} {
		if out, err := exec.Command("git", args...).CombinedOutput(); err != nil {
			t.Fatalf("git %v: %v\n%s", args, err, out)
		}
	}
	code, out := f.run(t, fmt.Sprintf("cd /tmp && git clone -q http://up.test:%d/repo.git clone && git -C clone log --format=%%s", f.port))
	if code != 0 || !strings.HasSuffix(out, "first\n") {
		t.Errorf("git clone: %d %q", code, out)
	}

	if code, out := f.run(t, "python3 -m pip --version"); code != 0 {
		t.Skipf("no pip in the machine: %s", out)
	}
	writeWheel(t, filepath.Join(f.files, "simple", "corraldemo"), "corraldemo-0.1-py3-none-any.whl")
	os.WriteFile(filepath.Join(f.files, "simple", "corraldemo", "index.html"),
		[]byte(`<html><body><a href="corraldemo-0.1-py3-none-any.whl">corraldemo-0.1-py3-none-any.whl</a></body></html>`), 0o644)
	code, out = f.run(t, fmt.Sprintf("cd /tmp && python3 -m pip download -q --trusted-host up.test --no-cache-dir --disable-pip-version-check --no-deps --index-url http://up.test:%d/simple/ -d dl corraldemo && ls dl", f.port))
	if code != 0 || !strings.Contains(out, "corraldemo-0.1-py3-none-any.whl") {
		t.Errorf("pip download: %d %q", code, out)
	}
}

// writeWheel writes a minimal wheel of package corraldemo.
func writeWheel(t *testing.T, dir, name string) {
	t.Helper()
	os.MkdirAll(dir, 0o755)
	out, err := os.Create(filepath.Join(dir, name))
	if err != nil {
		t.Fatal(err)
	}
	defer out.Close()
	z := zip.NewWriter(out)
	for _, e := range []struct{ name, body string }{
		{"corraldemo/__init__.py", "x = 1\n"},
		{"corraldemo-0.1.dist-info/METADATA", "Metadata-Version: 2.1\nName: corraldemo\nVersion: 0.1\n"},
		{"corraldemo-0.1.dist-info/WHEEL", "Wheel-Version: 1.0\nGenerator: corral-test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"},
		{"corraldemo-0.1.dist-info/RECORD", "corraldemo/__init__.py,,\ncorraldemo-0.1.dist-info/METADATA,,\ncorraldemo-0.1.dist-info/WHEEL,,\ncorraldemo-0.1.dist-info/RECORD,,\n"},
	} {
		w, _ := z.Create(e.name)
		io.WriteString(w, e.body)
	}
	if err := z.Close(); err != nil {
		t.Fatal(err)
	}
}

// recordingListener remembers the listeners Gateway.Listen returns.
type recordingListener struct {
	g   *machine.Gateway
	lns []net.Listener
}

func (r *recordingListener) Listen(ctx context.Context, p machine.Project, port int) (net.Listener, error) {
	ln, err := r.g.Listen(ctx, p, port)
	if err == nil {
		r.lns = append(r.lns, ln)
	}
	return ln, err
}

// TestMachineListenersClosed: the listeners Arm got are core's descriptors
// until Close, and none is left in this process after it (by socket
// inode), nor in the worker (the ports are free again in the machine).
func TestMachineListenersClosed(t *testing.T) {
	f := newMachineFixture(t, egress.Policy{Mode: egress.ModeProxy})
	f.m.Close()
	floor, _ := egress.NewFloor(nil, false)
	s, err := egress.NewService(egress.Options{Floor: floor})
	if err != nil {
		t.Fatal(err)
	}
	m, err := s.NewMachine(1, 1, egress.Policy{Mode: egress.ModeProxy})
	if err != nil {
		t.Fatal(err)
	}
	rec := &recordingListener{g: f.g}
	if err := m.Arm(ctxT(t), rec, f.project); err != nil {
		t.Fatal(err)
	}
	if len(rec.lns) != 2 {
		t.Fatalf("Arm made %d listeners", len(rec.lns))
	}
	var inodes []string
	for _, ln := range rec.lns {
		rc, err := ln.(*net.TCPListener).SyscallConn()
		if err != nil {
			t.Fatal(err)
		}
		rc.Control(func(fd uintptr) {
			l, err := os.Readlink(fmt.Sprintf("/proc/self/fd/%d", fd))
			if err != nil || !strings.HasPrefix(l, "socket:") {
				t.Fatalf("listener fd %d: %q, %v", fd, l, err)
			}
			inodes = append(inodes, l)
		})
	}
	// Distinct sockets: a descriptor the gateway received for one may still
	// be on its way to being closed (the listener holds its own dup).
	if held := socketsHeld(t, inodes); len(slices.Compact(slices.Sorted(slices.Values(held)))) != 2 {
		t.Fatalf("armed: %v held", held)
	}
	m.Close()
	deadline := time.Now().Add(5 * time.Second)
	for held := socketsHeld(t, inodes); len(held) != 0; held = socketsHeld(t, inodes) {
		if time.Now().After(deadline) {
			t.Fatalf("5 s after Close the process still holds %v", held)
		}
		time.Sleep(10 * time.Millisecond)
	}
	// The worker kept no copy: the ports are free in the machine.
	for _, port := range []int{egress.HTTPPort, egress.SOCKSPort} {
		ln, err := f.g.Listen(ctxT(t), f.project, port)
		if err != nil {
			t.Fatalf("port %d after Close: %v", port, err)
		}
		ln.Close()
	}
}

// socketsHeld returns which of the sockets ("socket:[inode]") some
// descriptor of this process still refers to.
func socketsHeld(t *testing.T, sockets []string) []string {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	var held []string
	for _, e := range ents {
		l, err := os.Readlink(filepath.Join("/proc/self/fd", e.Name()))
		if err == nil && slices.Contains(sockets, l) {
			held = append(held, l)
		}
	}
	return held
}

// TestMachineModeNone: a machine without proxies (mode none: core arms
// nothing) reaches nothing, with or without the proxy environment.
func TestMachineModeNone(t *testing.T) {
	f := newMachineFixture(t, egress.Policy{Mode: egress.ModeProxy, Allow: []string{"up.test"}})
	f.m.Close()
	code, out := f.run(t, fmt.Sprintf(`curl -sS --max-time 5 http://up.test:%d/; echo "curl=$?"
curl -sS --noproxy '*' --max-time 5 http://127.0.0.1:%d/; echo "curl=$?"
python3 -c '
import socket
for host in ("127.0.0.1", "1.1.1.1", "10.0.2.2"):
    try:
        socket.create_connection((host, %d), timeout=3)
        print("connected", host)
    except OSError as e:
        print("refused", host, e.errno)
'`, f.port, f.port, f.port))
	if code != 0 || strings.Contains(out, "curl=0") || strings.Contains(out, "connected") || strings.Count(out, "refused") != 3 {
		t.Errorf("mode none: %d %q", code, out)
	}
}
