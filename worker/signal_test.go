package worker

import (
	"strings"
	"testing"
	"time"

	"github.com/corral-sandbox/corral/internal/testenv"
	"github.com/corral-sandbox/corral/wire"
)

// exec-signal reaches every process of the session's namespace: here one
// that left the session's process group and session (setsid), which a
// signal to the main process or its group would miss, while the main
// process ignores the signal and waits for it.
func TestExecSignalReachesTree(t *testing.T) {
	h := newHarness(t, nil)
	c := h.dial(t)
	p := h.project(t, 1)
	child := `trap "echo got-term >&2; exit 0" TERM; touch /tmp/ready; while :; do sleep 0.05; done`
	r := h.start(t, c, p, "sh", "-c", `setsid sh -c '`+child+`' & trap "" TERM; wait; echo main-done`)
	if !r.started {
		t.Fatalf("not started: %#v", r.first)
	}
	c2 := h.dial(t)
	testenv.WaitFor(t, 10*time.Second, "the child's trap", func() bool { return h.run(t, c2, p, "test", "-e", "/tmp/ready").code() == 0 })
	if err := c.Send(&wire.ExecSignal{ID: r.id, Signal: "SIGTERM"}); err != nil {
		t.Fatal(err)
	}
	res := r.wait(t)
	if res.code() != 0 || !strings.Contains(res.stderr, "got-term") || res.stdout != "main-done\n" {
		t.Fatalf("%v", res)
	}
	// An unknown session or signal name is ignored: the connection stays.
	for _, m := range []wire.Message{&wire.ExecSignal{ID: r.id, Signal: "SIGTERM"}, &wire.ExecSignal{ID: "nope", Signal: "SIGNOPE"}} {
		if err := c.Send(m); err != nil {
			t.Fatal(err)
		}
	}
	if res := h.run(t, c, p, "true"); res.code() != 0 {
		t.Fatalf("after ignored signals: %v", res)
	}
}
