package daemon

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/corral-sandbox/corral/export"
	"github.com/corral-sandbox/corral/internal/testenv"
	"github.com/corral-sandbox/corral/internal/testworker"
	"github.com/corral-sandbox/corral/machine"
	"github.com/corral-sandbox/corral/store"
)

// gitEnv is a daemon over a real in-process worker (internal/testworker)
// with the given app options.
type gitEnv struct {
	*env
	w *testworker.Worker
}

func newGitEnv(t *testing.T, app AppOptions) *gitEnv {
	t.Helper()
	w := testworker.Start(t, testworker.Options{})
	e := newEnv(t, envOpts{transport: machine.SocketTransport{Path: w.Socket}, app: app})
	return &gitEnv{env: e, w: w}
}

// repoProject creates a managed project (workspace under the worker's
// root) owned by owner, its workspace a Git repository with one commit on
// main; it returns the project and the head.
func (g *gitEnv) repoProject(name string, owner store.Account) (store.Project, string) {
	g.t.Helper()
	ctx := context.Background()
	p, err := g.st.CreateProject(ctx, store.NewProject{Kind: store.ProjectManaged, Name: name, Root: g.w.Workspace(g.t, name)})
	if err != nil {
		g.t.Fatal(err)
	}
	if _, err := g.st.AddMember(ctx, store.Member{Project: p.ID, Account: owner.ID, Role: store.RoleOwner}); err != nil {
		g.t.Fatal(err)
	}
	runGit(g.t, p.Root, "init", "-q", "-b", "main")
	return p, commitFile(g.t, p.Root, "README", "hello\n")
}

// runGit runs the host's git in dir and returns its trimmed output.
func runGit(t *testing.T, dir string, args ...string) string {
	t.Helper()
	// The test, as root, works in a workspace its machine now owns
	// (the worker gave it to the project): git's ownership check would
	// refuse it, as it should for any other host git.
	cmd := exec.Command("git", append([]string{"-c", "safe.directory=*"}, args...)...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GIT_CONFIG_NOSYSTEM=1", "GIT_CONFIG_GLOBAL=/dev/null",
		"GIT_AUTHOR_NAME=t", "GIT_AUTHOR_EMAIL=t@example.com", "GIT_COMMITTER_NAME=t", "GIT_COMMITTER_EMAIL=t@example.com")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("git %v: %v\n%s", args, err, out)
	}
	return strings.TrimSpace(string(out))
}

// commitFile writes and commits a file in the repository at dir and
// returns the new head.
func commitFile(t *testing.T, dir, name, content string) string {
	t.Helper()
	if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	runGit(t, dir, "add", name)
	runGit(t, dir, "commit", "-q", "-m", "add "+name)
	return runGit(t, dir, "rev-parse", "HEAD")
}

func exportPath(id int64) string { return fmt.Sprintf("/v1/projects/%d/export", id) }

// journalLen counts the commands journaled so far.
func (e *env) journalLen() int {
	e.t.Helper()
	j, err := e.st.ListJournal(context.Background(), store.JournalFilter{Limit: 1000})
	if err != nil {
		e.t.Fatal(err)
	}
	return len(j)
}

// TestExportRoute pushes a branch through the daemon into a local bare
// repository, then checks the 409 of a moved head and the refusals.
func TestExportRoute(t *testing.T) {
	remotes := t.TempDir()
	g := newGitEnv(t, AppOptions{Export: export.Options{AllowInsecure: true, AllowedRemotes: []string{remotes + "/*"}}})
	alice, tok := g.account("alice")
	p, head := g.repoProject("box", alice)
	remote := filepath.Join(remotes, "remote.git")
	runGit(t, "/", "init", "-q", "--bare", remote)
	ctx := context.Background()

	// A remote the daemon does not list: 403 before anything runs.
	other := filepath.Join(t.TempDir(), "other.git")
	runGit(t, "/", "init", "-q", "--bare", other)
	status, body := g.do(ctx, "POST", exportPath(p.ID), tok, map[string]string{"remote": other, "branch": "main", "expectedHead": head})
	if kind, _, _, _ := apiError(t, body); status != 403 || kind != KindForbidden {
		t.Fatalf("unlisted remote: %d %s", status, body)
	}

	status, body = g.do(ctx, "POST", exportPath(p.ID), tok, map[string]string{"remote": remote, "branch": "main", "expectedHead": head})
	if status != 200 {
		t.Fatalf("export: %d %s", status, body)
	}
	var res map[string]any
	if err := json.Unmarshal(body, &res); err != nil || res["pushed"] != true || res["head"] != head || res["remote"] != remote || len(res) != 3 {
		t.Errorf("body %s (%v)", body, err)
	}
	if got := runGit(t, "/", "--git-dir", remote, "rev-parse", "refs/heads/main"); got != head {
		t.Errorf("remote main is %s, want %s", got, head)
	}
	arts, err := g.st.ListArtifacts(ctx, p.ID, true)
	if err != nil || len(arts) != 1 || arts[0].Deleted.IsZero() || !strings.HasPrefix(arts[0].Path, export.BundlePrefix) {
		t.Errorf("artifacts %+v %v", arts, err)
	}

	// The branch moved: 409 headMoved naming the actual head.
	newHead := commitFile(t, p.Root, "b.txt", "b\n")
	status, body = g.do(ctx, "POST", exportPath(p.ID), tok, map[string]string{"remote": remote, "branch": "main", "expectedHead": head})
	if kind, msg, _, _ := apiError(t, body); status != 409 || kind != KindHeadMoved || !strings.Contains(msg, newHead) {
		t.Errorf("moved head: %d %s", status, body)
	}
	if got := runGit(t, "/", "--git-dir", remote, "rev-parse", "refs/heads/main"); got != head {
		t.Errorf("remote main moved to %s", got)
	}

	cases := []struct {
		name   string
		body   any
		status int
		kind   string
	}{
		{"no branch", map[string]string{"remote": remote, "branch": "nope", "expectedHead": newHead}, 404, KindNotFound},
		{"ssh remote", map[string]string{"remote": "ssh://git@example.com/r.git", "branch": "main", "expectedHead": newHead}, 400, KindInvalid},
		{"bad head", map[string]string{"remote": remote, "branch": "main", "expectedHead": "HEAD"}, 400, KindInvalid},
		{"unknown field", map[string]string{"remote": remote, "branch": "main", "expectedHead": newHead, "force": "yes"}, 400, KindInvalid},
		{"not json", "{", 400, KindInvalid},
	}
	for _, c := range cases {
		status, body := g.do(ctx, "POST", exportPath(p.ID), tok, c.body)
		if kind, _, _, _ := apiError(t, body); status != c.status || kind != c.kind {
			t.Errorf("%s: %d %s", c.name, status, body)
		}
	}
	// The workspace is not a repository.
	if err := os.Rename(filepath.Join(p.Root, ".git"), filepath.Join(p.Root, "git.off")); err != nil {
		t.Fatal(err)
	}
	status, body = g.do(ctx, "POST", exportPath(p.ID), tok, map[string]string{"remote": remote, "branch": "main", "expectedHead": newHead})
	if kind, _, _, _ := apiError(t, body); status != 409 || kind != KindNotRepository {
		t.Errorf("not a repository: %d %s", status, body)
	}
	if n := g.liveLeases(); n != 0 {
		t.Errorf("%d live leases", n)
	}
}

