package confine_test

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/corral-sandbox/corral/confine"
	"go.uber.org/goleak"
	"golang.org/x/sys/unix"
)

// probeEnv makes the test binary, run as a confined command, perform one
// filesystem operation and print its outcome instead of running tests.
const probeEnv = "CORRAL_CONFINE_PROBE"

func init() {
	// Keep the main thread to the main goroutine, so that Start's
	// confining goroutine never lands on it (the runtime wedges an exiting
	// locked main thread instead of ending it, which would hide a
	// parent-death signal bug).
	runtime.LockOSThread()
}

func TestMain(m *testing.M) {
	confine.MaybeRun()
	if p := os.Getenv(probeEnv); p != "" {
		os.Exit(probe(p))
	}
	goleak.VerifyTestMain(m, goleak.IgnoreTopFunction("github.com/corral-sandbox/corral/internal/pdeath.spawner"))
}

// probe performs "OP:PATH" and prints "ok", "ok:DATA" or "errno:NAME".
func probe(spec string) int {
	op, path, _ := strings.Cut(spec, ":")
	var err error
	var out string
	switch op {
	case "write":
		err = os.WriteFile(path, []byte("written"), 0o644)
	case "read":
		var b []byte
		b, err = os.ReadFile(path)
		out = string(b)
	case "truncate":
		err = os.Truncate(path, 0)
	case "mkdir":
		err = os.Mkdir(path, 0o755)
	case "remove":
		err = os.Remove(path)
	case "fds":
		var ents []os.DirEntry
		ents, err = os.ReadDir("/proc/self/fd")
		var names []string
		for _, e := range ents {
			l, _ := os.Readlink("/proc/self/fd/" + e.Name())
			names = append(names, e.Name()+"="+l)
		}
		out = strings.Join(names, ",")
	case "kill0":
		pid, _ := strconv.Atoi(path)
		err = syscall.Kill(pid, 0)
	case "connect":
		var c net.Conn
		if c, err = net.DialTimeout("tcp", path, 5*time.Second); err == nil {
			c.Close()
		}
	case "listen":
		var l net.Listener
		if l, err = net.Listen("tcp", path); err == nil {
			l.Close()
		}
	case "mptcp":
		var ap netip.AddrPort
		if ap, err = netip.ParseAddrPort(path); err != nil {
			break
		}
		var fd int
		if fd, err = unix.Socket(unix.AF_INET, unix.SOCK_STREAM, unix.IPPROTO_MPTCP); err != nil {
			break
		}
		err = unix.Connect(fd, &unix.SockaddrInet4{Port: int(ap.Port()), Addr: ap.Addr().As4()})
		unix.Close(fd)
	case "unix":
		var c net.Conn
		if c, err = net.Dial("unix", path); err == nil {
			c.Close()
		}
	default:
		fmt.Println("bad probe")
		return 2
	}
	var errno syscall.Errno
	switch {
	case err == nil && out != "":
		fmt.Println("ok:" + out)
	case err == nil:
		fmt.Println("ok")
	case errors.As(err, &errno):
		fmt.Println("errno:" + errno.Error())
	default:
		fmt.Println("error:", err)
	}
	return 0
}

func requireLandlock(t testing.TB) {
	t.Helper()
	if _, err := confine.Available(); err != nil {
		t.Skipf("the confinement helper cannot run here: %v", err)
	}
}

// outcome is what one helper launch did.
type outcome struct {
	status string // what the helper wrote on fd 3
	stdout string
	stderr string
	code   int
}

// launch runs argv through the helper, confined to writable, with the
// exec-status pipe core would give it as fd 3.
func launch(t *testing.T, writable []string, env []string, argv ...string) outcome {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	// The test binary, which probes run as the command, is outside the
	// system directories.
	path, args := confine.Command(self, confine.Policy{Writable: writable, Readable: []string{filepath.Dir(self)}}, argv)
	if path != self || args[0] != self || args[1] != confine.Arg {
		t.Fatalf("Command = %q %q", path, args)
	}
	statusR, statusW, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer statusR.Close()
	var stdout, stderr bytes.Buffer
	cmd := &exec.Cmd{
		Path:       path,
		Args:       args,
		Env:        append([]string{"PATH=/usr/local/bin:/usr/bin:/bin"}, env...),
		Stdout:     &stdout,
		Stderr:     &stderr,
		ExtraFiles: []*os.File{statusW},
	}
	if err := cmd.Start(); err != nil {
		statusW.Close()
		t.Fatal(err)
	}
	statusW.Close()
	status, err := io.ReadAll(statusR)
	if err != nil {
		t.Fatal(err)
	}
	err = cmd.Wait()
	var ee *exec.ExitError
	if err != nil && !errors.As(err, &ee) {
		t.Fatal(err)
	}
	return outcome{status: string(status), stdout: stdout.String(), stderr: stderr.String(), code: cmd.ProcessState.ExitCode()}
}

