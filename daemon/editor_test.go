package daemon

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/corral-sandbox/corral/store"
)

func gitPath(id int64, op string) string { return fmt.Sprintf("/v1/projects/%d/git/%s", id, op) }

// TestEditorRoutes reads a real repository in a managed project through
// the daemon: status, log, diff and show, a project that is not a
// repository, and the translated errors.
func TestEditorRoutes(t *testing.T) {
	g := newGitEnv(t, AppOptions{})
	alice, tok := g.account("alice")
	p, head := g.repoProject("box", alice)
	if err := os.WriteFile(filepath.Join(p.Root, "README"), []byte("hello\nchanged\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(p.Root, "new.txt"), []byte("new\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()

	status, body := g.do(ctx, "GET", gitPath(p.ID, "status"), tok, nil)
	if status != 200 {
		t.Fatalf("status: %d %s", status, body)
	}
	var st struct {
		IsRepo bool `json:"isRepo"`
		Branch struct {
			OID  string `json:"oid"`
			Head string `json:"head"`
		} `json:"branch"`
		Entries []struct {
			Kind     string `json:"kind"`
			Path     string `json:"path"`
			Worktree string `json:"worktree"`
		} `json:"entries"`
	}
	if err := json.Unmarshal(body, &st); err != nil {
		t.Fatal(err)
	}
	if !st.IsRepo || st.Branch.Head != "main" || st.Branch.OID != head || len(st.Entries) != 2 ||
		st.Entries[0].Path != "README" || st.Entries[0].Worktree != "M" ||
		st.Entries[1].Path != "new.txt" || st.Entries[1].Kind != "untracked" {
		t.Errorf("status %s", body)
	}

	status, body = g.do(ctx, "GET", gitPath(p.ID, "log")+"?limit=5", tok, nil)
	if status != 200 || !strings.Contains(string(body), `"hash":"`+head+`"`) || !strings.Contains(string(body), `"subject":"add README"`) {
		t.Errorf("log: %d %s", status, body)
	}
	status, body = g.do(ctx, "GET", gitPath(p.ID, "diff"), tok, nil)
	if status != 200 || !strings.Contains(string(body), `+changed`) || !strings.Contains(string(body), `"truncated":false`) {
		t.Errorf("diff: %d %s", status, body)
	}
	status, body = g.do(ctx, "GET", gitPath(p.ID, "show")+"?ref=HEAD&path=README", tok, nil)
	if status != 200 || !strings.Contains(string(body), `"content":"hello\n"`) {
		t.Errorf("show: %d %s", status, body)
	}
	// Errors come in the daemon's pinned body.
	for _, c := range []struct {
		path   string
		status int
		kind   string
	}{
		{gitPath(p.ID, "show") + "?ref=nope&path=README", 404, KindUnknownRevision},
		{gitPath(p.ID, "log") + "?limit=abc", 400, KindInvalid},
		{gitPath(p.ID, "show") + "?ref=-x&path=README", 400, KindInvalid},
	} {
		status, body := g.do(ctx, "GET", c.path, tok, nil)
		if kind, _, _, _ := apiError(t, body); status != c.status || kind != c.kind {
			t.Errorf("%s: %d %s", c.path, status, body)
		}
	}

	// A workspace that is not a repository.
	q, err := g.st.CreateProject(ctx, store.NewProject{Kind: store.ProjectManaged, Name: "plain", Root: g.w.Workspace(t, "plain")})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := g.st.AddMember(ctx, store.Member{Project: q.ID, Account: alice.ID, Role: store.RoleOwner}); err != nil {
		t.Fatal(err)
	}
	status, body = g.do(ctx, "GET", gitPath(q.ID, "status"), tok, nil)
	if status != 200 || strings.TrimSpace(string(body)) != `{"isRepo":false}` {
		t.Errorf("not a repository: %d %s", status, body)
	}
	if n := g.liveLeases(); n != 0 {
		t.Errorf("%d live leases", n)
	}
}

// TestEditorRoutesAuth: anonymous callers get 401, non-members 403 and
// unknown projects 404, all before any command runs.
func TestEditorRoutesAuth(t *testing.T) {
	e := newEnv(t, envOpts{})
	alice, tok := e.account("alice")
	_, stranger := e.account("mallory")
	p := e.hostProject("h", alice)
	ctx := context.Background()
	for _, op := range []string{"status", "log", "diff", "show"} {
		for _, c := range []struct {
			token  string
			id     int64
			status int
			kind   string
		}{{"", p.ID, 401, KindUnauthorized}, {"bogus", p.ID, 401, KindUnauthorized}, {stranger, p.ID, 403, KindForbidden}, {tok, p.ID + 10, 403, KindForbidden}} {
			status, body := e.do(ctx, "GET", gitPath(c.id, op), c.token, nil)
			if kind, _, _, _ := apiError(t, body); status != c.status || kind != c.kind {
				t.Errorf("%s token %q project %d: %d %s", op, c.token, c.id, status, body)
			}
		}
	}
	if n := e.journalLen(); n != 0 {
		t.Errorf("%d commands ran for refused requests", n)
	}
	// A host project is read too (the editor runs git in its root).
	runGit(t, p.Root, "init", "-q", "-b", "trunk")
	status, body := e.do(ctx, "GET", gitPath(p.ID, "status"), tok, nil)
	if status != 200 || !strings.Contains(string(body), `"head":"trunk"`) {
		t.Errorf("host status: %d %s", status, body)
	}
}

// TestEditorRoutesUnavailable: 503 in the pinned body when the sandbox
// provider or the editor plugin is disabled.
func TestEditorRoutesUnavailable(t *testing.T) {
	for _, disabled := range []string{"sandbox", "editor"} {
		t.Run(disabled, func(t *testing.T) {
			e := newEnv(t, envOpts{disabled: []string{disabled}})
			alice, tok := e.account("alice")
			p := e.hostProject("h", alice)
			status, body := e.do(context.Background(), "GET", gitPath(p.ID, "status"), tok, nil)
			if kind, _, _, _ := apiError(t, body); status != 503 || kind != KindUnavailable {
				t.Errorf("%d %s", status, body)
			}
		})
	}
}
