package daemon

import (
	"context"
	"fmt"
	"net/http"
	"testing"
)

// TestAdminUnknownProject: a daemon admin gets 404 for an unknown project
// on every project route (as docs/openapi.json says), anyone else the 403
// of non-members; an admin who is no member of an existing project still
// gets 403 where members only may act.
func TestAdminUnknownProject(t *testing.T) {
	e := newEnv(t, envOpts{app: AppOptions{Admins: []string{"root"}}})
	ctx := context.Background()
	alice, tok := e.account("alice")
	_, rootTok := e.account("root")
	p := e.hostProject("web", alice)
	for _, path := range []string{"/v1/projects/999", "/v1/projects/999/members", "/v1/projects/999/egress"} {
		if status, body := e.do(ctx, "GET", path, rootTok, nil); status != http.StatusNotFound {
			t.Errorf("admin GET %s: %d %s", path, status, body)
		}
		if status, body := e.do(ctx, "GET", path, tok, nil); status != http.StatusForbidden {
			t.Errorf("non-admin GET %s: %d %s", path, status, body)
		}
	}
	if status, body := e.do(ctx, "GET", fmt.Sprintf("/v1/projects/%d", p.ID), rootTok, nil); status != http.StatusForbidden {
		t.Errorf("admin GET a project it is no member of: %d %s", status, body)
	}
}