// TestExportRefusedBeforeProvider: anonymous, stranger and unknown project
// are answered from the database; nothing runs, nothing is recorded. A
// daemon with the default options refuses a local remote.
func TestExportRefusedBeforeProvider(t *testing.T) {
	g := newGitEnv(t, AppOptions{})
	alice, tok := g.account("alice")
	_, stranger := g.account("mallory")
	p, head := g.repoProject("box", alice)
	ctx := context.Background()
	body := map[string]string{"remote": "https://example.com/r.git", "branch": "main", "expectedHead": head}
	for _, c := range []struct {
		token  string
		id     int64
		status int
	}{{"", p.ID, 401}, {"bogus", p.ID, 401}, {stranger, p.ID, 403}, {tok, p.ID + 10, 403}} {
		status, b := g.do(ctx, "POST", exportPath(c.id), c.token, body)
		if status != c.status {
			t.Errorf("token %q project %d: %d %s", c.token, c.id, status, b)
		}
	}
	if n := g.journalLen(); n != 0 {
		t.Errorf("%d commands ran for refused requests", n)
	}
	if a, _ := g.st.ListArtifacts(ctx, p.ID, true); len(a) != 0 {
		t.Errorf("artifacts %+v", a)
	}
	status, b := g.do(ctx, "POST", exportPath(p.ID), tok, map[string]string{"remote": t.TempDir(), "branch": "main", "expectedHead": head})
	if kind, _, _, _ := apiError(t, b); status != 400 || kind != KindInvalid {
		t.Errorf("local remote on a default daemon: %d %s", status, b)
	}
	if n := g.journalLen(); n != 0 {
		t.Errorf("%d commands ran for refused requests", n)
	}
}

// TestExportSweeperInApp: the app's sweeper deletes a bundle an
// interrupted export left in a machine.
func TestExportSweeperInApp(t *testing.T) {
	g := newGitEnv(t, AppOptions{ExportSweep: export.SweepOptions{Grace: time.Millisecond, Interval: 20 * time.Millisecond}})
	alice, tok := g.account("alice")
	p, _ := g.repoProject("box", alice)
	ctx := context.Background()
	path := export.BundlePrefix + "left.bundle"
	status, body := g.do(ctx, "POST", commandsPath(p.ID), tok, cmdBody("sh", "-c", "git -c core.fsmonitor=false bundle create -q "+path+" refs/heads/main && ls /tmp"))
	if status != 200 || !strings.Contains(string(body), "corral-export-left.bundle") {
		t.Fatalf("setup: %d %s", status, body)
	}
	a, err := g.st.RecordArtifact(ctx, p.ID, path, "gone")
	if err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 5*time.Second, "the sweeper", func() bool {
		live, err := g.st.ListArtifacts(ctx, p.ID, false)
		return err == nil && len(live) == 0
	})
	status, body = g.do(ctx, "POST", commandsPath(p.ID), tok, cmdBody("ls", "/tmp"))
	if status != 200 || strings.Contains(string(body), "corral-export-") {
		t.Errorf("artifact %d: /tmp after the sweep: %d %s", a.ID, status, body)
	}
}

// TestExportUnavailable: no privileged transport, or no sandbox provider:
// 503 after the membership check.
func TestExportUnavailable(t *testing.T) {
	app := AppOptions{Export: export.Options{AllowedRemotes: []string{"example.com/*"}}}
	for name, o := range map[string]envOpts{"no transport": {app: app}, "sandbox disabled": {app: app, disabled: []string{"sandbox"}}} {
		t.Run(name, func(t *testing.T) {
			e := newEnv(t, o)
			alice, tok := e.account("alice")
			p := e.managedProject("box", alice)
			status, body := e.do(context.Background(), "POST", exportPath(p.ID), tok,
				map[string]string{"remote": "https://example.com/r.git", "branch": "main", "expectedHead": strings.Repeat("a", 40)})
			if kind, _, _, _ := apiError(t, body); status != 503 || (kind != KindUnavailable && kind != "prepare") {
				t.Errorf("%d %s", status, body)
			}
		})
	}
}
