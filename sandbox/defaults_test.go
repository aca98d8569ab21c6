package sandbox_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/corral-sandbox/corral/lease"
	"github.com/corral-sandbox/corral/sandbox"
	"github.com/corral-sandbox/corral/sandbox/sandboxtest"
)

// TestSeedDefaults pins the seed's defaults: changing one of these is a
// contract change, not a tweak. RunOptions{} applies them (the record a
// command leaves shows the values used).
func TestSeedDefaults(t *testing.T) {
	if sandbox.DefaultTimeout != 10*time.Second {
		t.Errorf("DefaultTimeout = %v, want 10s", sandbox.DefaultTimeout)
	}
	if sandbox.DefaultStreamLimit != 1<<20 {
		t.Errorf("DefaultStreamLimit = %d, want 1 MiB", sandbox.DefaultStreamLimit)
	}
	if sandbox.DefaultHeartbeatInterval != 5*time.Second {
		t.Errorf("DefaultHeartbeatInterval = %v, want 5s", sandbox.DefaultHeartbeatInterval)
	}
	if lease.DefaultTTL != 15*time.Second {
		t.Errorf("lease.DefaultTTL = %v, want 15s", lease.DefaultTTL)
	}
	var rec sandbox.Record
	ctl := sandbox.NewControl(&sandboxtest.Provider{}, sandbox.ControlOptions{Observe: func(r sandbox.Record) { rec = r }})
	if _, err := ctl.RunCommand(context.Background(), input(sandbox.ProjectHost, "true"), &actor, &sandbox.RunOptions{}); err != nil {
		t.Fatal(err)
	}
	if rec.Timeout != 10*time.Second || rec.Limit != (sandbox.OutputLimit{Stdout: 1 << 20, Stderr: 1 << 20}) {
		t.Errorf("applied defaults: timeout %v, limit %+v", rec.Timeout, rec.Limit)
	}

	// ControlOptions{} heartbeats every 5 s: the interval a command's
	// lease is kept alive at (the daemon passes zero and gets it).
	got := make(chan time.Duration, 1)
	p := &sandboxtest.Provider{Mutate: func(prep sandbox.Prepared) {
		prep.Common().Lease = intervalLease{prep.Common().Lease, got}
	}}
	if _, err := sandbox.NewControl(p, sandbox.ControlOptions{}).RunCommand(context.Background(), input(sandbox.ProjectHost, "true"), &actor, nil); err != nil {
		t.Fatal(err)
	}
	if d := <-got; d != 5*time.Second {
		t.Errorf("applied heartbeat interval = %v, want 5s", d)
	}
}

// intervalLease reports the interval it is kept alive at.
type intervalLease struct {
	sandbox.Lease
	got chan<- time.Duration
}

func (l intervalLease) KeepAlive(interval time.Duration, _ func(error)) func() {
	l.got <- interval
	return func() {}
}

// TestOnStartPanicReleasesLease: a panicking OnStart is a start failure
// carrying the panic value; the preparation is cancelled, the lease
// released once, and the heartbeat goroutine is gone (goleak, at the end
// of the package's tests).
func TestOnStartPanicReleasesLease(t *testing.T) {
	for _, kind := range []sandbox.ProjectKind{sandbox.ProjectHost, sandbox.ProjectManaged} {
		t.Run(string(kind), func(t *testing.T) {
			p := &sandboxtest.Provider{}
			ctl := sandbox.NewControl(p, sandbox.ControlOptions{HeartbeatInterval: 5 * time.Millisecond})
			_, err := ctl.RunCommand(context.Background(), input(kind, "true"), &actor,
				&sandbox.RunOptions{OnStart: func(sandbox.StartInfo) error { panic("kaboom 42") }})
			if sandbox.KindOf(err) != sandbox.KindStart || !strings.Contains(err.Error(), "kaboom 42") {
				t.Fatalf("err = %v (kind %q), want a start error with the panic value", err, sandbox.KindOf(err))
			}
			var pe *sandbox.OnStartPanic
			if !errors.As(err, &pe) || pe.Value != "kaboom 42" {
				t.Errorf("errors.As OnStartPanic: %v", err)
			}
			l := p.LastLease()
			if l.Releases.Load() != 1 || !l.Released() || p.Cancels() != 1 {
				t.Fatalf("releases %d, released %v, cancels %d", l.Releases.Load(), l.Released(), p.Cancels())
			}
		})
	}
}
