package sandbox_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/corral-sandbox/corral/sandbox"
	"github.com/corral-sandbox/corral/sandbox/sandboxtest"
)

func TestLimiterBudgets(t *testing.T) {
	l := sandbox.NewLimiter(sandbox.Budget{CapturedBytes: 300, Commands: 3, Sessions: 1}, sandbox.Budget{CapturedBytes: 200})
	cmd := func(acct, n int64) sandbox.Admission {
		return sandbox.Admission{Kind: sandbox.AdmitCommand, Account: acct, Bytes: n}
	}
	r1, err := l.Admit(context.Background(), cmd(1, 150))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.Admit(context.Background(), cmd(1, 100)); !errors.Is(err, sandbox.ErrBusy) {
		t.Fatalf("account over its bytes: %v", err)
	}
	r2, err := l.Admit(context.Background(), cmd(2, 150))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.Admit(context.Background(), cmd(3, 1)); !errors.Is(err, sandbox.ErrBusy) {
		t.Fatalf("global over its bytes: %v", err)
	}
	if _, err := l.Admit(context.Background(), cmd(3, 400)); !errors.Is(err, sandbox.ErrBusy) {
		t.Fatalf("a command larger than the budget: %v", err)
	}
	s1, err := l.Admit(context.Background(), sandbox.Admission{Kind: sandbox.AdmitSession, Account: 3})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.Admit(context.Background(), sandbox.Admission{Kind: sandbox.AdmitSession, Account: 4}); !errors.Is(err, sandbox.ErrBusy) {
		t.Fatalf("sessions over budget: %v", err)
	}
	r1()
	r1() // idempotent
	if g, _ := l.Usage(1); g.CapturedBytes != 150 || g.Commands != 1 || g.Sessions != 1 {
		t.Fatalf("usage after one release: %+v", g)
	}
	r2()
	s1()
	if g, a := l.Usage(2); g != (sandbox.Usage{}) || a != (sandbox.Usage{}) {
		t.Fatalf("usage after every release: %+v %+v", g, a)
	}
}

// TestRunCommandBusy: over budget, RunCommand refuses before preparing
// with a prepare error wrapping ErrBusy; the reservation is given back when
// RunCommand returns, and a session's when its lease is released.
func TestRunCommandBusy(t *testing.T) {
	dir := t.TempDir()
	p := &sandboxtest.Provider{Kind: sandbox.ProjectHost, Dir: dir}
	lim := sandbox.NewLimiter(sandbox.Budget{Commands: 1, Sessions: 1}, sandbox.Budget{})
	ctl := sandbox.NewControl(p, sandbox.ControlOptions{Admitter: lim})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	started := make(chan struct{})
	go func() {
		_, err := ctl.RunCommand(ctx, input(sandbox.ProjectHost, "sleep", "30"), &actor, &sandbox.RunOptions{
			Timeout: time.Minute,
			OnStart: func(sandbox.StartInfo) error { close(started); return nil },
		})
		done <- err
	}()
	<-started
	calls := p.Calls()
	_, err := ctl.RunCommand(context.Background(), input(sandbox.ProjectHost, "true"), &actor, nil)
	if sandbox.KindOf(err) != sandbox.KindPrepare || !errors.Is(err, sandbox.ErrBusy) {
		t.Fatalf("second command: %v", err)
	}
	if p.Calls() != calls {
		t.Fatal("a refused command reached the provider")
	}
	cancel()
	<-done
	if _, err := ctl.RunCommand(context.Background(), input(sandbox.ProjectHost, "true"), &actor, nil); err != nil {
		t.Fatalf("after the first settled: %v", err)
	}

	// A ticket reserved by the caller covers one RunCommand and stays
	// reserved until the caller releases it.
	tk, err := ctl.Admit(context.Background(), sandbox.Admission{Kind: sandbox.AdmitCommand, Account: actor.AccountUserID, Bytes: 2 << 20})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ctl.RunCommand(sandbox.WithTicket(context.Background(), tk), input(sandbox.ProjectHost, "true"), &actor, nil); err != nil {
		t.Fatalf("with a ticket: %v", err)
	}
	if _, err := ctl.RunCommand(sandbox.WithTicket(context.Background(), tk), input(sandbox.ProjectHost, "true"), &actor, nil); !errors.Is(err, sandbox.ErrBusy) {
		t.Fatalf("a spent ticket, still held: %v", err)
	}
	tk.Release()

	prep, err := ctl.PrepareExecution(context.Background(), input(sandbox.ProjectHost, "true"), &actor)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ctl.PrepareExecution(context.Background(), input(sandbox.ProjectHost, "true"), &actor); !errors.Is(err, sandbox.ErrBusy) {
		t.Fatalf("second session: %v", err)
	}
	if err := prep.Common().Lease.Release(context.Background()); err != nil {
		t.Fatal(err)
	}
	if lp, ok := prep.(*sandbox.LocalPrepared); ok && lp.Cancel != nil {
		_ = lp.Cancel(context.Background())
	}
	prep, err = ctl.PrepareExecution(context.Background(), input(sandbox.ProjectHost, "true"), &actor)
	if err != nil {
		t.Fatalf("after the lease was released: %v", err)
	}
	_ = prep.Common().Lease.Release(context.Background())
}
