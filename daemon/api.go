package daemon

import (
	"context"
	"net/http"
	"strings"
	"time"

	"github.com/corral-sandbox/corral/export"
	"github.com/corral-sandbox/corral/store"
)

// AccountJSON is an account in responses.
type AccountJSON struct {
	ID      int64     `json:"id"`
	Name    string    `json:"name"`
	Created time.Time `json:"created"`
}

// ProjectJSON is a project in responses. Root is shown for host projects
// only: a managed project's workspace is the daemon's business.
type ProjectJSON struct {
	ID      int64     `json:"id"`
	Name    string    `json:"name"`
	Kind    string    `json:"kind"`
	Root    string    `json:"root,omitempty"`
	Created time.Time `json:"created"`
	// Role is the caller's role in the project.
	Role string `json:"role,omitempty"`
	// Machine is a managed project's machine spec.
	Machine *MachineJSON `json:"machine,omitempty"`
}

// MemberJSON is a membership in responses.
type MemberJSON struct {
	Account int64     `json:"accountId"`
	Name    string    `json:"account,omitempty"`
	Role    string    `json:"role"`
	Trusted bool      `json:"trusted"`
	Created time.Time `json:"created"`
}

// TokenJSON is a newly created token: Token is shown once.
type TokenJSON struct {
	ID      int64  `json:"id"`
	Account int64  `json:"accountId"`
	Name    string `json:"name"`
	Token   string `json:"token"`
}

func projectJSON(p store.Project, role store.Role) ProjectJSON {
	out := ProjectJSON{ID: p.ID, Name: p.Name, Kind: string(p.Kind), Created: p.Created, Role: string(role), Machine: machineJSON(p)}
	if p.Kind == store.ProjectHost {
		out.Root = p.Root
	}
	return out
}

func (a *App) whoami(w http.ResponseWriter, r *http.Request) error {
	acct, _ := accountFrom(r.Context())
	writeJSON(w, http.StatusOK, AccountJSON{acct.ID, acct.Name, acct.Created})
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
	var req struct {
		Name string `json:"name"`
	}
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
	writeJSON(w, http.StatusCreated, AccountJSON{acct.ID, acct.Name, acct.Created})
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
	var req struct {
		Name string `json:"name"`
	}
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
	writeJSON(w, http.StatusCreated, TokenJSON{ID: t.ID, Account: acct.ID, Name: t.Name, Token: tok})
	return nil
}

// ProjectRequest is the body of POST /v1/projects.
type ProjectRequest struct {
	Name string `json:"name"`
	// Kind is "managed" (the default) or "host".
	Kind string `json:"kind,omitempty"`
	// Root is a host project's directory (AllowHostPaths only).
	Root string `json:"root,omitempty"`
	// From is a host directory copied into a new managed workspace
	// (AllowHostPaths only).
	From string `json:"from,omitempty"`
	// Git is a URL cloned into a new managed workspace (https and http,
	// to public addresses unless the operator allowed a range; a host path
	// or file:// URL with host paths as for From).
	Git string `json:"git,omitempty"`
	// ExportRemotes, if non-empty, are the remote patterns the project may
	// be exported to (see export.ValidRemotePattern), narrowing the
	// daemon's --export-remote list.
	ExportRemotes []string `json:"exportRemotes,omitempty"`
}

// createProject serves POST /v1/projects; the caller becomes its owner.
func (a *App) createProject(w http.ResponseWriter, r *http.Request) error {
	acct, _ := accountFrom(r.Context())
	var req ProjectRequest
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
	spec := ProjectSpec{Name: req.Name, Kind: kind, Root: req.Root, From: req.From, Git: req.Git, Owner: acct.ID, ExportRemotes: req.ExportRemotes}
	if _, localGit := LocalGitPath(req.Git); kind == store.ProjectHost || req.From != "" || localGit {
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
		done, err := a.startImport(acct)
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
	out := []ProjectJSON{}
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

// deleteProject serves DELETE /v1/projects/{id} (owners; 409 while a lease
// is live).
func (a *App) deleteProject(w http.ResponseWriter, r *http.Request) error {
	_, p, m, err := a.projectMember(r)
	if err != nil {
		return err
	}
	if err := requireOwner(m, p); err != nil {
		return err
	}
	if err := a.proj.Delete(r.Context(), p.ID); err != nil {
		return err
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
	out := make([]MemberJSON, 0, len(ms))
	for _, m := range ms {
		mj := MemberJSON{Account: m.Account, Role: string(m.Role), Trusted: m.Trusted, Created: m.Created}
		if acct, err := a.store.GetAccount(r.Context(), m.Account); err == nil {
			mj.Name = acct.Name
		}
		out = append(out, mj)
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

// MemberRequest is the body of POST /v1/projects/{id}/members.
type MemberRequest struct {
	Account string `json:"account"`
	// Role is "member" (the default) or "owner".
	Role string `json:"role,omitempty"`
	// Trusted members run host commands unconfined (AllowHostPaths, and
	// only an owner granted host paths may grant it).
	Trusted bool `json:"trusted,omitempty"`
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
	var req MemberRequest
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
	writeJSON(w, http.StatusCreated, MemberJSON{Account: nm.Account, Name: acct.Name, Role: string(nm.Role), Trusted: nm.Trusted, Created: nm.Created})
	return nil
}
