package machine_test

import (
	"bufio"
	"bytes"
	"io"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/corral-sandbox/corral/machine"
)

// ttyReq is in.req on a terminal of rows × cols.
func (in *integration) ttyReq(rows, cols uint16, argv ...string) machine.ExecRequest {
	r := in.req(argv...)
	r.TTY = &machine.TTY{Rows: rows, Cols: cols}
	return r
}

// expect reads from r until want appears (or fails the test after d).
func expect(t *testing.T, f *os.File, r io.Reader, want string, d time.Duration) string {
	t.Helper()
	_ = f.SetReadDeadline(time.Now().Add(d))
	defer f.SetReadDeadline(time.Time{})
	var got bytes.Buffer
	buf := make([]byte, 4096)
	for !strings.Contains(got.String(), want) {
		n, err := r.Read(buf)
		got.Write(buf[:n])
		if err != nil {
			t.Fatalf("waiting for %q: read %q, then %v", want, got.String(), err)
		}
	}
	return got.String()
}

// A terminal session runs on a pty of the machine's own devpts: the
// command sees a terminal on 0, 1 and 2 (its controlling one), the output
// of both streams arrives on the master, and the exit status is reported.
func TestRealWorkerTTY(t *testing.T) {
	in, _ := newIntegration(t)
	ctx := ctxT(t)
	s, err := in.g.Exec(ctx, in.ttyReq(24, 80, "sh", "-c",
		`tty; test -t 0 && test -t 1 && test -t 2 && echo all-tty; echo err >&2; ls /dev/pts/; exec 3</dev/tty && echo ctty; exit 5`))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if s.TTY == nil {
		t.Fatal("no master for a terminal session")
	}
	out, err := io.ReadAll(s.Stdout)
	if err != nil {
		t.Fatal(err)
	}
	exit, err := s.Wait()
	if err != nil || exit.Code == nil || *exit.Code != 5 {
		t.Fatalf("Wait = %+v, %v; want code 5", exit, err)
	}
	lines := strings.Split(strings.ReplaceAll(string(out), "\r\n", "\n"), "\n")
	if len(lines) < 5 || !strings.HasPrefix(lines[0], "/dev/pts/") || lines[1] != "all-tty" || lines[2] != "err" {
		t.Fatalf("output %q: want /dev/pts/N, all-tty, err", out)
	}
	if n := strings.TrimPrefix(lines[0], "/dev/pts/"); !strings.Contains(" "+lines[3]+" ", " "+n+" ") || lines[4] != "ctty" {
		t.Errorf("output %q: the pty is not the machine's /dev/pts/%s, or not the controlling terminal", out, n)
	}
	if rest, _ := io.ReadAll(s.Stderr); len(rest) != 0 {
		t.Errorf("stderr of a terminal session: %q", rest)
	}
}

// The terminal has its initial size, follows a resize (the shell's
// foreground job sees it), and input typed on the master reaches it.
func TestRealWorkerTTYResize(t *testing.T) {
	in, _ := newIntegration(t)
	ctx := ctxT(t)
	s, err := in.g.Exec(ctx, in.ttyReq(24, 80, "sh", "-c", `stty size; read x; stty size; read x; exit 0`))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	expect(t, s.TTY, s.Stdout, "24 80", 10*time.Second)
	if err := s.Resize(50, 132); err != nil {
		t.Fatal(err)
	}
	io.WriteString(s.Stdin, "go\n")
	expect(t, s.TTY, s.Stdout, "50 132", 10*time.Second)
	io.WriteString(s.Stdin, "go\n")
	if _, err := io.Copy(io.Discard, s.Stdout); err != nil {
		t.Fatal(err)
	}
	if exit, err := s.Wait(); err != nil || exit.Code == nil || *exit.Code != 0 {
		t.Fatalf("Wait = %+v, %v", exit, err)
	}
	var plain machine.Session
	if err := plain.Resize(1, 1); err == nil {
		t.Error("Resize of a session without a terminal succeeded")
	}
}

