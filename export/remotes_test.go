package export

import (
	"context"
	"errors"
	"net/http"
	"net/http/cgi"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/corral-sandbox/corral/store"
)

func TestMatchRemote(t *testing.T) {
	for _, tc := range []struct {
		pattern, remote string
		want            bool
	}{
		{"github.com/org/*", "https://github.com/org/repo", true},
		{"github.com/org/*", "https://github.com/org/repo.git", true},
		{"github.com/org/*", "https://GitHub.com/org/repo.git/", true},
		{"github.com/org/*", "https://x-access-token:t@github.com/org/repo.git", true},
		{"github.com/org/*", "https://github.com/org/team/repo", false},
		{"github.com/org/*", "https://github.com/orgx/repo", false},
		{"github.com/org/*", "https://github.com/org", false},
		{"github.com/org/*", "https://github.com:8443/org/repo", false},
		{"github.com/org/*", "https://github.com:443/org/repo", true},
		{"github.com/org/*", "https://github.com.evil.example/org/repo", false},
		{"github.com/org/*", "https://evil.example/github.com/org/repo", false},
		{"github.com/org/*", "https://github.com/org/../other/repo", false},
		{"github.com/org/**", "https://github.com/org/team/repo.git", true},
		{"github.com/org/**", "https://github.com/org", false},
		{"github.com/org/repo", "https://github.com/org/repo.git", true},
		{"github.com/org/repo", "https://github.com/org/repo2", false},
		{"127.0.0.1:*/**", "http://127.0.0.1:8080/a/b.git", true},
		{"/srv/git/**", "file:///srv/git/a.git", true},
		{"/srv/git/**", "file:///srv/gitx/a.git", false},
		{"/**", "file:///tmp/r.git", true},
	} {
		u, err := url.Parse(tc.remote)
		if err != nil {
			t.Fatal(err)
		}
		if got := matchRemote(tc.pattern, remoteKey(u)); got != tc.want {
			t.Errorf("%q matches %q (key %q): %v, want %v", tc.pattern, tc.remote, remoteKey(u), got, tc.want)
		}
	}
	for _, bad := range []string{"", "https://github.com/org/*", "a b", "user@github.com/x", "github.com/[", "x\ny"} {
		if ValidRemotePattern(bad) == nil {
			t.Errorf("pattern %q accepted", bad)
		}
	}
}

// TestCredentialBoundToRemote asks the host's git itself, through the
// exporter's configuration, for credentials: it has the token for the
// remote's exact URL and for nothing else (another host, port, path or
// scheme).
func TestCredentialBoundToRemote(t *testing.T) {
	remote, _ := url.Parse("http://127.0.0.1:8123/org/allowed.git")
	const token = "tok-0123456789abcdef"
	fill := func(protocol, host, path string) string {
		args := append([]string{"-c", "credential.helper="}, credentialArgs(remote)...)
		cmd := exec.Command("git", append(args, "credential", "fill")...)
		cmd.Env = append(baseEnv(t.TempDir()), envUsername+"="+DefaultUsername, envToken+"="+token)
		cmd.Stdin = strings.NewReader("protocol=" + protocol + "\nhost=" + host + "\npath=" + path + "\n\n")
		out, _ := cmd.CombinedOutput()
		return string(out)
	}
	if out := fill("http", "127.0.0.1:8123", "org/allowed.git"); !strings.Contains(out, "password="+token) {
		t.Fatalf("the remote's own URL got no token: %q", out)
	}
	for _, c := range [][3]string{
		{"http", "127.0.0.1:8123", "org/other.git"},
		{"http", "127.0.0.1:8123", ""},
		{"http", "127.0.0.1:9999", "org/allowed.git"},
		{"http", "evil.example", "org/allowed.git"},
		{"https", "127.0.0.1:8123", "org/allowed.git"},
	} {
		if out := fill(c[0], c[1], c[2]); strings.Contains(out, token) {
			t.Errorf("%s://%s/%s got the token: %q", c[0], c[1], c[2], out)
		}
	}
}

// recordingGitServer serves the bare repositories under root (git
// http-backend), demanding Basic authentication with the token, and
// records every request's path and Authorization header.
type recordingGitServer struct {
	*httptest.Server
	mu   sync.Mutex
	reqs []recorded
}

