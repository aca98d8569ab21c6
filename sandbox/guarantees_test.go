package sandbox_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/corral-sandbox/corral/sandbox"
	"github.com/corral-sandbox/corral/sandbox/sandboxtest"
)

// The seed's guarantees that only reading held: each test here fails when
// the guarantee is broken (the mutation it names).

// TestOnStartFailureRunsNothing: OnStart runs immediately before the
// command starts, and its error means the command never ran — its touch
// created nothing. (Fails with OnStart moved after the start.)
func TestOnStartFailureRunsNothing(t *testing.T) {
	for _, kind := range []sandbox.ProjectKind{sandbox.ProjectHost, sandbox.ProjectManaged} {
		t.Run(string(kind), func(t *testing.T) {
			p := &sandboxtest.Provider{}
			ctl := sandbox.NewControl(p, sandbox.ControlOptions{})
			mark := filepath.Join(t.TempDir(), "ran")
			refused := errors.New("not now")
			_, err := ctl.RunCommand(context.Background(), input(kind, "touch", mark), &actor,
				&sandbox.RunOptions{OnStart: func(sandbox.StartInfo) error { return refused }})
			if sandbox.KindOf(err) != sandbox.KindStart || !errors.Is(err, refused) {
				t.Fatalf("err = %v, want a start error wrapping OnStart's", err)
			}
			if _, err := os.Stat(mark); !errors.Is(err, os.ErrNotExist) {
				t.Fatalf("the command ran although OnStart failed (stat: %v)", err)
			}
			if l := p.LastLease(); !l.Released() {
				t.Error("lease not released")
			}
		})
	}
}

// TestExplicitActorWinsOverTurn: a command given both an explicit actor
// and a turn scope acts as the explicit actor. (Fails when the turn scope
// wins.)
func TestExplicitActorWinsOverTurn(t *testing.T) {
	p := &sandboxtest.Provider{}
	ctl := sandbox.NewControl(p, sandbox.ControlOptions{})
	ctx := sandbox.WithTurn(context.Background(), sandbox.Actor{AccountUserID: 99})
	explicit := sandbox.Actor{AccountUserID: 7}
	if _, err := ctl.RunCommand(ctx, input(sandbox.ProjectHost, "true"), &explicit, nil); err != nil {
		t.Fatal(err)
	}
	if got := p.LastLease().AccountUserID(); got != 7 {
		t.Errorf("command ran as account %d, want the explicit actor 7 (the turn's is 99)", got)
	}
	// Without an explicit actor the turn acts.
	if _, err := ctl.RunCommand(ctx, input(sandbox.ProjectHost, "true"), nil, nil); err != nil {
		t.Fatal(err)
	}
	if got := p.LastLease().AccountUserID(); got != 99 {
		t.Errorf("command ran as account %d, want the turn's 99", got)
	}
}

// TestUnstartedCleanupFailuresReported: a command that never started
// (OnStart refused it) still cancels its preparation and releases its
// lease, and a failure of either is the error's Cleanup, not dropped.
// (Fails when failUnstarted drops the release's or the cancel's error.)
func TestUnstartedCleanupFailuresReported(t *testing.T) {
	releaseErr := errors.New("lease store down")
	cancelErr := errors.New("worker gone")
	p := &sandboxtest.Provider{Mutate: func(prep sandbox.Prepared) {
		prep.(*sandbox.ManagedPrepared).Cancel = func(context.Context) error { return cancelErr }
	}, OnLease: func(l *sandboxtest.Lease) { l.ReleaseErr.Store(&releaseErr) }}
	ctl := sandbox.NewControl(p, sandbox.ControlOptions{})
	_, err := ctl.RunCommand(context.Background(), input(sandbox.ProjectManaged, "true"), &actor,
		&sandbox.RunOptions{OnStart: func(sandbox.StartInfo) error { return errors.New("no") }})
	var ce *sandbox.CommandError
	if !errors.As(err, &ce) || ce.Kind != sandbox.KindStart {
		t.Fatalf("err = %v, want a start error", err)
	}
	if !errors.Is(ce.Cleanup, releaseErr) {
		t.Errorf("Cleanup = %v, want the failed release", ce.Cleanup)
	}
	if !errors.Is(ce.Cleanup, cancelErr) {
		t.Errorf("Cleanup = %v, want the failed cancel", ce.Cleanup)
	}
}
