package daemon

import (
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/corral-sandbox/corral/api"
	"github.com/corral-sandbox/corral/projects"
	"github.com/corral-sandbox/corral/sandbox"
	"github.com/corral-sandbox/corral/sandbox/sandboxtest"
	"github.com/corral-sandbox/corral/store"
)

// TestEveryProjectRouteRefusesOutsiders walks every registered
// /v1/projects/{id}/… route with a token of another account: each refuses
// it, and answers exactly as for a project that does not exist (no route
// tells an outsider which ids exist). A member who is not an owner is
// refused every route that changes the project for everyone.
func TestEveryProjectRouteRefusesOutsiders(t *testing.T) {
	fake := &sandboxtest.Provider{Dir: t.TempDir(), Kind: sandbox.ProjectManaged}
	e := newEnv(t, envOpts{fake: fake})
	ctx := context.Background()
	alice, _ := e.account("alice")
	bob, bobTok := e.account("bob")
	_, stranger := e.account("mallory")
	p := e.managedProject("box", alice)
	if _, err := e.st.AddMember(ctx, store.Member{Project: p.ID, Account: bob.ID, Role: store.RoleMember}); err != nil {
		t.Fatal(err)
	}
	missing := p.ID + 1000
	ownerOnly := map[string]bool{
		"DELETE /v1/projects/{id}":       true,
		"PUT /v1/projects/{id}/machine":  true,
		"POST /v1/projects/{id}/reset":   true,
		"POST /v1/projects/{id}/members": true,
		"PUT /v1/projects/{id}/egress":   true,
	}
	bodies := map[string]any{
		"POST /v1/projects/{id}/commands":    cmdBody("true"),
		"POST /v1/projects/{id}/members":     api.MemberRequest{Account: "mallory"},
		"PUT /v1/projects/{id}/machine":      api.Machine{Limits: api.Limits{Pids: -1}},
		"PUT /v1/projects/{id}/egress":       api.EgressPolicy{Mode: "proxy", Allow: []string{"example.com"}},
		"PUT /v1/projects/{id}/sites/{name}": map[string]any{"port": 8080},
		"POST /v1/projects/{id}/export":      map[string]any{"branch": "main", "remote": "https://github.com/a/b"},
	}
	path := func(pattern string, id int64) string {
		s := strings.ReplaceAll(pattern, "{id}", strconv.FormatInt(id, 10))
		s = strings.ReplaceAll(s, "{name}", "web")
		s = strings.ReplaceAll(s, "{server}", "gopls")
		return strings.ReplaceAll(s, "{path...}", "")
	}
	var walked int
	for _, rt := range e.app.Routes() {
		if !strings.HasPrefix(rt.Pattern, "/v1/projects/{id}") {
			continue
		}
		walked++
		key := rt.Method + " " + rt.Pattern
		body := bodies[key]
		s1, b1 := e.do(ctx, rt.Method, path(rt.Pattern, p.ID), stranger, body)
		s2, b2 := e.do(ctx, rt.Method, path(rt.Pattern, missing), stranger, body)
		b2 = bytes.ReplaceAll(b2, []byte(strconv.FormatInt(missing, 10)), []byte(strconv.FormatInt(p.ID, 10)))
		if s1 < 400 || s1 != s2 || !bytes.Equal(b1, b2) {
			t.Errorf("%s as an outsider: existing %d %s, missing %d %s", key, s1, b1, s2, b2)
		}
		if ownerOnly[key] {
			if s, b := e.do(ctx, rt.Method, path(rt.Pattern, p.ID), bobTok, body); s != http.StatusForbidden {
				t.Errorf("%s as a member: %d %s", key, s, b)
			}
		}
	}
	if walked < 15 {
		t.Fatalf("walked %d project routes", walked)
	}
	if got, err := e.st.GetProject(ctx, p.ID); err != nil || got.Limits != (store.MachineLimits{}) {
		t.Errorf("project after the walk: %+v %v", got, err)
	}
	if ms, err := e.st.ListMembers(ctx, p.ID); err != nil || len(ms) != 2 {
		t.Errorf("members after the walk: %+v %v", ms, err)
	}
}

