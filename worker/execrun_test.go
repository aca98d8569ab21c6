package worker

import (
	"io"
	"os"
	"testing"

	"github.com/corral-sandbox/corral/wire"
)

// runPipes are the client's ends of an exec-run's three pipes; the far
// ends (in, out, err) are what the frame carries.
type runPipes struct {
	stdinW, outR, errR *os.File
	far                [3]*os.File
}

func newRunPipes(t *testing.T) *runPipes {
	t.Helper()
	inR, inW, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	outR, outW, _ := os.Pipe()
	errR, errW, _ := os.Pipe()
	p := &runPipes{stdinW: inW, outR: outR, errR: errR, far: [3]*os.File{inR, outW, errW}}
	t.Cleanup(func() {
		for _, f := range []*os.File{inW, outR, errR, inR, outW, errW} {
			f.Close()
		}
	})
	return p
}

// send sends m with the far ends and closes this side's copies of them.
func (p *runPipes) send(t *testing.T, c *wire.Conn, m *wire.ExecRun) {
	t.Helper()
	if err := c.Send(m, p.far[:]...); err != nil {
		t.Fatal(err)
	}
	for _, f := range p.far {
		f.Close()
	}
}

// TestExecRun: the worker announces exec-run; a session started by one
// exec-run frame answers exec-started with no exec-accepted before it, and
// runs with the frame's descriptors as its stdio. A refused exec-run is
// answered exec-rejected alone, with its descriptors closed by the worker;
// a program that cannot run is accepted and ends notStarted. The old
// sequence (exec-start, exec-attach) works on the same connection.
func TestExecRun(t *testing.T) {
	h := newHarness(t, nil)
	c, err := wire.Dial(t.Context(), h.sock)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	hello, err := wire.ClientHello(c)
	if err != nil {
		t.Fatal(err)
	}
	if !hello.Has(wire.FeatureExecRun) {
		t.Fatalf("hello %+v does not announce %q", hello, wire.FeatureExecRun)
	}
	proj := h.project(t, 1)

	p := newRunPipes(t)
	p.send(t, c, &wire.ExecRun{ID: "r1", Project: proj, Cwd: "/workspace",
		Argv: []string{"sh", "-c", "read x; echo out:$x; echo err >&2; exit 3"}})
	if m, ok := recv(t, c).(*wire.ExecStarted); !ok || m.ID != "r1" {
		t.Fatalf("first frame %#v, want exec-started r1", m)
	}
	io.WriteString(p.stdinW, "in\n")
	p.stdinW.Close()
	out, _ := io.ReadAll(p.outR)
	errOut, _ := io.ReadAll(p.errR)
	if m, ok := recv(t, c).(*wire.ExecExit); !ok || m.ID != "r1" || m.Code == nil || *m.Code != 3 {
		t.Fatalf("got %#v, want exec-exit r1 code 3", m)
	}
	if string(out) != "out:in\n" || string(errOut) != "err\n" {
		t.Errorf("stdout %q, stderr %q", out, errOut)
	}

	p = newRunPipes(t)
	p.send(t, c, &wire.ExecRun{ID: "r2", Project: proj, Cwd: "/etc", Argv: []string{"true"}})
	if m, ok := recv(t, c).(*wire.ExecRejected); !ok || m.ID != "r2" || m.Code != wire.CodeBadCwd {
		t.Fatalf("got %#v, want exec-rejected r2 bad-cwd", m)
	}
	// The worker kept no copy of the descriptors: the pipes read EOF.
	if b, err := io.ReadAll(p.outR); err != nil || len(b) != 0 {
		t.Errorf("stdout of a refused exec-run: %q, %v", b, err)
	}
	if err := c.Send(&wire.Ping{ID: "after-r2"}); err != nil {
		t.Fatal(err)
	}
	if m, ok := recv(t, c).(*wire.Pong); !ok || m.ID != "after-r2" {
		t.Fatalf("got %#v after a refusal, want only the pong", m)
	}

	p = newRunPipes(t)
	p.send(t, c, &wire.ExecRun{ID: "r3", Project: proj, Cwd: "/workspace", Argv: []string{"no-such-program-here"}})
	if m, ok := recv(t, c).(*wire.ExecExit); !ok || m.ID != "r3" || !m.NotStarted {
		t.Fatalf("got %#v, want exec-exit r3 notStarted", m)
	}

	if r := h.run(t, c, proj, "sh", "-c", "echo old"); r.code() != 0 || r.stdout != "old\n" {
		t.Errorf("exec-start and exec-attach after exec-run: %v", r)
	}
}
