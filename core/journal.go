package core

import (
	"context"
	"errors"
	"time"

	"github.com/corral-sandbox/corral/internal/redact"
	"github.com/corral-sandbox/corral/sandbox"
	"github.com/corral-sandbox/corral/store"
)

// journal writes every command's row: a start row once its preparation was
// accepted, and its outcome when it settled.
func journal(st *store.Store, logf func(msg string, args ...any)) func(sandbox.Record) func(sandbox.Record) {
	return func(start sandbox.Record) func(sandbox.Record) {
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
		return func(end sandbox.Record) {
			e := store.JournalEnd{StdoutBytes: end.StdoutBytes, StderrBytes: end.StderrBytes}
			switch {
			case end.Err != nil:
				e.Outcome, e.ErrorKind, e.Message = store.OutcomeError, string(end.Err.Kind), end.Err.Message
			case end.Result != nil && end.Result.Code != nil:
				e.Outcome, e.Code = store.OutcomeExit, end.Result.Code
			case end.Result != nil:
				e.Outcome, e.Signal, e.OOMKilled = store.OutcomeSignal, end.Result.Signal, end.Result.OOMKilled
			}
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			// An entry already marked interrupted (the worker connection was
			// lost, or the lease expired) keeps that outcome.
			if err := st.JournalFinish(ctx, id, e); err != nil && !errors.Is(err, store.ErrNotFound) {
				logf("journal: finish", "err", err, "lease", end.LeaseID)
			}
		}
	}
}
