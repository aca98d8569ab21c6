package daemon

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"time"

	"github.com/corral-sandbox/corral/api"
	"github.com/corral-sandbox/corral/export"
	"github.com/corral-sandbox/corral/projects"
	"github.com/corral-sandbox/corral/store"
)

func projectJSON(p store.Project, role store.Role) api.Project {
	out := api.Project{ID: p.ID, Name: p.Name, Kind: string(p.Kind), Created: p.Created, Role: string(role), Machine: machineJSON(p)}
	if p.Kind == store.ProjectHost {
		out.Root = p.Root
	}
	return out
}

func (a *App) whoami(w http.ResponseWriter, r *http.Request) error {
	acct, _ := accountFrom(r.Context())
	writeJSON(w, http.StatusOK, api.Account{ID: acct.ID, Name: acct.Name, Created: acct.Created})
	return nil
}

func (a *App) requireAdmin(r *http.Request) error {
	acct, _ := accountFrom(r.Context())
	if !a.isAdmin(acct) {
		return apiErr(http.StatusForbidden, KindForbidden, "account %s is not an administrator of this daemon", acct.Name)
	}
	return nil
}

// createAccount serves POST /v1/accounts {"name":N} (administrators only).
func (a *App) createAccount(w http.ResponseWriter, r *http.Request) error {
	if err := a.requireAdmin(r); err != nil {
		return err
	}
	var req api.AccountRequest
	if err := a.decodeBody(w, r, &req); err != nil {
		return err
	}
	if strings.TrimSpace(req.Name) == "" {
		return apiErr(http.StatusBadRequest, KindInvalid, "name is required")
	}
	acct, err := a.store.CreateAccount(r.Context(), req.Name)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusCreated, api.Account{ID: acct.ID, Name: acct.Name, Created: acct.Created})
	return nil
}

// Bounds of tokens minted over HTTP: a name's bytes, and the live tokens
// an account that is not an admin may mint itself.
const (
	MaxTokenName     = 128
	MaxAccountTokens = 64
)

// createToken serves POST /v1/accounts/{name}/tokens {"name":N}: an
// administrator mints a token for any account, an account for itself.
func (a *App) createToken(w http.ResponseWriter, r *http.Request) error {
	caller, _ := accountFrom(r.Context())
	name := r.PathValue("name")
	if name != caller.Name {
		if err := a.requireAdmin(r); err != nil {
			return err
		}
	}
	var req api.TokenRequest
	if err := a.decodeBody(w, r, &req); err != nil {
		return err
	}
	if len(req.Name) > MaxTokenName {
		return apiErr(http.StatusBadRequest, KindInvalid, "a token's name has at most %d bytes", MaxTokenName)
	}
	acct, err := a.store.AccountByName(r.Context(), name)
	if err != nil {
		return err
	}
	if !a.isAdmin(caller) {
		toks, err := a.store.ListTokens(r.Context(), acct.ID)
		if err != nil {
			return err
		}
		live := 0
		for _, t := range toks {
			if t.Revoked.IsZero() {
				live++
			}
		}
		if live >= MaxAccountTokens {
			return apiErr(http.StatusForbidden, KindForbidden, "account %s has %d live tokens, the most it may mint itself (revoke some)", acct.Name, live)
		}
	}
	tok, t, err := a.store.CreateToken(r.Context(), acct.ID, req.Name)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusCreated, api.Token{ID: t.ID, AccountID: acct.ID, Name: t.Name, Token: tok})
	return nil
}

// createProject serves POST /v1/projects; the caller becomes its owner.
func (a *App) createProject(w http.ResponseWriter, r *http.Request) error {
	acct, _ := accountFrom(r.Context())
	var req api.ProjectRequest
	if err := a.decodeBody(w, r, &req); err != nil {
		return err
	}
	kind := store.ProjectKind(req.Kind)
	if kind == "" {
		kind = store.ProjectManaged
	}
	for _, pat := range req.ExportRemotes {
		if err := export.ValidRemotePattern(pat); err != nil {
			return apiErr(http.StatusBadRequest, KindInvalid, "%v", err)
		}
	}
	spec := projects.ProjectSpec{Name: req.Name, Kind: kind, Root: req.Root, From: req.From, Git: req.Git, Owner: acct.ID, ExportRemotes: req.ExportRemotes}
	if _, localGit := projects.LocalGitPath(req.Git); kind == store.ProjectHost || req.From != "" || localGit {
		if err := a.requireHostPaths(r.Context(), acct); err != nil {
			return err
		}
	}
	if max := a.opts.MaxAccountProjects; max > 0 && !a.isAdmin(acct) {
		n, err := a.store.CreatedProjects(r.Context(), acct.ID)
		if err != nil {
			return err
		}
		if n >= max {
			return apiErr(http.StatusForbidden, KindForbidden, "account %s created %d projects, the most this daemon allows (delete one, or ask an admin)", acct.Name, n)
		}
	}
	if req.Git != "" {
		done, err := a.imports.start(acct, a.isAdmin(acct))
		if err != nil {
			return err
		}
		defer done()
	}
	p, err := a.proj.Create(r.Context(), spec)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusCreated, projectJSON(p, store.RoleOwner))
	return nil
}

