package sandbox_test

import (
	"context"
	"errors"
	"testing"

	"github.com/corral-sandbox/corral/sandbox"
	"github.com/corral-sandbox/corral/sandbox/sandboxtest"
)

// TestJournalRelease: a command that exits has its lease released through
// the journal's Release, which records the end with the release (Finish is
// then not called); a Release that did not journal leaves the end to
// Finish; a failed Release is a KindCleanup error that Finish records. A
// command that fails otherwise is released as usual and Finish records it.
func TestJournalRelease(t *testing.T) {
	type call struct {
		release, finish bool
		rec             sandbox.Record
	}
	for _, tc := range []struct {
		name      string
		argv      []string
		journaled bool
		err       error
		opts      *sandbox.RunOptions
		want      call
		kind      sandbox.ErrorKind // of the finished record, "" for a result
	}{
		{name: "journaled", argv: []string{"sh", "-c", "echo hi; exit 3"}, journaled: true, want: call{release: true}},
		{name: "not-journaled", argv: []string{"true"}, want: call{release: true, finish: true}},
		{name: "release-failed", argv: []string{"true"}, err: errors.New("store down"), want: call{release: true, finish: true}, kind: sandbox.KindCleanup},
		{name: "timeout", argv: []string{"sleep", "10"}, opts: &sandbox.RunOptions{Timeout: 50e6}, want: call{finish: true}, kind: sandbox.KindTimeout},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := &sandboxtest.Provider{}
			var got call
			ctl := sandbox.NewControl(p, sandbox.ControlOptions{Journal: func(sandbox.Record) *sandbox.JournalEntry {
				return &sandbox.JournalEntry{
					Release: func(ctx context.Context, l sandbox.Lease, rec sandbox.Record) (bool, error) {
						got.release, got.rec = true, rec
						if tc.err != nil {
							return false, tc.err
						}
						return tc.journaled, l.Release(ctx)
					},
					Finish: func(rec sandbox.Record) { got.finish, got.rec = true, rec },
				}
			}})
			res, err := ctl.RunCommand(context.Background(), input(sandbox.ProjectHost, tc.argv...), &actor, tc.opts)
			if got.release != tc.want.release || got.finish != tc.want.finish {
				t.Fatalf("release %v finish %v, want %v %v", got.release, got.finish, tc.want.release, tc.want.finish)
			}
			if tc.kind != "" {
				if sandbox.KindOf(err) != tc.kind || got.rec.Err == nil || got.rec.Err.Kind != tc.kind {
					t.Fatalf("error %v, record %+v; want %s", err, got.rec.Err, tc.kind)
				}
				if tc.err != nil && !errors.Is(err, tc.err) {
					t.Fatalf("error %v does not wrap the release's", err)
				}
			} else {
				if err != nil || got.rec.Result == nil || got.rec.Err != nil {
					t.Fatalf("result %+v, %v; record %+v", res, err, got.rec)
				}
				if tc.journaled && (*got.rec.Result.Code != 3 || got.rec.StdoutBytes != 3 || *res.Code != 3 || res.Stdout != "hi\n") {
					t.Fatalf("journaled record %+v (code %d, %d bytes), result %+v", got.rec.Result, *got.rec.Result.Code, got.rec.StdoutBytes, res)
				}
			}
			if l := p.LastLease(); l.Releases.Load() != 1 && tc.err == nil {
				t.Fatalf("lease released %d times", l.Releases.Load())
			}
		})
	}
}
