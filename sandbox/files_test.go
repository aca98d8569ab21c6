package sandbox_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/corral-sandbox/corral/internal/testenv"
	"github.com/corral-sandbox/corral/sandbox"
	"github.com/corral-sandbox/corral/sandbox/sandboxtest"
)

// filesProvider prepares files calls over statFS, with a lease of kind
// kind (LeaseFiles unless set).
type filesProvider struct {
	sandboxtest.Provider
	kind  sandbox.LeaseKind
	lease *sandboxtest.Lease
	ctx   context.Context // the preparation's
}

func (p *filesProvider) PrepareFiles(ctx context.Context, in sandbox.FilesInput, actor sandbox.Actor) (*sandbox.PreparedFiles, error) {
	kind := p.kind
	if kind == "" {
		kind = sandbox.LeaseFiles
	}
	p.ctx = ctx
	p.lease = sandboxtest.NewLease("files-1", actor.AccountUserID, kind)
	return &sandbox.PreparedFiles{Project: in.Project, Lease: p.lease, FS: statFS{}}, nil
}

// statFS answers Stat with the context's state; nothing else.
type statFS struct{ sandbox.FileSystem }

func (statFS) Stat(ctx context.Context, p string) (sandbox.FileInfo, error) {
	return sandbox.FileInfo{Path: p}, ctx.Err()
}

var managedOne = sandbox.ProjectRef{Kind: sandbox.ProjectManaged, ProjectID: 1}