// requireHostPaths answers 403 unless the daemon permits host paths
// (AllowHostPaths) and an admin granted them to acct (corral account grant
// host-paths).
func (a *App) requireHostPaths(ctx context.Context, acct store.Account) error {
	if !a.opts.AllowHostPaths {
		return apiErr(http.StatusForbidden, KindForbidden, "host paths (host projects, from, local git URLs) are not accepted over HTTP by this daemon (use the corral CLI)")
	}
	ok, err := a.store.HostPaths(ctx, acct.ID)
	if err != nil {
		return err
	}
	if !ok {
		return apiErr(http.StatusForbidden, KindForbidden, "account %q may not use host paths (host projects, from, local git URLs): an admin grants that with `corral account grant host-paths %s`", acct.Name, acct.Name)
	}
	return nil
}

// listProjects serves GET /v1/projects: the caller's projects.
func (a *App) listProjects(w http.ResponseWriter, r *http.Request) error {
	acct, _ := accountFrom(r.Context())
	all, err := a.store.ListProjects(r.Context())
	if err != nil {
		return err
	}
	out := []api.Project{}
	for _, p := range all {
		m, err := a.store.GetMember(r.Context(), p.ID, acct.ID)
		if err != nil {
			continue
		}
		out = append(out, projectJSON(p, m.Role))
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

func (a *App) getProject(w http.ResponseWriter, r *http.Request) error {
	_, p, m, err := a.projectMember(r)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, projectJSON(p, m.Role))
	return nil
}

// requireOwner returns 403 unless m is an owner.
func requireOwner(m store.Member, p store.Project) error {
	if m.Role != store.RoleOwner {
		return apiErr(http.StatusForbidden, KindForbidden, "only an owner of project %d may do this", p.ID)
	}
	return nil
}

// deleteProjectWait bounds how long deleteProject waits for this daemon's
// sessions of the project to end while the project has live leases.
const deleteProjectWait = 2 * time.Second

// deleteProject serves DELETE /v1/projects/{id} (owners; 409 while a lease
// is live).
//
// A WebSocket's close handshake completes (the library answers the
// client's close frame) before its handler has released the session's
// lease, so a client that closed its session and saw the close complete
// could find its own lease still live. While the project has live leases
// and this daemon holds sessions of it (closing ones among them), the
// delete waits for those sessions to end, for deleteProjectWait at most,
// retrying as each ends: a lease that is still live then (an open session,
// another replica's or another process's lease) still answers 409.
func (a *App) deleteProject(w http.ResponseWriter, r *http.Request) error {
	_, p, m, err := a.projectMember(r)
	if err != nil {
		return err
	}
	if err := requireOwner(m, p); err != nil {
		return err
	}
	deadline := time.NewTimer(deleteProjectWait)
	defer deadline.Stop()
	for {
		n, ended := a.projectSessions(p.ID)
		err := a.proj.Delete(r.Context(), p.ID)
		if err == nil {
			break
		}
		if n == 0 || !errors.Is(err, store.ErrProjectBusy) {
			return err
		}
		select {
		case <-ended:
		case <-deadline.C:
			return err
		case <-r.Context().Done():
			return err
		}
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

func (a *App) listMembers(w http.ResponseWriter, r *http.Request) error {
	_, p, _, err := a.projectMember(r)
	if err != nil {
		return err
	}
	ms, err := a.store.ListMembers(r.Context(), p.ID)
	if err != nil {
		return err
	}
	out := make([]api.Member, 0, len(ms))
	for _, m := range ms {
		mj := api.Member{AccountID: m.Account, Role: string(m.Role), Trusted: m.Trusted, Created: m.Created}
		if acct, err := a.store.GetAccount(r.Context(), m.Account); err == nil {
			mj.Account = acct.Name
		}
		out = append(out, mj)
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

// addMember serves POST /v1/projects/{id}/members (owners only).
func (a *App) addMember(w http.ResponseWriter, r *http.Request) error {
	caller, p, m, err := a.projectMember(r)
	if err != nil {
		return err
	}
	if err := requireOwner(m, p); err != nil {
		return err
	}
	var req api.MemberRequest
	if err := a.decodeBody(w, r, &req); err != nil {
		return err
	}
	if req.Trusted {
		// A trusted member's host commands run unconfined: granting that is
		// a host-path permission of the granting owner.
		if !a.opts.AllowHostPaths {
			return apiErr(http.StatusForbidden, KindForbidden, "trusted members are not granted over HTTP by this daemon (use the corral CLI)")
		}
		if err := a.requireHostPaths(r.Context(), caller); err != nil {
			return err
		}
	}
	switch store.Role(req.Role) {
	case "", store.RoleMember, store.RoleOwner:
	default:
		return apiErr(http.StatusBadRequest, KindInvalid, "role %q is not member or owner", req.Role)
	}
	acct, err := a.store.AccountByName(r.Context(), req.Account)
	if err != nil {
		return err
	}
	nm, err := a.store.AddMember(r.Context(), store.Member{Project: p.ID, Account: acct.ID, Role: store.Role(req.Role), Trusted: req.Trusted})
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusCreated, api.Member{AccountID: nm.Account, Account: acct.Name, Role: string(nm.Role), Trusted: nm.Trusted, Created: nm.Created})
	return nil
}
