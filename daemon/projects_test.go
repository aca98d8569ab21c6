package daemon

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/corral-sandbox/corral/api"
	"github.com/corral-sandbox/corral/projects"
	"github.com/corral-sandbox/corral/sandbox"
	"github.com/corral-sandbox/corral/store"
)

// TestTokensHashedAtRest: the database holds a token's SHA-256, never the
// token.
func TestTokensHashedAtRest(t *testing.T) {
	e := newEnv(t, envOpts{})
	_, tok := e.account("alice")
	if status, _ := e.do(context.Background(), "GET", "/v1/whoami", tok, nil); status != 200 {
		t.Fatalf("whoami: %d", status)
	}
	var all []byte
	files, _ := filepath.Glob(filepath.Join(e.dir, "corral.db*"))
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		all = append(all, b...)
	}
	if len(all) == 0 {
		t.Fatal("no database files")
	}
	secret := strings.TrimPrefix(tok, store.TokenPrefix)
	if bytes.Contains(all, []byte(secret)) {
		t.Fatal("the token's plaintext is stored")
	}
	if !bytes.Contains(all, []byte(store.HashToken(tok))) {
		t.Fatal("the token's hash is not stored (the test looks in the wrong place)")
	}
}

// TestHTTPAdministration: a platform creates an account, a token and a
// project, adds a member and runs a command through the daemon alone.
func TestHTTPAdministration(t *testing.T) {
	e := newEnv(t, envOpts{app: AppOptions{Admins: []string{"platform"}}})
	_, admin := e.account("platform")
	_, other := e.account("other")
	ctx := context.Background()

	decode := func(body []byte, v any) {
		t.Helper()
		if err := json.Unmarshal(body, v); err != nil {
			t.Fatalf("%s: %v", body, err)
		}
	}
	// Only administrators create accounts.
	if status, body := e.do(ctx, "POST", "/v1/accounts", other, map[string]string{"name": "x"}); status != 403 {
		t.Fatalf("non-admin account create: %d %s", status, body)
	}
	status, body := e.do(ctx, "POST", "/v1/accounts", admin, map[string]string{"name": "carol"})
	if status != 201 {
		t.Fatalf("account create: %d %s", status, body)
	}
	if status, _ := e.do(ctx, "POST", "/v1/accounts", admin, map[string]string{"name": "carol"}); status != 409 {
		t.Errorf("duplicate account: %d", status)
	}
	if status, _ := e.do(ctx, "POST", "/v1/accounts/carol/tokens", other, map[string]string{}); status != 403 {
		t.Errorf("token for another account by a non-admin: %d", status)
	}
	status, body = e.do(ctx, "POST", "/v1/accounts/carol/tokens", admin, map[string]string{"name": "ci"})
	if status != 201 {
		t.Fatalf("token create: %d %s", status, body)
	}
	var tj api.Token
	decode(body, &tj)
	carol := tj.Token
	var me api.Account
	status, body = e.do(ctx, "GET", "/v1/whoami", carol, nil)
	decode(body, &me)
	if status != 200 || me.Name != "carol" {
		t.Fatalf("whoami: %d %s", status, body)
	}

	// Host paths are refused over HTTP by default.
	for _, req := range []map[string]string{
		{"name": "h", "kind": "host", "root": e.dir},
		{"name": "c", "from": e.dir},
		{"name": "g", "git": "file://" + e.dir},
		{"name": "g2", "git": e.dir},
	} {
		if status, body := e.do(ctx, "POST", "/v1/projects", carol, req); status != 403 {
			t.Errorf("%v: %d %s", req, status, body)
		}
	}
	for _, req := range []any{
		map[string]string{"name": "../x"},
		map[string]string{"name": "ok", "kind": "cloud"},
		map[string]any{"name": "ok", "extra": true},
	} {
		if status, body := e.do(ctx, "POST", "/v1/projects", carol, req); status != 400 {
			t.Errorf("%v: %d %s", req, status, body)
		}
	}
	status, body = e.do(ctx, "POST", "/v1/projects", carol, map[string]string{"name": "box"})
	if status != 201 {
		t.Fatalf("project create: %d %s", status, body)
	}
	var pj api.Project
	decode(body, &pj)
	if pj.Kind != "managed" || pj.Role != "owner" || pj.Root != "" {
		t.Errorf("project %+v", pj)
	}
	if st, err := os.Stat(filepath.Join(projects.WorkspacesDir(e.dir), "box")); err != nil || !st.IsDir() {
		t.Errorf("workspace: %v", err)
	}
	if status, _ := e.do(ctx, "POST", "/v1/projects", carol, map[string]string{"name": "box"}); status != 409 {
		t.Errorf("duplicate project: %d", status)
	}
	// Members: owners add them; others cannot.
	path := fmt.Sprintf("/v1/projects/%d/members", pj.ID)
	if status, _ := e.do(ctx, "POST", path, other, map[string]string{"account": "other"}); status != 403 {
		t.Errorf("non-member adds itself: %d", status)
	}
	if status, _ := e.do(ctx, "POST", path, carol, map[string]any{"account": "other", "trusted": true}); status != 403 {
		t.Errorf("trusted over HTTP: %d", status)
	}
	if status, _ := e.do(ctx, "POST", path, carol, map[string]any{"account": "nobody"}); status != 404 {
		t.Errorf("unknown account: %d", status)
	}
	if status, body := e.do(ctx, "POST", path, carol, map[string]any{"account": "other"}); status != 201 {
		t.Fatalf("add member: %d %s", status, body)
	}
	if status, _ := e.do(ctx, "POST", path, carol, map[string]any{"account": "other"}); status != 409 {
		t.Errorf("duplicate member: %d", status)
	}
	status, body = e.do(ctx, "GET", path, other, nil)
	if status != 200 || !strings.Contains(string(body), `"account":"other"`) || !strings.Contains(string(body), `"account":"carol"`) {
		t.Errorf("members: %d %s", status, body)
	}
	status, body = e.do(ctx, "GET", "/v1/projects", other, nil)
	var list []api.Project
	decode(body, &list)
	if status != 200 || len(list) != 1 || list[0].Name != "box" || list[0].Role != "member" {
		t.Errorf("list: %d %s", status, body)
	}
	status, body = e.do(ctx, "GET", "/v1/projects", admin, nil)
	if status != 200 || strings.TrimSpace(string(body)) != "[]" {
		t.Errorf("list of a non-member: %d %s", status, body)
	}
	// Members cannot delete; owners can.
	ppath := fmt.Sprintf("/v1/projects/%d", pj.ID)
	if status, _ := e.do(ctx, "DELETE", ppath, other, nil); status != 403 {
		t.Errorf("member deletes: %d", status)
	}
	if status, body := e.do(ctx, "DELETE", ppath, carol, nil); status != 204 {
		t.Fatalf("delete: %d %s", status, body)
	}
	if _, err := os.Stat(filepath.Join(projects.WorkspacesDir(e.dir), "box")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("workspace left after delete: %v", err)
	}
	if status, _ := e.do(ctx, "GET", ppath, carol, nil); status != 403 {
		t.Errorf("get after delete: %d", status)
	}
}