// probeOutside runs the test binary as the confined command, performing op.
func runProbe(t *testing.T, writable []string, op, path string) string {
	t.Helper()
	self, _ := os.Executable()
	o := launch(t, writable, []string{probeEnv + "=" + op + ":" + path}, self)
	if o.status != "" || o.code != 0 {
		t.Fatalf("probe %s %s: status %q code %d stderr %q", op, path, o.status, o.code, o.stderr)
	}
	return strings.TrimSpace(o.stdout)
}

func TestAvailable(t *testing.T) {
	abi, err := confine.Available()
	if err != nil {
		if !errors.Is(err, confine.ErrUnavailable) {
			t.Fatalf("Available error %v does not match ErrUnavailable", err)
		}
		t.Skipf("no landlock here: %v", err)
	}
	if abi < confine.MinABI {
		t.Fatalf("Available = %d without error, below MinABI %d", abi, confine.MinABI)
	}
}

func TestCommand(t *testing.T) {
	path, args := confine.Command("/usr/bin/corral", confine.Policy{Writable: []string{"/a", "/b c"}}, []string{"sh", "-c", "-w"})
	want := []string{"/usr/bin/corral", confine.Arg, "-w", "/a", "-w", "/b c", "--", "sh", "-c", "-w"}
	if path != "/usr/bin/corral" || strings.Join(args, "|") != strings.Join(want, "|") {
		t.Fatalf("Command = %q %q, want %q", path, args, want)
	}
	path, args = confine.Command("/usr/bin/corral", confine.Policy{Writable: []string{"/a"}, Readable: []string{"/r"}, Network: true,
		User: &confine.User{UID: 7, GID: 8}, Init: "/usr/bin/corral"}, []string{"true"})
	want = []string{"/usr/bin/corral", confine.Arg, "-w", "/a", "-r", "/r", "-n", "-u", "7:8", "-i", "/usr/bin/corral", "--", "true"}
	if path != "/usr/bin/corral" || strings.Join(args, "|") != strings.Join(want, "|") {
		t.Fatalf("Command = %q %q, want %q", path, args, want)
	}
}

func TestConfinement(t *testing.T) {
	requireLandlock(t)
	root := t.TempDir()
	other := t.TempDir() // not a writable root
	if err := os.WriteFile(filepath.Join(other, "existing"), []byte("outside data"), 0o644); err != nil {
		t.Fatal(err)
	}
	roots := []string{root}
	tmpName := fmt.Sprintf("/tmp/corral-confine-%d", os.Getpid())
	t.Cleanup(func() { os.Remove(tmpName) })

	tests := []struct {
		name, op, path, want string
		exists               string // a file that must (not) exist afterwards
		mustExist            bool
	}{
		{"WriteInRoot", "write", filepath.Join(root, "f"), "ok", filepath.Join(root, "f"), true},
		{"MkdirInRoot", "mkdir", filepath.Join(root, "d"), "ok", filepath.Join(root, "d"), true},
		{"WriteOutside", "write", filepath.Join(other, "f"), "errno:permission denied", filepath.Join(other, "f"), false},
		{"WriteTmp", "write", tmpName, "errno:permission denied", tmpName, false},
		{"MkdirOutside", "mkdir", filepath.Join(other, "d"), "errno:permission denied", filepath.Join(other, "d"), false},
		{"TruncateOutside", "truncate", filepath.Join(other, "existing"), "errno:permission denied", "", false},
		{"RemoveOutside", "remove", filepath.Join(other, "existing"), "errno:permission denied", filepath.Join(other, "existing"), true},
		{"ReadOutside", "read", filepath.Join(other, "existing"), "errno:permission denied", "", false},
		{"ReadSystem", "read", "/etc/hostname", "ok:" + hostname(t), "", false},
		{"WriteDevNull", "write", "/dev/null", "ok", "", false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := runProbe(t, roots, tc.op, tc.path); got != tc.want {
				t.Fatalf("%s %s = %q, want %q", tc.op, tc.path, got, tc.want)
			}
			if tc.exists == "" {
				return
			}
			_, err := os.Stat(tc.exists)
			if tc.mustExist && err != nil {
				t.Errorf("%s should exist: %v", tc.exists, err)
			}
			if !tc.mustExist && err == nil {
				t.Errorf("%s exists: the write was not refused", tc.exists)
			}
		})
	}
	if b, _ := os.ReadFile(filepath.Join(other, "existing")); string(b) != "outside data" {
		t.Errorf("outside file changed to %q", b)
	}
}

