package daemon

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/cgi"
	"net/http/httptest"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/corral-sandbox/corral/projects"
	"github.com/corral-sandbox/corral/store"
)

// TestHostPathGrants: with --allow-host-paths, only accounts an admin
// granted host paths may name them, and nobody may name "/", the state
// directory, anything in it or a directory containing it.
func TestHostPathGrants(t *testing.T) {
	e := newEnv(t, envOpts{app: AppOptions{AllowHostPaths: true}})
	carol, tok := e.account("carol")
	ctx := context.Background()
	dir := t.TempDir()
	repo := t.TempDir()
	runGit(t, repo, "init", "-q")
	create := func(req map[string]string) (int, string) {
		t.Helper()
		status, body := e.do(ctx, "POST", "/v1/projects", tok, req)
		return status, string(body)
	}
	n := 0
	name := func() string { n++; return fmt.Sprintf("p%d", n) }
	hostPathRequests := func(root string) []map[string]string {
		return []map[string]string{
			{"name": name(), "kind": "host", "root": root},
			{"name": name(), "from": root},
			{"name": name(), "git": "file://" + root},
			{"name": name(), "git": root},
		}
	}
	// Not granted: every host path is refused, with a way forward.
	for _, req := range hostPathRequests(repo) {
		if status, body := create(req); status != 403 || !strings.Contains(body, "corral account grant host-paths carol") {
			t.Errorf("not granted %v: %d %s", req, status, body)
		}
	}
	if err := e.st.SetHostPaths(ctx, carol.ID, true); err != nil {
		t.Fatal(err)
	}
	for _, req := range hostPathRequests(repo) {
		if status, body := create(req); status != 201 {
			t.Errorf("granted %v: %d %s", req, status, body)
		}
	}
	// Never /, the state directory, inside it or above it — also through
	// a symbolic link.
	link := filepath.Join(dir, "state-link")
	if err := os.Symlink(e.dir, link); err != nil {
		t.Fatal(err)
	}
	for _, root := range []string{"/", e.dir, filepath.Dir(e.dir), projects.WorkspacesDir(e.dir), link} {
		for _, req := range hostPathRequests(root) {
			if status, body := create(req); status != 403 {
				t.Errorf("%v: %d %s", req, status, body)
			}
		}
	}
	// Another project's workspace is in the state directory.
	box := e.managedProject("box", carol)
	if status, body := create(map[string]string{"name": name(), "from": box.Root}); status != 403 {
		t.Errorf("from another workspace: %d %s", status, body)
	}
	// The CLI's path (Projects.Create) refuses them too.
	for _, root := range []string{"/", e.dir, filepath.Dir(e.dir)} {
		if _, err := e.app.Projects().Create(ctx, projects.ProjectSpec{Name: name(), Kind: store.ProjectHost, Root: root}); !errors.Is(err, projects.ErrHostPath) {
			t.Errorf("Create host %s: %v", root, err)
		}
	}
	// Trusted members (unconfined host commands) are granted only by an
	// owner holding host paths.
	_, _ = e.account("dave")
	members := fmt.Sprintf("/v1/projects/%d/members", box.ID)
	if err := e.st.SetHostPaths(ctx, carol.ID, false); err != nil {
		t.Fatal(err)
	}
	if status, body := e.do(ctx, "POST", members, tok, map[string]any{"account": "dave", "trusted": true}); status != 403 {
		t.Errorf("trusted member by a non-granted owner: %d %s", status, body)
	}
	if err := e.st.SetHostPaths(ctx, carol.ID, true); err != nil {
		t.Fatal(err)
	}
	if status, body := e.do(ctx, "POST", members, tok, map[string]any{"account": "dave", "trusted": true}); status != 201 {
		t.Errorf("trusted member by a granted owner: %d %s", status, body)
	}
	// Export remotes given at creation are checked and stored.
	if status, body := e.do(ctx, "POST", "/v1/projects", tok, map[string]any{"name": name(), "exportRemotes": []string{"https://github.com/x/*"}}); status != 400 {
		t.Errorf("bad export remote pattern: %d %s", status, body)
	}
	status, body := e.do(ctx, "POST", "/v1/projects", tok, map[string]any{"name": "exp", "exportRemotes": []string{"github.com/org/*"}})
	if status != 201 {
		t.Fatalf("project with export remotes: %d %s", status, body)
	}
	if exp, err := e.st.ProjectByName(ctx, "exp"); err != nil {
		t.Fatal(err)
	} else if got, err := e.st.ExportRemotes(ctx, exp.ID); err != nil || len(got) != 1 || got[0] != "github.com/org/*" {
		t.Errorf("stored export remotes %q %v", got, err)
	}
	// Revoked: refused again.
	if err := e.st.SetHostPaths(ctx, carol.ID, false); err != nil {
		t.Fatal(err)
	}
	if status, body := create(map[string]string{"name": name(), "kind": "host", "root": dir}); status != 403 {
		t.Errorf("revoked: %d %s", status, body)
	}
}