type recorded struct{ path, auth string }

func newRecordingGitServer(t *testing.T, root, token string) *recordingGitServer {
	t.Helper()
	backend := "/usr/lib/git-core/git-http-backend"
	if out, err := exec.Command("git", "--exec-path").Output(); err == nil {
		backend = filepath.Join(strings.TrimSpace(string(out)), "git-http-backend")
	}
	if _, err := os.Stat(backend); err != nil {
		t.Skipf("git http-backend not installed: %v", err)
	}
	h := &cgi.Handler{Path: backend, Root: "/", Env: []string{"GIT_PROJECT_ROOT=" + root, "GIT_HTTP_EXPORT_ALL=1", "GIT_CONFIG_NOSYSTEM=1"}}
	s := &recordingGitServer{}
	s.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.mu.Lock()
		s.reqs = append(s.reqs, recorded{r.URL.Path, r.Header.Get("Authorization")})
		s.mu.Unlock()
		if _, p, ok := r.BasicAuth(); !ok || p != token {
			w.Header().Set("WWW-Authenticate", `Basic realm="git"`)
			http.Error(w, "authentication required", http.StatusUnauthorized)
			return
		}
		h.ServeHTTP(w, r)
	}))
	t.Cleanup(s.Close)
	return s
}

func (s *recordingGitServer) requests() []recorded {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]recorded(nil), s.reqs...)
}

// TestExportRemoteAllowlist: a remote the daemon does not list, or the
// project does not list, is refused before anything runs or any request
// reaches it; a listed one receives the token, on its own URL only.
func TestExportRemoteAllowlist(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	root := t.TempDir()
	for _, r := range []string{"org/allowed.git", "org/other.git", "elsewhere/r.git"} {
		dir := filepath.Join(root, r)
		git(t, "/", "init", "-q", "--bare", dir)
		git(t, dir, "config", "http.receivepack", "true")
	}
	const token = "ghp_AllowlistToken0123456789"
	srv := newRecordingGitServer(t, root, token)
	hostPort := strings.TrimPrefix(srv.URL, "http://")
	export := func(allowed []string, remote string) error {
		x, err := New(e.core, Options{AllowInsecure: true, Token: token, AllowedRemotes: allowed, Logger: testLogger(t)})
		must(t, err)
		_, err = x.Export(ctx, Request{Actor: e.alice, Project: e.p.ID, Remote: remote, Branch: "main", ExpectedHead: e.head})
		return err
	}
	refused := func(what string, err error) {
		t.Helper()
		if !errors.Is(err, ErrRemoteNotAllowed) {
			t.Fatalf("%s: %v, want ErrRemoteNotAllowed", what, err)
		}
		if n := len(srv.requests()); n != 0 {
			t.Fatalf("%s: the server received %d requests", what, n)
		}
		if entries, err := e.st.ListJournal(ctx, store.JournalFilter{}); err != nil || len(entries) != 0 {
			t.Fatalf("%s: %d commands ran in the machine (%v)", what, len(entries), err)
		}
	}
	refused("no remotes configured", export([]string{}, srv.URL+"/org/allowed.git"))
	daemonList := []string{hostPort + "/org/*"}
	refused("unlisted remote", export(daemonList, srv.URL+"/elsewhere/r.git"))
	refused("unlisted with credentials", export(daemonList, "http://u:p@"+hostPort+"/elsewhere/r.git"))
	must(t, e.st.SetExportRemotes(ctx, e.p.ID, []string{hostPort + "/org/allowed.git"}))
	refused("not the project's", export(daemonList, srv.URL+"/org/other.git"))

	if err := export(daemonList, srv.URL+"/org/allowed.git"); err != nil {
		t.Fatal(err)
	}
	if got := git(t, "/", "--git-dir", filepath.Join(root, "org/allowed.git"), "rev-parse", "refs/heads/main"); got != e.head {
		t.Errorf("remote main %s", got)
	}
	var authed int
	for _, r := range srv.requests() {
		if r.auth == "" {
			continue
		}
		authed++
		if !strings.HasPrefix(r.path, "/org/allowed.git/") {
			t.Errorf("credentials sent to %s", r.path)
		}
	}
	if authed == 0 {
		t.Error("the listed remote never received the token")
	}
}