func hostname(t *testing.T) string {
	b, err := os.ReadFile("/etc/hostname")
	if err != nil {
		t.Skip(err)
	}
	return strings.TrimSpace(string(b))
}

func TestShellRedirections(t *testing.T) {
	requireLandlock(t)
	root := t.TempDir()
	other := t.TempDir()
	o := launch(t, []string{root}, nil, "sh", "-c",
		"echo in > "+root+"/f && echo quiet 2>/dev/null >/dev/null && echo out > "+other+"/f")
	if o.status != "" {
		t.Fatalf("status %q", o.status)
	}
	if o.code == 0 || !strings.Contains(o.stderr, "Permission denied") {
		t.Fatalf("write outside through sh: code %d stderr %q, want a permission error", o.code, o.stderr)
	}
	if b, err := os.ReadFile(filepath.Join(root, "f")); err != nil || string(b) != "in\n" {
		t.Fatalf("file in root = %q, %v", b, err)
	}
	if _, err := os.Stat(filepath.Join(other, "f")); err == nil {
		t.Fatal("file outside the root was created")
	}
}

func TestMissingProgramReportsOnStatusFD(t *testing.T) {
	requireLandlock(t)
	for _, prog := range []string{"/nonexistent/corral-no-such-program", "corral-no-such-program-in-path"} {
		t.Run(prog, func(t *testing.T) {
			o := launch(t, []string{t.TempDir()}, nil, prog, "arg")
			if o.code != confine.ExitFailure {
				t.Errorf("exit code %d, want %d", o.code, confine.ExitFailure)
			}
			if !strings.Contains(o.status, prog) || !strings.HasSuffix(o.status, "\n") || strings.Count(o.status, "\n") != 1 {
				t.Errorf("status message %q, want one line naming %s", o.status, prog)
			}
			if o.stdout != "" || o.stderr != "" {
				t.Errorf("the helper wrote stdout %q stderr %q", o.stdout, o.stderr)
			}
		})
	}
}

func TestBadRootIsRefused(t *testing.T) {
	requireLandlock(t)
	missing := filepath.Join(t.TempDir(), "missing")
	for name, root := range map[string]string{"Missing": missing, "Relative": "relative/dir"} {
		t.Run(name, func(t *testing.T) {
			marker := filepath.Join(t.TempDir(), "ran")
			o := launch(t, []string{root}, nil, "touch", marker)
			if o.code != confine.ExitFailure || o.status == "" {
				t.Fatalf("code %d status %q, want a refusal", o.code, o.status)
			}
			if _, err := os.Stat(marker); err == nil {
				t.Fatal("the command ran")
			}
		})
	}
}

func TestStatusFDClosesOnExec(t *testing.T) {
	requireLandlock(t)
	// The command inherits no descriptor but 0-2: not the status pipe, and
	// not what this test process inherited without close-on-exec. (The
	// Go runtime of the probe opens cgroup files of its own; they are
	// neither pipes nor devices.)
	self, _ := os.Executable()
	extra, err := os.Open("/dev/null") // an inheritable descriptor in the parent
	if err != nil {
		t.Fatal(err)
	}
	defer extra.Close()
	if _, err := unix.FcntlInt(extra.Fd(), unix.F_SETFD, 0); err != nil {
		t.Fatal(err)
	}
	o := launch(t, []string{t.TempDir()}, []string{probeEnv + "=fds:"}, self)
	if o.status != "" || o.code != 0 {
		t.Fatalf("status %q code %d stderr %q", o.status, o.code, o.stderr)
	}
	for _, fd := range strings.Split(strings.TrimPrefix(strings.TrimSpace(o.stdout), "ok:"), ",") {
		num, target, _ := strings.Cut(fd, "=")
		if num != "0" && num != "1" && num != "2" && (strings.HasPrefix(target, "pipe:") || strings.HasPrefix(target, "/dev/")) {
			t.Errorf("the command inherited descriptor %s -> %s", num, target)
		}
	}

	// The status pipe reaches EOF as soon as exec succeeds, while the
	// command is still running.
	path, args := confine.Command(self, confine.Policy{Writable: []string{t.TempDir()}}, []string{"cat"})
	statusR, statusW, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer statusR.Close()
	cmd := &exec.Cmd{Path: path, Args: args, Env: []string{"PATH=/usr/bin:/bin"}, ExtraFiles: []*os.File{statusW}}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	statusW.Close()
	status, err := io.ReadAll(statusR)
	if err != nil || len(status) != 0 {
		t.Errorf("status = %q, %v; want EOF", status, err)
	}
	if err := cmd.Process.Signal(syscall.Signal(0)); err != nil {
		t.Errorf("the command is not running after exec: %v", err)
	}
	stdin.Close()
	if err := cmd.Wait(); err != nil {
		t.Fatalf("cat: %v", err)
	}
}