// TestDeleteRefusedWhileLeased: a project with a live lease is not deleted.
func TestDeleteRefusedWhileLeased(t *testing.T) {
	e := newEnv(t, envOpts{})
	alice, tok := e.account("alice")
	p := e.hostProject("web", alice)
	ctl, err := e.core.Sandbox()
	if err != nil {
		t.Fatal(err)
	}
	prep, err := ctl.PrepareExecution(context.Background(), sandbox.ExecInput{
		Command: sandbox.Command{Type: "argv", File: "true"}, LeaseKind: sandbox.LeaseTerminal, Project: projectRef(p),
	}, &sandbox.Actor{AccountUserID: alice.ID})
	if err != nil {
		t.Fatal(err)
	}
	status, body := e.do(context.Background(), "DELETE", fmt.Sprintf("/v1/projects/%d", p.ID), tok, nil)
	if status != http.StatusConflict {
		t.Errorf("delete while leased: %d %s", status, body)
	}
	if err := e.app.Projects().Delete(context.Background(), p.ID); !errors.Is(err, store.ErrProjectBusy) {
		t.Errorf("projects.Projects.Delete while leased: %v", err)
	}
	if err := prep.Common().Lease.Release(context.Background()); err != nil {
		t.Fatal(err)
	}
	if status, body := e.do(context.Background(), "DELETE", fmt.Sprintf("/v1/projects/%d", p.ID), tok, nil); status != 204 {
		t.Errorf("delete after release: %d %s", status, body)
	}
}