// gitServer serves the repositories under root with git http-backend and
// records each request's Authorization header.
type gitServer struct {
	*httptest.Server
	mu    sync.Mutex
	reqs  int
	auths []string
}

func newGitServer(t *testing.T, root string) *gitServer {
	t.Helper()
	backend := "/usr/lib/git-core/git-http-backend"
	if out, err := exec.Command("git", "--exec-path").Output(); err == nil {
		backend = filepath.Join(strings.TrimSpace(string(out)), "git-http-backend")
	}
	if _, err := os.Stat(backend); err != nil {
		t.Skipf("git http-backend not installed: %v", err)
	}
	h := &cgi.Handler{Path: backend, Root: "/", Env: []string{"GIT_PROJECT_ROOT=" + root, "GIT_HTTP_EXPORT_ALL=1", "GIT_CONFIG_NOSYSTEM=1"}}
	s := &gitServer{}
	s.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.mu.Lock()
		s.reqs++
		if a := r.Header.Get("Authorization"); a != "" {
			s.auths = append(s.auths, a)
		}
		s.mu.Unlock()
		h.ServeHTTP(w, r)
	}))
	t.Cleanup(s.Close)
	return s
}

func (s *gitServer) seen() (int, []string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.reqs, append([]string(nil), s.auths...)
}

type fakeResolver map[string]netip.Addr

func (f fakeResolver) LookupNetIP(_ context.Context, _, host string) ([]netip.Addr, error) {
	if a, ok := f[host]; ok {
		return []netip.Addr{a}, nil
	}
	return nil, errors.New("no such host")
}