// TestOpenFiles: files go through the session's lifecycle — the actor
// rule, the provider's preparation, the target check, a heartbeated lease
// and one Close that journals the outcome and releases the lease, and
// reports a failed release.
func TestOpenFiles(t *testing.T) {
	ctx := context.Background()
	actor := &sandbox.Actor{AccountUserID: 7}
	in := sandbox.FilesInput{Project: managedOne}

	t.Run("no-provider-files", func(t *testing.T) {
		ctl := sandbox.NewControl(&sandboxtest.Provider{}, sandbox.ControlOptions{})
		if _, err := ctl.OpenFiles(ctx, in, actor); !errors.Is(err, sandbox.ErrUnavailable) {
			t.Fatalf("OpenFiles without files = %v, want ErrUnavailable", err)
		}
	})
	t.Run("no-actor", func(t *testing.T) {
		p := &filesProvider{}
		ctl := sandbox.NewControl(p, sandbox.ControlOptions{})
		if _, err := ctl.OpenFiles(ctx, in, nil); !errors.Is(err, sandbox.ErrNoActor) || p.lease != nil {
			t.Fatalf("OpenFiles with no actor = %v (lease %v), want ErrNoActor and no preparation", err, p.lease)
		}
		// The turn scope acts when no actor is named.
		f, err := ctl.OpenFiles(sandbox.WithTurn(ctx, sandbox.Actor{AccountUserID: 9}), in, nil)
		if err != nil {
			t.Fatal(err)
		}
		if p.lease.AccountUserID() != 9 {
			t.Errorf("lease of account %d, want the turn's 9", p.lease.AccountUserID())
		}
		if err := f.Close(nil); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("wrong-lease-kind", func(t *testing.T) {
		p := &filesProvider{kind: sandbox.LeaseEditor}
		ctl := sandbox.NewControl(p, sandbox.ControlOptions{})
		if _, err := ctl.OpenFiles(ctx, in, actor); err == nil {
			t.Fatal("OpenFiles accepted a lease of kind editor")
		}
		if !p.lease.Released() {
			t.Error("the refused preparation's lease was not released")
		}
	})
	t.Run("journaled", func(t *testing.T) {
		p := &filesProvider{}
		var started, released sandbox.Record
		var finished bool
		ctl := sandbox.NewControl(p, sandbox.ControlOptions{Domain: "sandbox", HeartbeatInterval: 5 * time.Millisecond,
			Journal: func(start sandbox.Record) *sandbox.JournalEntry {
				return &sandbox.JournalEntry{
					Intent: "intent",
					Start:  func(r sandbox.Record) { started = r },
					Release: func(ctx context.Context, l sandbox.Lease, r sandbox.Record) (bool, error) {
						released = r
						return true, l.Release(ctx)
					},
					Finish: func(sandbox.Record) { finished = true },
				}
			}})
		in := in
		in.Journal = []string{"files", "put", "/workspace/x"}
		f, err := ctl.OpenFiles(ctx, in, actor)
		if err != nil {
			t.Fatal(err)
		}
		if sandbox.JournalIntent(p.ctx) != "intent" {
			t.Error("the preparation did not carry the journal's intent (the start written with the lease)")
		}
		if started.LeaseID != "files-1" || started.Domain != "sandbox" || started.Input.LeaseKind != sandbox.LeaseFiles ||
			started.Input.Command.File != "files" || len(started.Input.Command.Args) != 2 {
			t.Errorf("journal start = %+v", started)
		}
		testenv.WaitFor(t, 5*time.Second, "two heartbeats", func() bool { return p.lease.Heartbeats.Load() >= 2 })
		if fi, err := f.Stat("/workspace/x"); err != nil || fi.Path != "/workspace/x" {
			t.Fatalf("Stat = %+v, %v", fi, err)
		}
		if err := f.Close(nil); err != nil {
			t.Fatal(err)
		}
		if !p.lease.Released() || released.Result == nil || released.Result.Code == nil || *released.Result.Code != 0 || finished {
			t.Errorf("Close: released %v, release record %+v, finish called %v", p.lease.Released(), released, finished)
		}
		if f.Context().Err() == nil {
			t.Error("the files' context outlived Close")
		}
		if err := f.Close(errors.New("later")); err != nil || p.lease.Releases.Load() != 1 {
			t.Errorf("a second Close = %v after %d releases, want nil and one release", err, p.lease.Releases.Load())
		}
	})
	t.Run("release-failed", func(t *testing.T) {
		p := &filesProvider{}
		var finished sandbox.Record
		ctl := sandbox.NewControl(p, sandbox.ControlOptions{Journal: func(sandbox.Record) *sandbox.JournalEntry {
			return &sandbox.JournalEntry{Finish: func(r sandbox.Record) { finished = r }}
		}})
		in := in
		in.Journal = []string{"files", "mkdir", "/workspace/d"}
		f, err := ctl.OpenFiles(ctx, in, actor)
		if err != nil {
			t.Fatal(err)
		}
		store := errors.New("store down")
		p.lease.ReleaseErr.Store(&store)
		if err := f.Close(nil); !errors.Is(err, store) {
			t.Fatalf("Close with a failing release = %v, want it reported", err)
		}
		if finished.Err == nil || finished.Err.Kind != sandbox.KindCleanup {
			t.Errorf("journal end %+v, want a cleanup failure", finished)
		}
	})
	t.Run("release-early", func(t *testing.T) {
		p := &filesProvider{}
		ctl := sandbox.NewControl(p, sandbox.ControlOptions{})
		f, err := ctl.OpenFiles(ctx, in, actor)
		if err != nil {
			t.Fatal(err)
		}
		if err := f.ReleaseLease(); err != nil || !p.lease.Released() {
			t.Fatalf("ReleaseLease = %v, released %v", err, p.lease.Released())
		}
		if _, err := f.Stat("/workspace"); err != nil {
			t.Errorf("a call after ReleaseLease: %v", err)
		}
		if err := f.Close(nil); err != nil || p.lease.Releases.Load() != 1 {
			t.Errorf("Close after ReleaseLease = %v, %d releases; want nil and one", err, p.lease.Releases.Load())
		}
	})
	t.Run("heartbeat-failed", func(t *testing.T) {
		p := &filesProvider{}
		ctl := sandbox.NewControl(p, sandbox.ControlOptions{HeartbeatInterval: 5 * time.Millisecond})
		f, err := ctl.OpenFiles(ctx, in, actor)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close(nil)
		lost := errors.New("lease expired")
		p.lease.HeartbeatErr.Store(&lost)
		select {
		case <-f.Context().Done():
		case <-time.After(10 * time.Second):
			t.Fatal("a lost lease did not end the files' context")
		}
		if cause := context.Cause(f.Context()); !errors.Is(cause, sandbox.ErrHeartbeat) || !errors.Is(cause, lost) {
			t.Errorf("cause %v, want ErrHeartbeat wrapping the heartbeat's error", cause)
		}
		if _, err := f.Stat("/workspace"); err == nil {
			t.Error("a call ran after the lease was lost")
		}
	})
}