func TestNotHelper(t *testing.T) {
	// MaybeRun returns at once in a process that is not the helper (this
	// one); reaching the next line is the assertion.
	confine.MaybeRun()
}

// startProbe runs the test binary through Start, performing op.
func startProbe(t *testing.T, writable []string, sys *syscall.SysProcAttr, op, path string) string {
	t.Helper()
	self, _ := os.Executable()
	var stdout, stderr bytes.Buffer
	cmd := &exec.Cmd{Path: self, Args: []string{self}, Env: []string{probeEnv + "=" + op + ":" + path},
		Stdout: &stdout, Stderr: &stderr, SysProcAttr: sys}
	if _, err := confine.Start(cmd, confine.Policy{Writable: writable, Readable: []string{filepath.Dir(self)}}); err != nil {
		t.Fatalf("Start: %v", err)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("probe %s %s: %v, stderr %q", op, path, err, stderr.String())
	}
	return strings.TrimSpace(stdout.String())
}

func TestStart(t *testing.T) {
	requireLandlock(t)
	root := t.TempDir()
	other := t.TempDir()
	must(t, os.WriteFile(filepath.Join(other, "existing"), []byte("outside data"), 0o644))
	tmpName := fmt.Sprintf("/tmp/corral-confine-start-%d", os.Getpid())
	t.Cleanup(func() { os.Remove(tmpName) })

	for _, tc := range []struct{ name, op, path, want string }{
		{"WriteInRoot", "write", filepath.Join(root, "f"), "ok"},
		{"WriteOutside", "write", filepath.Join(other, "f"), "errno:permission denied"},
		{"WriteTmp", "write", tmpName, "errno:permission denied"},
		{"TruncateOutside", "truncate", filepath.Join(other, "existing"), "errno:permission denied"},
		{"ReadOutside", "read", filepath.Join(other, "existing"), "errno:permission denied"},
		{"WriteDevNull", "write", "/dev/null", "ok"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := startProbe(t, []string{root}, nil, tc.op, tc.path); got != tc.want {
				t.Fatalf("%s %s = %q, want %q", tc.op, tc.path, got, tc.want)
			}
		})
	}
	if _, err := os.Stat(tmpName); err == nil {
		t.Fatalf("%s was created by a confined command", tmpName)
	}

	t.Run("CallerStaysUnconfined", func(t *testing.T) {
		// Start again, then write outside the roots from this process,
		// from several goroutines (so from several threads).
		startProbe(t, []string{root}, nil, "write", filepath.Join(root, "g"))
		errs := make(chan error, 8)
		for i := range 8 {
			go func() { errs <- os.WriteFile(filepath.Join(other, fmt.Sprintf("parent-%d", i)), nil, 0o644) }()
		}
		for range 8 {
			if err := <-errs; err != nil {
				t.Fatalf("the calling process was confined: %v", err)
			}
		}
	})

	t.Run("PdeathsigOutlivesTheThread", func(t *testing.T) {
		var out bytes.Buffer
		cmd := exec.Command("sh", "-c", "sleep 0.3; echo alive")
		cmd.Stdout = &out
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
		if _, err := confine.Start(cmd, confine.Policy{Writable: []string{root}}); err != nil {
			t.Fatal(err)
		}
		if err := cmd.Wait(); err != nil || out.String() != "alive\n" {
			t.Fatalf("command with Pdeathsig: %v, output %q (killed when the confining thread ended?)", err, out.String())
		}
	})

	t.Run("MissingProgram", func(t *testing.T) {
		cmd := &exec.Cmd{Path: "/nonexistent/corral-no-such-program", Args: []string{"x"}}
		_, err := confine.Start(cmd, confine.Policy{Writable: []string{root}})
		if !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("Start of a missing program: %v, want ErrNotExist", err)
		}
	})

	t.Run("MissingRoot", func(t *testing.T) {
		marker := filepath.Join(root, "ran")
		cmd := exec.Command("touch", marker)
		if _, err := confine.Start(cmd, confine.Policy{Writable: []string{filepath.Join(other, "missing")}}); err == nil {
			cmd.Wait()
			t.Fatal("Start with a missing root succeeded")
		}
		if cmd.Process != nil {
			t.Fatal("a process was started")
		}
	})
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