// TestAccountProjectQuota is an attack: any account could create projects
// without bound, and each managed project takes one of the worker's host
// id ranges at its first command (worker.DefaultMaxProjects, 1024, for
// every account together): one account creating 1024 projects and running
// `true` in each leaves every other tenant's new projects failing with
// "too many projects", besides growing the state directory at will. An
// account that is not an admin creates at most
// AppOptions.MaxAccountProjects projects; beyond, POST /v1/projects is 403
// and nothing is created.
func TestAccountProjectQuota(t *testing.T) {
	e := newEnv(t, envOpts{app: AppOptions{Admins: []string{"root"}, MaxAccountProjects: 3}})
	ctx := context.Background()
	mallory, tok := e.account("mallory")
	_, rootTok := e.account("root")
	// Projects others made mallory an owner of do not count: anyone
	// could otherwise use up another account's quota.
	alice, _ := e.account("alice")
	for i := range 3 {
		p := e.managedProject(fmt.Sprintf("a%d", i), alice)
		if _, err := e.st.AddMember(ctx, store.Member{Project: p.ID, Account: mallory.ID, Role: store.RoleOwner}); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 3 {
		if status, body := e.do(ctx, "POST", "/v1/projects", tok, api.ProjectRequest{Name: fmt.Sprintf("p%d", i)}); status != http.StatusCreated {
			t.Fatalf("project %d within the quota: %d %s", i, status, body)
		}
	}
	status, body := e.do(ctx, "POST", "/v1/projects", tok, api.ProjectRequest{Name: "one-too-many"})
	if status != http.StatusForbidden || !strings.Contains(string(body), "created 3 projects") {
		t.Errorf("project beyond the quota: %d %s", status, body)
	}
	all, err := e.st.ListProjects(ctx)
	if err != nil || len(all) != 6 {
		t.Errorf("projects: %d, %v", len(all), err)
	}
	for i := range 4 {
		if status, body := e.do(ctx, "POST", "/v1/projects", rootTok, api.ProjectRequest{Name: fmt.Sprintf("r%d", i)}); status != http.StatusCreated {
			t.Errorf("admin's project %d: %d %s", i, status, body)
		}
	}
}

// TestTokenMintingBounded is an attack: an account may mint tokens for
// itself, and a token's name was stored whole (a request body's worth, a
// megabyte a request) with no bound on how many: one account grew the
// database at will. Names are at most MaxTokenName bytes and an account
// that is not an admin holds at most MaxAccountTokens live tokens.
func TestTokenMintingBounded(t *testing.T) {
	e := newEnv(t, envOpts{})
	ctx := context.Background()
	_, tok := e.account("mallory") // one live token already
	path := "/v1/accounts/mallory/tokens"
	if status, body := e.do(ctx, "POST", path, tok, map[string]string{"name": strings.Repeat("x", 512<<10)}); status != http.StatusBadRequest {
		t.Errorf("a token with a huge name: %d %.200s", status, body)
	}
	for i := 1; i < MaxAccountTokens; i++ {
		if status, body := e.do(ctx, "POST", path, tok, map[string]string{"name": fmt.Sprint(i)}); status != http.StatusCreated {
			t.Fatalf("token %d: %d %s", i, status, body)
		}
	}
	if status, body := e.do(ctx, "POST", path, tok, map[string]string{"name": "one-too-many"}); status != http.StatusForbidden {
		t.Errorf("a token beyond the bound: %d %s", status, body)
	}
}

// TestCommandInputAdmitted is an attack: a command request may carry 16
// MiB of stdin (as about 21 MiB of base64 JSON), which the daemon read and
// decoded before any admission, and kept while the command ran; the
// budget counted only output limits, so one account's concurrent uploads
// took the daemon's memory past every budget. A body that may carry stdin
// reserves twice its size against the captured-bytes budget before it is
// read: over the budget it is 429, its body unread.
func TestCommandInputAdmitted(t *testing.T) {
	fake := &sandboxtest.Provider{Dir: t.TempDir(), Kind: sandbox.ProjectManaged}
	lim := sandbox.NewLimiter(sandbox.Budget{}, sandbox.Budget{CapturedBytes: 24 << 20})
	e := newEnv(t, envOpts{fake: fake, control: sandbox.ControlOptions{Admitter: lim}})
	alice, tok := e.account("alice")
	p := e.managedProject("box", alice)
	ctx := context.Background()
	// 12 MiB of stdin, 16 MiB of base64: 32 MiB to reserve.
	stdin := base64.StdEncoding.EncodeToString(bytes.Repeat([]byte("x"), 12<<20))
	body := map[string]any{"command": map[string]any{"type": "argv", "file": "true"}, "stdin": stdin}
	status, resp := e.do(ctx, "POST", commandsPath(p.ID), tok, body)
	if status != http.StatusTooManyRequests || !strings.Contains(string(resp), "input") {
		t.Fatalf("12 MiB of stdin under a 24 MiB budget: %d %.300s", status, resp)
	}
	if fake.Calls() != 0 {
		t.Error("a refused command reached the provider")
	}
	if _, u := lim.Usage(alice.ID); u.CapturedBytes != 0 {
		t.Errorf("reserved after the refusal: %+v", u)
	}
	// A small input fits.
	body["stdin"] = base64.StdEncoding.EncodeToString([]byte("hello"))
	if status, resp := e.do(ctx, "POST", commandsPath(p.ID), tok, body); status != http.StatusOK {
		t.Errorf("small stdin: %d %s", status, resp)
	}
}

// TestGitImportBombRefused is an attack: a project created from a git URL
// (any account may, from a public server) was checked out whole on the
// host, outside every machine's limits: a "git bomb" of a few objects (a
// tree of trees of the same blob) expands to billions of files and fills
// the host's disk and inodes. The clone is checked before its checkout:
// beyond GitImportOptions.MaxFiles files (or MaxBytes bytes) the import is
// refused and nothing is left.
func TestGitImportBombRefused(t *testing.T) {
	st, err := store.Open(context.Background(), filepath.Join(t.TempDir(), "corral.db"), store.Options{Migrate: true})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	state := t.TempDir()
	ps := &projects.Projects{Store: st, StateDir: state, Logger: testLogger(t), GitImport: projects.GitImportOptions{MaxFiles: 1000, MaxBytes: 1 << 20}}
	ctx := context.Background()
	repo := t.TempDir()
	git := func(stdin string, args ...string) string {
		t.Helper()
		cmd := exec.Command("git", append([]string{"-C", repo, "-c", "user.name=t", "-c", "user.email=t@example.com"}, args...)...)
		cmd.Stdin = strings.NewReader(stdin)
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("git %v: %v", args, err)
		}
		return strings.TrimSpace(string(out))
	}
	git("", "init", "-q")
	obj, mode, typ := git("boom\n", "hash-object", "-w", "--stdin"), "100644", "blob"
	for range 4 { // 10^4 files from 5 objects
		var tree strings.Builder
		for i := range 10 {
			fmt.Fprintf(&tree, "%s %s %s\td%d\n", mode, typ, obj, i)
		}
		obj, mode, typ = git(tree.String(), "mktree"), "040000", "tree"
	}
	git("", "update-ref", "refs/heads/main", git("", "commit-tree", obj, "-m", "bomb"))
	git("", "symbolic-ref", "HEAD", "refs/heads/main")

	_, err = ps.Create(ctx, projects.ProjectSpec{Name: "bomb", Kind: store.ProjectManaged, Git: "file://" + repo})
	if !errors.Is(err, projects.ErrGitImport) || !strings.Contains(err.Error(), "more than 1000 files") {
		t.Fatalf("git bomb import: %v", err)
	}
	if left, _ := os.ReadDir(projects.WorkspacesDir(state)); len(left) != 0 {
		t.Errorf("left in the workspaces: %v", left)
	}
	// A repository within the bounds imports.
	small := t.TempDir()
	for _, args := range [][]string{{"init", "-q"}, {"commit", "-q", "--allow-empty", "-m", "x"}} {
		if out, err := exec.Command("git", append([]string{"-C", small, "-c", "user.name=t", "-c", "user.email=t@example.com"}, args...)...).CombinedOutput(); err != nil {
			t.Fatalf("git %v: %v %s", args, err, out)
		}
	}
	if err := os.WriteFile(filepath.Join(small, "README"), []byte("ok"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{{"add", "README"}, {"commit", "-q", "-m", "readme"}} {
		if out, err := exec.Command("git", append([]string{"-C", small, "-c", "user.name=t", "-c", "user.email=t@example.com"}, args...)...).CombinedOutput(); err != nil {
			t.Fatalf("git %v: %v %s", args, err, out)
		}
	}
	p, err := ps.Create(ctx, projects.ProjectSpec{Name: "small", Kind: store.ProjectManaged, Git: "file://" + small})
	if err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(p.Root, "README")); err != nil || string(b) != "ok" {
		t.Errorf("checked out: %q %v", b, err)
	}
}

// TestGitImportsBounded is an attack: every POST /v1/projects with a git
// URL ran a clone on the host (as the daemon's user, in no cgroup) for up
// to CloneTimeout, with no bound on how many at once: one account naming a
// server that answers slowly ran a thousand git processes on the host. An
// account that is not an admin runs at most MaxAccountImports imports at
// once (and the daemon MaxImports); beyond, 429 with Retry-After.
func TestGitImportsBounded(t *testing.T) {
	// A "git server" that accepts and never answers.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan net.Conn, 16)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			accepted <- c
		}
	}()
	e := newEnv(t, envOpts{app: AppOptions{GitImport: projects.GitImportOptions{AllowCIDRs: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}}}})
	_, tok := e.account("mallory")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	url := "http://" + ln.Addr().String() + "/x.git"
	// post is e.do for a goroutine: the request's error is the
	// cancellation below.
	post := func(name string) {
		req, _ := http.NewRequestWithContext(ctx, "POST", "http://corral/v1/projects",
			strings.NewReader(fmt.Sprintf(`{"name":%q,"git":%q}`, name, url)))
		req.Header.Set("Authorization", "Bearer "+tok)
		if resp, err := e.http.Do(req); err == nil {
			resp.Body.Close()
		}
	}
	first := make(chan struct{})
	go func() {
		defer close(first)
		post("slow0")
	}()
	select {
	case c := <-accepted: // the first clone is under way
		defer c.Close()
	case <-time.After(10 * time.Second):
		t.Fatal("the first import never connected")
	}
	for i := 1; i < MaxAccountImports; i++ {
		go post(fmt.Sprintf("slow%d", i))
		select {
		case c := <-accepted:
			defer c.Close()
		case <-time.After(10 * time.Second):
			t.Fatalf("import %d never connected", i)
		}
	}
	// Without the bound this one hangs like the others: 10 s fail it.
	bctx, bcancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer bcancel()
	status, body := e.do(bctx, "POST", "/v1/projects", tok, api.ProjectRequest{Name: "one-too-many", Git: url})
	if status != http.StatusTooManyRequests || !strings.Contains(string(body), "imports") {
		t.Errorf("an import beyond the bound: %d %s", status, body)
	}
	cancel()
	<-first
}