// TestGitImportSSRF: a git import of a URL on host loopback is refused
// before any request reaches it (also by name, over HTTP, and for the
// metadata address); with the range allowed it works, pinned to the
// address checked, without the host's git configuration or credentials,
// and a network failure is one generic message.
func TestGitImportSSRF(t *testing.T) {
	root := t.TempDir()
	repo := filepath.Join(root, "r.git")
	work := t.TempDir()
	runGit(t, work, "init", "-q", "-b", "main")
	if err := os.WriteFile(filepath.Join(work, "README"), []byte("imported\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	runGit(t, work, "add", "README")
	runGit(t, work, "commit", "-q", "-m", "init")
	runGit(t, "/", "clone", "-q", "--bare", work, repo)
	srv := newGitServer(t, root)
	port := srv.URL[strings.LastIndexByte(srv.URL, ':')+1:]

	// The host's own git configuration sends a credential to every server.
	hostConfig := filepath.Join(t.TempDir(), "gitconfig")
	if err := os.WriteFile(hostConfig, []byte("[http]\n\textraHeader = Authorization: Bearer HOST-SECRET\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("GIT_CONFIG_GLOBAL", hostConfig)

	e := newEnv(t, envOpts{})
	ctx := context.Background()
	n := 0
	var progress []string
	create := func(o projects.GitImportOptions, url string) (store.Project, error) {
		n++
		ps := &projects.Projects{Store: e.st, StateDir: e.dir, GitImport: o}
		return ps.Create(ctx, projects.ProjectSpec{Name: fmt.Sprintf("g%d", n), Kind: store.ProjectManaged, Git: url,
			Progress: func(l string) { progress = append(progress, l) }})
	}
	loopbackByName := fakeResolver{"repo.corral.test": netip.MustParseAddr("127.0.0.1"), "private.corral.test": netip.MustParseAddr("10.0.0.1")}
	for _, url := range []string{
		srv.URL + "/r.git",
		"http://localhost:" + port + "/r.git",
		"http://[::1]:" + port + "/r.git",
		"http://[::ffff:127.0.0.1]:" + port + "/r.git",
		"http://repo.corral.test:" + port + "/r.git",
		"http://169.254.169.254/latest/meta-data/",
		"http://[fd00:ec2::254]/",
		"http://0.0.0.0:" + port + "/r.git",
		"http://100.64.0.1/r.git",
		"http://2130706433:" + port + "/r.git",
		"http://0x7f.1:" + port + "/r.git",
		"http://127.1:" + port + "/r.git",
		"ssh://127.0.0.1/r.git",
		"git://127.0.0.1/r.git",
		"ext::sh -c id",
	} {
		o := projects.GitImportOptions{Resolver: loopbackByName}
		if url == "http://localhost:"+port+"/r.git" {
			o.Resolver = nil // the real resolver
		}
		if _, err := create(o, url); !errors.Is(err, projects.ErrGitImport) {
			t.Errorf("%s: %v, want projects.ErrGitImport", url, err)
		}
	}
	if reqs, _ := srv.seen(); reqs != 0 || len(progress) != 0 {
		t.Fatalf("refused imports reached the server %d times, progress %q", reqs, progress)
	}
	// Over HTTP: 403.
	_, tok := e.account("mallory")
	if status, body := e.do(ctx, "POST", "/v1/projects", tok, map[string]string{"name": "ssrf", "git": srv.URL + "/r.git"}); status != 403 {
		t.Errorf("HTTP import of a loopback URL: %d %s", status, body)
	}
	if reqs, _ := srv.seen(); reqs != 0 {
		t.Fatalf("the HTTP import reached the server %d times", reqs)
	}

	// Allowed by the operator: it works, by address and by a name only the
	// daemon's resolver knows (git connects to the pinned address).
	allow := projects.GitImportOptions{AllowCIDRs: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}, Resolver: loopbackByName}
	for _, url := range []string{srv.URL + "/r.git", "http://repo.corral.test:" + port + "/r.git"} {
		p, err := create(allow, url)
		if err != nil {
			t.Fatalf("%s: %v", url, err)
		}
		if b, err := os.ReadFile(filepath.Join(p.Root, "README")); err != nil || string(b) != "imported\n" {
			t.Errorf("%s: cloned README %q %v", url, b, err)
		}
	}
	if !strings.Contains(strings.Join(progress, "\n"), "objects") {
		t.Errorf("no clone progress reported: %q", progress)
	}
	if reqs, auths := srv.seen(); reqs == 0 || len(auths) != 0 {
		t.Errorf("%d requests; the host's credentials were sent: %q", reqs, auths)
	}
	// A name resolving to a range not allowed stays refused.
	if _, err := create(allow, "http://private.corral.test/r.git"); !errors.Is(err, projects.ErrGitImport) {
		t.Errorf("private name: %v", err)
	}
	// Network failures do not tell how a port answered (nor does progress).
	progress = nil
	ln, err := netListenClosed()
	if err != nil {
		t.Fatal(err)
	}
	_, err = create(allow, "http://"+ln+"/r.git")
	if err == nil || !strings.Contains(err.Error(), "connection failed") || strings.Contains(strings.ToLower(err.Error()), "refused") {
		t.Errorf("closed port: %v", err)
	}
	for _, l := range progress {
		if strings.Contains(strings.ToLower(l), "refused") || strings.Contains(strings.ToLower(l), "failed to connect") {
			t.Errorf("progress tells the network failure: %q", l)
		}
	}
}

// netListenClosed returns a loopback address nobody listens on.
func netListenClosed() (string, error) {
	s := httptest.NewServer(http.NotFoundHandler())
	addr := strings.TrimPrefix(s.URL, "http://")
	s.Close()
	return addr, nil
}
