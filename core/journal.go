package core

import (
	"context"
	"errors"
	"time"

	"github.com/corral-sandbox/corral/internal/redact"
	"github.com/corral-sandbox/corral/lease"
	"github.com/corral-sandbox/corral/sandbox"
	"github.com/corral-sandbox/corral/store"
)

// journal writes every command's row: a start row once its preparation was
// accepted, and its outcome when it settled. Under a lease of package
// lease, the start row is written with the lease, in one store write
// (lease.JournalStart, which the provider passes on), and the outcome of a
// command that exited with the lease's release, in one write too
// (lease.Lease.ReleaseAndFinish).
func journal(st store.Store, logf func(msg string, args ...any)) func(sandbox.Record) *sandbox.JournalEntry {
	return func(start sandbox.Record) *sandbox.JournalEntry {
		js := &lease.JournalStart{Command: store.JournalCommand{
			Account:   start.Actor.AccountUserID,
			Project:   start.Input.Project.ProjectID,
			Domain:    start.Domain,
			LeaseKind: string(start.Input.LeaseKind),
			Argv:      redact.Argv(start.Input.Command.Argv()),
			Limits: store.Limits{
				TimeoutMS: start.Timeout.Milliseconds(),
				Stdout:    start.Limit.Stdout,
				Stderr:    start.Limit.Stderr,
				Combined:  start.Limit.Combined,
			},
		}}
		return &sandbox.JournalEntry{
			Intent: js,
			Start: func(rec sandbox.Record) {
				if js.ID != 0 {
					return // written with the lease
				}
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				defer cancel()
				cmd := js.Command
				cmd.Lease = rec.LeaseID
				id, err := st.JournalStart(ctx, cmd)
				if err != nil {
					logf("journal: start", "err", err, "lease", rec.LeaseID)
					return
				}
				js.ID = id
			},
			Finish: func(end sandbox.Record) {
				if js.ID == 0 {
					return // never started, or its start could not be written
				}
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				defer cancel()
				// An entry already marked interrupted (the worker connection
				// was lost, or the lease expired) keeps that outcome.
				if err := st.JournalFinish(ctx, js.ID, journalEnd(end)); err != nil && !errors.Is(err, store.ErrNotFound) {
					logf("journal: finish", "err", err, "lease", end.LeaseID)
				}
			},
			Release: func(ctx context.Context, l sandbox.Lease, end sandbox.Record) (bool, error) {
				ll, ok := l.(*lease.Lease)
				if !ok || js.ID == 0 {
					return false, l.Release(ctx)
				}
				return ll.ReleaseAndFinish(ctx, js.ID, journalEnd(end))
			},
		}
	}
}

// journalEnd is how the journal records a settled command.
func journalEnd(end sandbox.Record) store.JournalEnd {
	e := store.JournalEnd{StdoutBytes: end.StdoutBytes, StderrBytes: end.StderrBytes}
	switch {
	case end.Err != nil:
		e.Outcome, e.ErrorKind, e.Message = store.OutcomeError, string(end.Err.Kind), end.Err.Message
	case end.Result != nil && end.Result.Code != nil:
		e.Outcome, e.Code = store.OutcomeExit, end.Result.Code
	case end.Result != nil:
		e.Outcome, e.Signal, e.OOMKilled = store.OutcomeSignal, end.Result.Signal, end.Result.OOMKilled
	}
	return e
}
