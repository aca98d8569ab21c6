package core

import (
	"context"
	"errors"
	"net/url"
	"regexp"
	"strings"
	"sync"
	"time"

	"github.com/corral-sandbox/corral/sandbox"
	"github.com/corral-sandbox/corral/store"
)

// secretArg matches command-line arguments that carry a secret in their value:
// --password=x, token=x, --api-key x is handled by redactArgv's look-behind.
var secretArg = sync.OnceValue(func() *regexp.Regexp {
	return regexp.MustCompile(`(?i)^(-{0,2}[a-z0-9_.-]*(password|passwd|secret|token|api[-_]?key|auth)[a-z0-9_.-]*[=:])(.+)$`)
})

var secretFlag = sync.OnceValue(func() *regexp.Regexp {
	return regexp.MustCompile(`(?i)^-{1,2}[a-z0-9_.-]*(password|passwd|secret|token|api[-_]?key)[a-z0-9_.-]*$`)
})

// RedactArgv returns argv with secrets replaced by "[REDACTED]": credentials
// in URLs (user:password@), values of arguments named like secrets
// (--token=x, PASSWORD=x) and the argument following a secret-named flag
// (--token x), and anything carrying a corral bearer token.
func RedactArgv(argv []string) []string {
	out := make([]string, len(argv))
	for i, a := range argv {
		switch {
		case i > 0 && secretFlag().MatchString(argv[i-1]):
			out[i] = "[REDACTED]"
		case strings.Contains(a, store.TokenPrefix):
			out[i] = "[REDACTED]"
		case secretArg().MatchString(a):
			out[i] = secretArg().ReplaceAllString(a, "${1}[REDACTED]")
		default:
			out[i] = RedactURL(a)
		}
	}
	return out
}

// urlInText finds URL-like substrings with userinfo.
var urlInText = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`[a-zA-Z][a-zA-Z0-9+.-]*://[^\s/@]+@[^\s]*`) })

// RedactURL removes the password (or token) of every URL in s that carries
// userinfo: https://user:secret@host/x becomes https://user:[REDACTED]@host/x,
// https://token@host becomes https://[REDACTED]@host.
func RedactURL(s string) string {
	if !strings.Contains(s, "@") || !strings.Contains(s, "://") {
		return s
	}
	return urlInText().ReplaceAllStringFunc(s, func(m string) string {
		u, err := url.Parse(m)
		if err != nil || u.User == nil {
			scheme, rest, _ := strings.Cut(m, "://")
			_, host, _ := strings.Cut(rest, "@")
			return scheme + "://[REDACTED]@" + host
		}
		if _, has := u.User.Password(); has {
			u.User = url.UserPassword(u.User.Username(), "[REDACTED]")
		} else {
			u.User = url.User("[REDACTED]")
		}
		return strings.Replace(u.String(), "%5BREDACTED%5D", "[REDACTED]", 1)
	})
}

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
			Argv:      RedactArgv(start.Input.Command.Argv()),
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
				e.Outcome, e.Signal = store.OutcomeSignal, end.Result.Signal
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
