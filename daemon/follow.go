package daemon

import (
	"context"
	"fmt"
	"net/http"
	"time"

	"github.com/coder/websocket"
)

// Sessions follow their token. Every live session — a raw WebSocket
// session, a language-server session, a request through the Sites gateway
// (a proxied WebSocket included) — is registered with the account, token
// and project it was authorized for. One checker per App looks at all of
// them every AppOptions.SessionCheckInterval (1 s) with two store queries
// (the tokens by ID, each project's members) and ends, within about that
// interval, every session whose token was revoked, whose account was
// deleted, whose account is no longer a member of the project, or that
// outlived AppOptions.MaxSessionLifetime (24 h). WebSocket sessions close
// with 1008 (policy violation) and the reason; proxied site connections
// are closed. The command or server behind a session is cancelled and its
// lease released as when the client goes away.

// Defaults of AppOptions.
const (
	DefaultMaxSessionLifetime   = 24 * time.Hour
	DefaultSessionCheckInterval = time.Second
)

// sessionEnded is the cause of a session's context when the checker ended
// it.
type sessionEnded struct{ reason string }

func (e *sessionEnded) Error() string { return "session ended: " + e.reason }

// liveSession is one registered session.
type liveSession struct {
	account int64
	token   int64
	project int64
	started time.Time
	end     context.CancelCauseFunc
}

type tokenKey struct{}

// trackSession registers a session of the request's account and token in
// project, and returns its context (derived from parent, ended with a
// *sessionEnded cause by the checker) and the function that unregisters it.
func (a *App) trackSession(parent context.Context, r *http.Request, project int64) (context.Context, func()) {
	acct, _ := accountFrom(r.Context())
	tok, _ := r.Context().Value(tokenKey{}).(int64)
	return a.track(parent, acct.ID, tok, project)
}

// track is trackSession for a session of account, authorized by bearer
// token tok (a Sites gateway request, whose credential may be a site
// cookie derived from the token).
func (a *App) track(parent context.Context, account, tok, project int64) (context.Context, func()) {
	ctx, cancel := context.WithCancelCause(parent)
	s := &liveSession{account: account, token: tok, project: project, started: time.Now(), end: cancel}
	a.sessMu.Lock()
	a.live[s] = struct{}{}
	a.sessMu.Unlock()
	return ctx, func() {
		a.sessMu.Lock()
		delete(a.live, s)
		close(a.untracked)
		a.untracked = make(chan struct{})
		a.sessMu.Unlock()
		cancel(nil)
	}
}

// projectSessions counts the sessions of project this daemon tracks and
// returns the channel closed when one of this daemon's sessions next ends.
func (a *App) projectSessions(project int64) (int, <-chan struct{}) {
	a.sessMu.Lock()
	defer a.sessMu.Unlock()
	n := 0
	for s := range a.live {
		if s.project == project {
			n++
		}
	}
	return n, a.untracked
}

// sessionCloseStatus is how a session whose context ended closes: 1008 and
// the reason if the checker ended it, else 1001 (the daemon is shutting
// down).
func sessionCloseStatus(ctx context.Context) (websocket.StatusCode, string) {
	if se, ok := context.Cause(ctx).(*sessionEnded); ok {
		return websocket.StatusPolicyViolation, clipReason(se.reason)
	}
	return websocket.StatusGoingAway, "the daemon is shutting down"
}

// followSessions runs the checker until the App closes.
func (a *App) followSessions() {
	defer close(a.followDone)
	t := time.NewTicker(a.opts.SessionCheckInterval)
	defer t.Stop()
	for {
		select {
		case <-a.ctx.Done():
			return
		case <-t.C:
			a.checkSessions(a.ctx)
		}
	}
}

// checkSessions ends every session that lost its authorization.
func (a *App) checkSessions(ctx context.Context) {
	a.sessMu.Lock()
	live := make([]*liveSession, 0, len(a.live))
	for s := range a.live {
		live = append(live, s)
	}
	a.sessMu.Unlock()
	if len(live) == 0 {
		return
	}
	ids := make([]int64, 0, len(live))
	projects := map[int64]map[int64]bool{}
	for _, s := range live {
		ids = append(ids, s.token)
		projects[s.project] = nil
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	tokens, err := a.store.TokensByID(ctx, ids)
	if err != nil {
		a.log.Warn("sessions: check tokens", "err", err)
		return
	}
	for p := range projects {
		ms, err := a.store.ListMembers(ctx, p)
		if err != nil {
			a.log.Warn("sessions: check members", "project", p, "err", err)
			return
		}
		set := make(map[int64]bool, len(ms))
		for _, m := range ms {
			set[m.Account] = true
		}
		projects[p] = set
	}
	now := time.Now()
	for _, s := range live {
		var reason string
		tok, ok := tokens[s.token]
		switch {
		case !ok:
			reason = "account deleted"
		case !tok.Revoked.IsZero():
			reason = "token revoked"
		case !projects[s.project][s.account]:
			reason = fmt.Sprintf("no longer a member of project %d", s.project)
		case now.Sub(s.started) >= a.opts.MaxSessionLifetime:
			reason = fmt.Sprintf("session lifetime of %v reached", a.opts.MaxSessionLifetime)
		default:
			continue
		}
		a.log.Info("session ended", "account", s.account, "token", s.token, "project", s.project, "reason", reason)
		s.end(&sessionEnded{reason: reason})
	}
}
