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
// accepted, and its outcome when it settled. A command that exited under a
// lease of package lease has its outcome written with the lease's release,
// in one store write (lease.Lease.ReleaseAndFinish).
func journal(st *store.Store, logf func(msg string, args ...any)) func(sandbox.Record) *sandbox.JournalEntry {
	return func(start sandbox.Record) *sandbox.JournalEntry {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		id, err := st.JournalStart(ctx, store.JournalCommand{
			Account:   start.Actor.AccountUserID,
			Project:   start.Input.Project.ProjectID,
			Domain:    start.Domain,
			Lease:     start.LeaseID,
			LeaseKind: string(start.Input.LeaseKind),
			Argv:      redact.Argv(start.Input.Command.Argv()),
			Limits: store.Limits{
				TimeoutMS: start.Timeout.Milliseconds(),
				Stdout:    start.Limit.Stdout,
				Stderr:    start.Limit.Stderr,
				Combined:  start.Limit.Combined,
			},
		})
		if err != nil {
			logf("journal: start", "err", err, "lease", start.LeaseID)
			return nil
		}
		return &sandbox.JournalEntry{
			Finish: func(end sandbox.Record) {
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				defer cancel()
				// An entry already marked interrupted (the worker connection
				// was lost, or the lease expired) keeps that outcome.
				if err := st.JournalFinish(ctx, id, journalEnd(end)); err != nil && !errors.Is(err, store.ErrNotFound) {
					logf("journal: finish", "err", err, "lease", end.LeaseID)
				}
			},
			Release: func(ctx context.Context, l sandbox.Lease, end sandbox.Record) (bool, error) {
				ll, ok := l.(*lease.Lease)
				if !ok {
					return false, l.Release(ctx)
				}
				return ll.ReleaseAndFinish(ctx, id, journalEnd(end))
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
