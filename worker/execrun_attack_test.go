package worker

import (
	"encoding/json"
	"io"
	"os"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/corral-sandbox/corral/wire"
)

// Attacks on exec-run (an exec-start carrying its three descriptors in one
// frame) spoken on the wire directly, as a faulty or hostile client would.

// rawSend writes b as one packet carrying fds, bypassing wire.Conn.Send's
// checks (which refuse a wrong descriptor count before anything is sent).
func rawSend(t *testing.T, c *wire.Conn, b []byte, fds ...*os.File) {
	t.Helper()
	var oob []byte
	if len(fds) > 0 {
		n := make([]int, len(fds))
		for i, f := range fds {
			n[i] = int(f.Fd())
		}
		oob = unix.UnixRights(n...)
	}
	if _, _, err := c.UnixConn().WriteMsgUnix(b, oob, nil); err != nil {
		t.Fatal(err)
	}
}

// readsEOF reports whether r reads EOF (every write end closed) within a
// bound: the worker kept no copy of a descriptor it was given.
func readsEOF(t *testing.T, r *os.File) bool {
	t.Helper()
	_ = r.SetReadDeadline(time.Now().Add(20 * time.Second))
	b, err := io.ReadAll(r)
	return err == nil && len(b) == 0
}

// execRunFrame is the JSON of an exec-run whose "fds" member is declared.
func execRunFrame(t *testing.T, id string, proj wire.Project, argv []string, declared int) []byte {
	t.Helper()
	b, err := json.Marshal(map[string]any{"type": wire.TypeExecRun, "fds": declared, "id": id,
		"project": proj, "cwd": "/workspace", "argv": argv})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestExecRunWrongDescriptorCount: an exec-run with fewer or more than its
// three descriptors (declared honestly or not, in the fast codec's exact
// shape or not) is a protocol error: the worker answers an error frame,
// closes the connection, runs nothing, and keeps none of the descriptors.
func TestExecRunWrongDescriptorCount(t *testing.T) {
	h := newHarness(t, nil)
	proj := h.project(t, 1)
	marker := "/workspace/ran"
	argv := []string{"sh", "-c", "touch " + marker}
	canonical := func(t *testing.T) []byte {
		b, err := wire.Encode(&wire.ExecRun{ID: "x", Project: proj, Cwd: "/workspace", Argv: argv})
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	for _, tc := range []struct {
		name  string
		frame func(t *testing.T) []byte
		n     int
	}{
		{"fast-shape-2", canonical, 2},
		{"fast-shape-4", canonical, 4},
		{"fast-shape-0", canonical, 0},
		{"declared-2-carries-2", func(t *testing.T) []byte { return execRunFrame(t, "x", proj, argv, 2) }, 2},
		{"declared-4-carries-4", func(t *testing.T) []byte { return execRunFrame(t, "x", proj, argv, 4) }, 4},
		{"declared-3-carries-4", func(t *testing.T) []byte { return execRunFrame(t, "x", proj, argv, 3) }, 4},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := h.dial(t)
			var ours, far []*os.File
			for range tc.n {
				r, w, err := os.Pipe()
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { r.Close(); w.Close() })
				ours, far = append(ours, r), append(far, w)
			}
			rawSend(t, c, tc.frame(t), far...)
			for _, f := range far {
				f.Close()
			}
			m, files, err := c.Recv()
			for _, f := range files {
				f.Close()
			}
			if err != nil {
				t.Fatalf("recv: %v", err)
			}
			if e, ok := m.(*wire.Error); !ok || (e.Code != wire.CodeFDMismatch && e.Code != wire.CodeBadFrame) {
				t.Fatalf("got %#v, want a connection error frame", m)
			}
			_ = c.UnixConn().SetReadDeadline(time.Now().Add(20 * time.Second))
			if m, _, err := c.Recv(); err != io.EOF {
				t.Fatalf("after the error: %#v, %v; want the connection closed", m, err)
			}
			for i, r := range ours {
				if !readsEOF(t, r) {
					t.Errorf("descriptor %d of the refused frame is still open in the worker", i)
				}
			}
		})
	}
	if _, err := os.Stat(h.root + "/p1/ran"); err == nil {
		t.Fatal("a malformed exec-run ran its command")
	}
}

