package daemon

import (
	"context"
	"errors"
	"net/http"
	"strings"

	"github.com/corral-sandbox/corral/store"
)

type accountKey struct{}

func withAccount(ctx context.Context, a store.Account) context.Context {
	return context.WithValue(ctx, accountKey{}, a)
}

// accountFrom returns the authenticated account of a request's context.
func accountFrom(ctx context.Context) (store.Account, bool) {
	a, ok := ctx.Value(accountKey{}).(store.Account)
	return a, ok
}

// bearerToken returns the token of an "Authorization: Bearer" header.
func bearerToken(r *http.Request) (string, bool) {
	h := r.Header.Get("Authorization")
	scheme, tok, ok := strings.Cut(h, " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return "", false
	}
	tok = strings.TrimSpace(tok)
	return tok, tok != ""
}

// authenticate returns the account of the request's bearer token and the
// token's ID: 401
// without one or for a token that is unknown or revoked. Nothing else —
// no project, no provider — is looked at before it succeeded.
func (a *App) authenticate(r *http.Request) (store.Account, int64, error) {
	tok, ok := bearerToken(r)
	if !ok {
		return store.Account{}, 0, apiErr(http.StatusUnauthorized, KindUnauthorized, "a bearer token is required")
	}
	acct, id, err := a.store.AuthenticateToken(r.Context(), tok)
	if errors.Is(err, store.ErrNotFound) {
		return store.Account{}, 0, apiErr(http.StatusUnauthorized, KindUnauthorized, "the bearer token is not valid")
	}
	if err != nil {
		return store.Account{}, 0, err
	}
	return acct, id, nil
}

// member checks that the request's account is a member of project id. An
// unknown project and a project the account is not a member of get the same
// answer, 403 with the same message, so that outsiders do not learn which
// ids exist (members learn nothing new: they know their projects). On that
// refusal the returned project is the stored one when it exists, for
// callers that admit daemon admins too (see adminOrMember); it must not
// reach the response. It consults only the store, so it runs before any
// provider is contacted.
func (a *App) member(r *http.Request, id int64) (store.Account, store.Project, store.Member, error) {
	acct, ok := accountFrom(r.Context())
	if !ok {
		return store.Account{}, store.Project{}, store.Member{}, apiErr(http.StatusUnauthorized, KindUnauthorized, "a bearer token is required")
	}
	refused := apiErr(http.StatusForbidden, KindForbidden, "project %d: no such project, or you are not a member of it", id)
	// One read of the store for both (a round trip fewer than the
	// project, then the membership).
	p, m, err := a.store.GetProjectMember(r.Context(), id, acct.ID)
	switch {
	case errors.Is(err, store.ErrNotMember):
		return acct, p, store.Member{}, refused
	case errors.Is(err, store.ErrNotFound) && a.isAdmin(acct):
		// Admins may act on any project (machine, egress): they may know
		// which ids exist, on every project route alike.
		return acct, store.Project{}, store.Member{}, apiErr(http.StatusNotFound, KindNotFound, "project %d does not exist", id)
	case errors.Is(err, store.ErrNotFound):
		return acct, store.Project{}, store.Member{}, refused
	case err != nil:
		return acct, store.Project{}, store.Member{}, err
	}
	return acct, p, m, nil
}

// projectMember is member for the {id} path value.
func (a *App) projectMember(r *http.Request) (store.Account, store.Project, store.Member, error) {
	id, err := pathID(r)
	if err != nil {
		return store.Account{}, store.Project{}, store.Member{}, err
	}
	return a.member(r, id)
}

func (a *App) isAdmin(acct store.Account) bool { return a.admins[acct.Name] }