// An interactive shell on the terminal: job control works (no "can't
// access tty"), ^C interrupts the foreground job, exit passes its status.
func TestRealWorkerTTYShell(t *testing.T) {
	in, _ := newIntegration(t)
	ctx := ctxT(t)
	s, err := in.g.Exec(ctx, in.ttyReq(24, 80, "sh", "-i"))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	r := bufio.NewReader(s.Stdout)
	// The job prints once it runs in the terminal's foreground (the
	// shell's child sets it so before it execs): ^C is then its.
	io.WriteString(s.Stdin, "sh -c 'echo started; exec sleep 30'\n")
	got := expect(t, s.TTY, r, "started\r\n", 10*time.Second)
	io.WriteString(s.Stdin, "\x03")
	// ^C flushes the terminal's pending input: type on at the next prompt.
	got += expect(t, s.TTY, r, "$ ", 10*time.Second)
	io.WriteString(s.Stdin, "echo after-$?\n")
	got += expect(t, s.TTY, r, "after-130", 10*time.Second)
	if strings.Contains(got, "can't access tty") {
		t.Errorf("shell output %q", got)
	}
	io.WriteString(s.Stdin, "exit 3\n")
	io.Copy(io.Discard, r)
	if exit, err := s.Wait(); err != nil || exit.Code == nil || *exit.Code != 3 {
		t.Fatalf("Wait = %+v, %v; want code 3", exit, err)
	}
}

// BenchmarkTTYEcho measures a pseudo-terminal's echo round trip through the
// machine's pty: a byte written to the master comes back echoed by the
// line discipline (cat reads it in raw mode and the byte returns once more).
func BenchmarkTTYEcho(b *testing.B) {
	in, _ := newIntegration(b)
	ctx := b.Context()
	s, err := in.g.Exec(ctx, in.ttyReq(24, 80, "sh", "-c", "stty raw -echo; echo ready; exec cat"))
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	var got bytes.Buffer
	buf := make([]byte, 64)
	for !strings.Contains(got.String(), "ready") {
		n, err := s.Stdout.Read(buf)
		if err != nil {
			b.Fatal(err)
		}
		got.Write(buf[:n])
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, err := s.Stdin.Write([]byte{'x'}); err != nil {
			b.Fatal(err)
		}
		if _, err := io.ReadFull(s.Stdout, buf[:1]); err != nil || buf[0] != 'x' {
			b.Fatalf("echo %q, %v", buf[:1], err)
		}
	}
	b.StopTimer()
	_ = s.Cancel(ctx)
	s.Wait()
}

// Guest root cannot steer where the init allocates terminals: with the
// machine's /dev/ptmx replaced by a link to a file of its choosing, a
// terminal session still gets a pty of the machine's devpts.
func TestRealWorkerTTYPtmxReplaced(t *testing.T) {
	in, _ := newIntegration(t)
	ctx := ctxT(t)
	r := in.req("sh", "-c", "echo not-a-pty > /tmp/fake && rm -f /dev/ptmx && ln -s /tmp/fake /dev/ptmx && readlink /dev/ptmx")
	r.User = "root"
	s, err := in.g.Exec(ctx, r)
	if err != nil {
		t.Fatal(err)
	}
	out, _ := io.ReadAll(s.Stdout)
	s.Close()
	if exit, err := s.Wait(); err != nil || exit.Code == nil || *exit.Code != 0 || string(out) != "/tmp/fake\n" {
		t.Skipf("guest root could not replace /dev/ptmx (%q, %+v, %v): nothing to check", out, exit, err)
	}
	s, err = in.g.Exec(ctx, in.ttyReq(24, 80, "sh", "-c", "tty; stty size"))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	got, _ := io.ReadAll(s.Stdout)
	if exit, err := s.Wait(); err != nil || exit.Code == nil || *exit.Code != 0 ||
		!strings.HasPrefix(string(got), "/dev/pts/") || !strings.Contains(string(got), "24 80") {
		t.Fatalf("terminal session after /dev/ptmx was replaced: %q, %+v, %v", got, exit, err)
	}
}