// TestManagedWorkspaceSources: a managed workspace copied from a host
// directory (files, modes, symlinks kept as links) or cloned with git; a
// failed clone leaves nothing behind.
func TestManagedWorkspaceSources(t *testing.T) {
	st, err := store.Open(context.Background(), filepath.Join(t.TempDir(), "corral.db"), store.Options{Migrate: true})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	state := t.TempDir()
	ps := &projects.Projects{Store: st, StateDir: state, Logger: testLogger(t)}
	ctx := context.Background()

	src := t.TempDir()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.MkdirAll(filepath.Join(src, "dir", "sub"), 0o755))
	must(os.WriteFile(filepath.Join(src, "dir", "sub", "f.txt"), []byte("content"), 0o600))
	must(os.WriteFile(filepath.Join(src, "run.sh"), []byte("#!/bin/sh\n"), 0o755))
	must(os.Symlink("/etc/passwd", filepath.Join(src, "link")))

	p, err := ps.Create(ctx, projects.ProjectSpec{Name: "copy", Kind: store.ProjectManaged, From: src})
	must(err)
	if b, err := os.ReadFile(filepath.Join(p.Root, "dir", "sub", "f.txt")); err != nil || string(b) != "content" {
		t.Errorf("copied file: %q %v", b, err)
	}
	if st, err := os.Stat(filepath.Join(p.Root, "run.sh")); err != nil || st.Mode().Perm() != 0o755 {
		t.Errorf("mode: %v %v", st, err)
	}
	if l, err := os.Readlink(filepath.Join(p.Root, "link")); err != nil || l != "/etc/passwd" {
		t.Errorf("link: %q %v", l, err)
	}
	if filepath.Dir(p.Root) != mustEval(t, projects.WorkspacesDir(state)) {
		t.Errorf("workspace %s is not under %s", p.Root, projects.WorkspacesDir(state))
	}

	// A git repository reachable from the host.
	repo := t.TempDir()
	git := func(args ...string) {
		t.Helper()
		cmd := exec.Command("git", append([]string{"-C", repo, "-c", "user.name=t", "-c", "user.email=t@example.com"}, args...)...)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("git %v: %v: %s", args, err, out)
		}
	}
	git("init", "-q")
	must(os.WriteFile(filepath.Join(repo, "README"), []byte("cloned"), 0o644))
	git("add", "README")
	git("commit", "-q", "-m", "init")
	p, err = ps.Create(ctx, projects.ProjectSpec{Name: "clone", Kind: store.ProjectManaged, Git: "file://" + repo})
	must(err)
	if b, err := os.ReadFile(filepath.Join(p.Root, "README")); err != nil || string(b) != "cloned" {
		t.Errorf("cloned file: %q %v", b, err)
	}
	// Only https and http remotes are cloned.
	if _, err := ps.Create(ctx, projects.ProjectSpec{Name: "restricted", Kind: store.ProjectManaged, Git: "ssh://git@example.com/x.git"}); !errors.Is(err, projects.ErrGitImport) {
		t.Errorf("ssh clone: %v", err)
	}
	// A failed clone leaves no workspace and no project; its error hides
	// credentials.
	_, err = ps.Create(ctx, projects.ProjectSpec{Name: "broken", Kind: store.ProjectManaged, Git: "https://user:hunter2@127.0.0.1:1/x.git"})
	if err == nil || strings.Contains(err.Error(), "hunter2") {
		t.Errorf("failed clone: %v", err)
	}
	for _, name := range []string{"broken", "restricted"} {
		if _, err := os.Stat(filepath.Join(projects.WorkspacesDir(state), name)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s: workspace left behind: %v", name, err)
		}
		if _, err := st.ProjectByName(ctx, name); !errors.Is(err, store.ErrNotFound) {
			t.Errorf("%s: project left behind: %v", name, err)
		}
	}
	// Refusals.
	for _, spec := range []projects.ProjectSpec{
		{Name: "x", Kind: store.ProjectManaged, From: src, Git: "file://" + repo},
		{Name: "x", Kind: store.ProjectManaged, Root: src},
		{Name: "x", Kind: store.ProjectHost, Root: "relative"},
		{Name: "x", Kind: store.ProjectHost, Root: filepath.Join(src, "run.sh")},
		{Name: "x", Kind: store.ProjectHost},
		{Name: ".hidden", Kind: store.ProjectManaged},
		{Name: "a/b", Kind: store.ProjectManaged},
		{Name: "x", Kind: "cloud"},
	} {
		if _, err := ps.Create(ctx, spec); !errors.Is(err, projects.ErrInvalidProject) {
			t.Errorf("%+v: %v", spec, err)
		}
	}
	if _, err := ps.Create(ctx, projects.ProjectSpec{Name: "copy", Kind: store.ProjectManaged}); !errors.Is(err, store.ErrExists) {
		t.Errorf("duplicate: %v", err)
	}
}