// TestExecRunReplay: an exec-run replaying the ID of a session still
// running on the connection is refused (duplicate-id) with its descriptors
// closed, runs nothing, and does not disturb the running session; an
// exec-attach replayed for a session started by exec-run is refused too,
// and its descriptors are not handed to the command.
func TestExecRunReplay(t *testing.T) {
	h := newHarness(t, nil)
	c := h.dial(t)
	proj := h.project(t, 1)

	first := newRunPipes(t)
	first.send(t, c, &wire.ExecRun{ID: "same", Project: proj, Cwd: "/workspace",
		Argv: []string{"sh", "-c", "read x; echo first:$x"}})
	if m, ok := recv(t, c).(*wire.ExecStarted); !ok || m.ID != "same" {
		t.Fatalf("got %#v, want exec-started", m)
	}

	replay := newRunPipes(t)
	replay.send(t, c, &wire.ExecRun{ID: "same", Project: proj, Cwd: "/workspace",
		Argv: []string{"sh", "-c", "echo replay; touch /workspace/replayed"}})
	if m, ok := recv(t, c).(*wire.ExecRejected); !ok || m.ID != "same" || m.Code != wire.CodeDuplicateID {
		t.Fatalf("replayed exec-run: got %#v, want exec-rejected duplicate-id", m)
	}
	if !readsEOF(t, replay.outR) {
		t.Error("the replayed exec-run's stdout is still open in the worker")
	}

	// An exec-attach for the same ID: the session is no longer pending.
	att := newRunPipes(t)
	if err := c.Send(&wire.ExecAttach{ID: "same"}, att.far[:]...); err != nil {
		t.Fatal(err)
	}
	for _, f := range att.far {
		f.Close()
	}
	if m, ok := recv(t, c).(*wire.Error); !ok || m.ID != "same" || m.Code != wire.CodeUnknownSession {
		t.Fatalf("exec-attach after exec-run: got %#v, want unknown-session", m)
	}
	if !readsEOF(t, att.outR) {
		t.Error("the replayed exec-attach's stdout is still open in the worker (handed to the command?)")
	}

	io.WriteString(first.stdinW, "in\n")
	first.stdinW.Close()
	out, _ := io.ReadAll(first.outR)
	if m, ok := recv(t, c).(*wire.ExecExit); !ok || m.ID != "same" || m.Code == nil || *m.Code != 0 {
		t.Fatalf("got %#v, want the first session's exit 0", m)
	}
	if string(out) != "first:in\n" {
		t.Errorf("first session's stdout %q", out)
	}
	if _, err := os.Stat(h.root + "/p1/replayed"); err == nil {
		t.Error("the replayed exec-run ran its command")
	}
}

// TestExecRunTTYClosesDescriptors: a terminal session started by exec-run
// does not give the command the frame's descriptors (its stdio is the
// pseudo-terminal's slave): they are closed, and the command's output
// reaches the terminal only.
func TestExecRunTTYClosesDescriptors(t *testing.T) {
	h := newHarness(t, nil)
	c := h.dial(t)
	proj := h.project(t, 1)
	p := newRunPipes(t)
	p.send(t, c, &wire.ExecRun{ID: "tty", Project: proj, Cwd: "/workspace", TTY: &wire.TTY{Rows: 24, Cols: 80},
		Argv: []string{"sh", "-c", "echo on-the-terminal; sleep 30"}})
	m, files, err := c.Recv()
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := m.(*wire.ExecTTY); !ok || len(files) != 1 {
		t.Fatalf("got %#v with %d files, want exec-tty and the master", m, len(files))
	}
	master := files[0]
	defer master.Close()
	if m, ok := recv(t, c).(*wire.ExecStarted); !ok || m.ID != "tty" {
		t.Fatalf("got %#v, want exec-started", m)
	}
	// While the command runs, the frame's descriptors are closed.
	if !readsEOF(t, p.outR) || !readsEOF(t, p.errR) {
		t.Error("a terminal exec-run kept the frame's stdout or stderr")
	}
	_ = master.SetReadDeadline(time.Now().Add(20 * time.Second))
	buf := make([]byte, 256)
	var got strings.Builder
	for !strings.Contains(got.String(), "on-the-terminal") {
		n, err := master.Read(buf)
		if err != nil {
			t.Fatalf("terminal output %q: %v", got.String(), err)
		}
		got.Write(buf[:n])
	}
	if err := c.Send(&wire.ExecCancel{ID: "tty"}); err != nil {
		t.Fatal(err)
	}
	if m, ok := recv(t, c).(*wire.ExecExit); !ok || m.ID != "tty" {
		t.Fatalf("got %#v, want exec-exit", m)
	}
}
