package daemon

import (
	"net/http"

	"github.com/corral-sandbox/corral/plugin"
	"github.com/corral-sandbox/corral/plugins/editor"
	"github.com/corral-sandbox/corral/sandbox"
)

// editorActor is the actor of an authenticated request: the daemon
// authenticated the request and checked membership already.
func editorActor(r *http.Request) (sandbox.Actor, error) {
	acct, ok := accountFrom(r.Context())
	if !ok {
		return sandbox.Actor{}, apiErr(http.StatusUnauthorized, KindUnauthorized, "authentication required")
	}
	return sandbox.Actor{AccountUserID: acct.ID}, nil
}

// editorGit serves GET /v1/projects/{id}/git/{status,log,diff,show}
// through the editor domain (editor.Domain), resolved at call time:
// 401/404 are decided by the daemon from the database first; an absent
// editor plugin answers 503. The editor's errors are classified
// (editor.Error, with the API's kinds) and go through the one error
// translator (toAPIError).
func (a *App) editorGit(w http.ResponseWriter, r *http.Request) error {
	if _, _, _, err := a.projectMember(r); err != nil {
		return err
	}
	ed, err := plugin.ResolveCoreAs[editor.Domain](a.core.Registry(), plugin.DomainEditor)
	if err != nil {
		return err
	}
	actor, err := editorActor(r)
	if err != nil {
		return err
	}
	v, err := editor.Serve(ed, r, actor)
	if err != nil {
		return err
	}
	w.Header().Set("Cache-Control", "no-store")
	writeJSON(w, http.StatusOK, v)
	return nil
}