func mustEval(t *testing.T, p string) string {
	t.Helper()
	r, err := filepath.EvalSymlinks(p)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// TestGitImportLeased: the daemon's git import clones under a files lease
// of the owner's, through the sandbox control's lifecycle — journaled as
// "git clone URL", stamped with the acting domain, released after — and a
// clone that fails leaves neither the project nor a live lease. (Before,
// host git ran with no lease and outside the lifecycle.)
func TestGitImportLeased(t *testing.T) {
	e := newEnv(t, envOpts{})
	alice, _ := e.account("alice")
	ctx := context.Background()
	repo := t.TempDir()
	for _, args := range [][]string{{"init", "-q"}, {"commit", "-q", "--allow-empty", "-m", "x"}} {
		if out, err := exec.Command("git", append([]string{"-C", repo, "-c", "user.name=t", "-c", "user.email=t@example.com"}, args...)...).CombinedOutput(); err != nil {
			t.Fatalf("git %v: %v %s", args, err, out)
		}
	}
	url := "file://" + repo
	p, err := e.app.proj.Create(ctx, projects.ProjectSpec{Name: "imported", Kind: store.ProjectManaged, Git: url, Owner: alice.ID})
	if err != nil {
		t.Fatal(err)
	}
	leases, err := e.st.ListLeases(ctx, store.LeaseFilter{Project: p.ID})
	if err != nil {
		t.Fatal(err)
	}
	if len(leases) != 1 || leases[0].Kind != "files" || leases[0].Account != alice.ID || leases[0].Domain == "" || leases[0].State != store.LeaseReleased {
		t.Fatalf("import leases %+v, want one released files lease of alice's with a domain", leases)
	}
	rows, err := e.st.ListJournal(ctx, store.JournalFilter{Project: p.ID})
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != 1 || strings.Join(rows[0].Argv, " ") != "git clone "+url || rows[0].Lease != leases[0].ID || rows[0].End.Outcome != store.OutcomeExit {
		t.Errorf("journal %+v, want the clone under its lease", rows)
	}

	// A clone that fails: no project, no live lease.
	if _, err := e.app.proj.Create(ctx, projects.ProjectSpec{Name: "broken", Kind: store.ProjectManaged, Git: "file://" + t.TempDir(), Owner: alice.ID}); err == nil {
		t.Fatal("an import of no repository succeeded")
	}
	if _, err := e.st.ProjectByName(ctx, "broken"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("the failed import's project: %v", err)
	}
	if n := e.liveLeases(); n != 0 {
		t.Errorf("%d live leases after a failed import", n)
	}
}
