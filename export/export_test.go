package export

import (
	"context"
	"encoding/base64"
	"errors"
	"log/slog"
	"net/http"
	"net/http/cgi"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/corral-sandbox/corral/internal/pdeath"

	"go.uber.org/goleak"

	"github.com/corral-sandbox/corral/confine"
	"github.com/corral-sandbox/corral/core"
	"github.com/corral-sandbox/corral/internal/testworker"
	"github.com/corral-sandbox/corral/machine"
	"github.com/corral-sandbox/corral/sandbox"
	"github.com/corral-sandbox/corral/store"
	"github.com/corral-sandbox/corral/worker"
)

func TestMain(m *testing.M) {
	confine.MaybeRun()
	worker.MaybeRunInit()
	goleak.VerifyTestMain(m, goleak.IgnoreTopFunction(pdeath.SpawnerFunc))
}

// env is a core over a real in-process worker, with alice owning the
// managed project p, whose workspace is a Git repository with one commit
// on main.
type env struct {
	t     *testing.T
	core  *core.Core
	st    store.Store
	alice sandbox.Actor
	bob   sandbox.Actor // not a member
	p     store.Project
	head  string
}

func newEnv(t *testing.T) *env {
	t.Helper()
	w := testworker.Start(t, testworker.Options{})
	ctx := context.Background()
	c, err := core.Build(ctx, core.Options{
		StorePath:           filepath.Join(t.TempDir(), "corral.db"),
		Migrate:             true,
		PrivilegedTransport: machine.SocketTransport{Path: w.Socket},
		Control:             sandbox.ControlOptions{HeartbeatInterval: 100 * time.Millisecond},
		Logger:              testLogger(t),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	st := c.Store()
	alice, err := st.CreateAccount(ctx, "alice")
	must(t, err)
	bob, err := st.CreateAccount(ctx, "bob")
	must(t, err)
	p, err := st.CreateProject(ctx, store.NewProject{Kind: store.ProjectManaged, Name: "m", Root: w.Workspace(t, "m")})
	must(t, err)
	_, err = st.AddMember(ctx, store.Member{Project: p.ID, Account: alice.ID, Role: store.RoleOwner})
	must(t, err)
	e := &env{t: t, core: c, st: st, alice: sandbox.Actor{AccountUserID: alice.ID}, bob: sandbox.Actor{AccountUserID: bob.ID}, p: p}
	git(t, p.Root, "init", "-q", "-b", "main")
	e.commit("README", "hello\n")
	e.head = git(t, p.Root, "rev-parse", "HEAD")
	return e
}

// commit writes a file in the workspace and commits it; it returns the
// new head.
func (e *env) commit(name, content string) string {
	e.t.Helper()
	if err := os.WriteFile(filepath.Join(e.p.Root, name), []byte(content), 0o644); err != nil {
		e.t.Fatal(err)
	}
	git(e.t, e.p.Root, "add", name)
	git(e.t, e.p.Root, "commit", "-q", "-m", "add "+name)
	return git(e.t, e.p.Root, "rev-parse", "HEAD")
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// git runs the host's git in dir and returns its trimmed output.
func git(t *testing.T, dir string, args ...string) string {
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

// bareRemote makes an empty bare repository.
func bareRemote(t *testing.T) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "remote.git")
	git(t, "/", "init", "-q", "--bare", dir)
	return dir
}

func (e *env) exporter(opts Options) *Exporter {
	e.t.Helper()
	if opts.Logger == nil {
		opts.Logger = testLogger(e.t)
	}
	if opts.AllowedRemotes == nil {
		// Every host path and every local test server.
		opts.AllowedRemotes = []string{"/**", "127.0.0.1:*/**"}
	}
	x, err := New(e.core, opts)
	must(e.t, err)
	return x
}

// run runs a command in the project's machine as alice.
func (e *env) run(argv ...string) *sandbox.CommandResult {
	e.t.Helper()
	ctl, err := e.core.Sandbox()
	must(e.t, err)
	res, err := ctl.RunCommand(context.Background(), sandbox.ExecInput{
		Command:   sandbox.Command{Type: sandbox.CommandTypeArgv, File: argv[0], Args: argv[1:]},
		LeaseKind: sandbox.LeaseTerminal,
		Project:   sandbox.ProjectRef{Kind: sandbox.ProjectManaged, ProjectID: e.p.ID},
	}, &e.alice, &sandbox.RunOptions{Timeout: 30 * time.Second})
	must(e.t, err)
	return res
}

// guestBundles lists the export bundles in the machine's /tmp.
func (e *env) guestBundles() []string {
	e.t.Helper()
	res := e.run("sh", "-c", "ls -1 /tmp | grep '^corral-export-' || true")
	return strings.Fields(res.Stdout)
}

func (e *env) artifacts(includeDeleted bool) []store.Artifact {
	e.t.Helper()
	a, err := e.st.ListArtifacts(context.Background(), e.p.ID, includeDeleted)
	must(e.t, err)
	return a
}

func (e *env) liveLeases() int {
	e.t.Helper()
	n, err := e.st.LiveLeaseCount(context.Background())
	must(e.t, err)
	return n
}

// TestExport pushes a branch into a local bare repository and checks the
// pushed head, the deleted bundle and its record.
func TestExport(t *testing.T) {
	e := newEnv(t)
	remote := bareRemote(t)
	x := e.exporter(Options{AllowInsecure: true})
	ctx := context.Background()
	res, err := x.Export(ctx, Request{Actor: e.alice, Project: e.p.ID, Remote: remote, Branch: "main", ExpectedHead: e.head})
	if err != nil {
		t.Fatal(err)
	}
	if *res != (Result{Pushed: true, Head: e.head, Remote: remote}) {
		t.Errorf("result %+v", res)
	}
	if got := git(t, "/", "--git-dir", remote, "rev-parse", "refs/heads/main"); got != e.head {
		t.Errorf("remote main is %s, want %s", got, e.head)
	}
	// A second commit on another branch, pushed as a file:// URL.
	git(t, e.p.Root, "checkout", "-q", "-b", "feature/x")
	head2 := e.commit("b.txt", "b\n")
	res, err = x.Export(ctx, Request{Actor: e.alice, Project: e.p.ID, Remote: "file://" + remote, Branch: "feature/x", ExpectedHead: strings.ToUpper(head2)})
	if err != nil {
		t.Fatal(err)
	}
	if res.Head != head2 || res.Remote != "file://"+remote {
		t.Errorf("result %+v", res)
	}
	if got := git(t, "/", "--git-dir", remote, "rev-parse", "refs/heads/feature/x"); got != head2 {
		t.Errorf("remote feature/x is %s, want %s", got, head2)
	}
	// Every bundle was recorded under a github lease, deleted, and marked.
	all := e.artifacts(true)
	if len(all) != 2 {
		t.Fatalf("artifacts %+v", all)
	}
	for _, a := range all {
		if !strings.HasPrefix(a.Path, BundlePrefix) || !strings.HasSuffix(a.Path, ".bundle") || a.Deleted.IsZero() {
			t.Errorf("artifact %+v", a)
		}
		l, err := e.st.GetLease(ctx, a.Lease)
		if err != nil || l.Kind != string(sandbox.LeaseGitHub) || l.Account != e.alice.AccountUserID {
			t.Errorf("artifact lease %+v %v", l, err)
		}
	}
	if b := e.guestBundles(); len(b) != 0 {
		t.Errorf("bundles left in the machine: %v", b)
	}
	if n := e.liveLeases(); n != 0 {
		t.Errorf("%d live leases", n)
	}
	// A non-fast-forward update is rejected by the remote.
	git(t, e.p.Root, "checkout", "-q", "main")
	git(t, e.p.Root, "reset", "-q", "--hard", e.head)
	git(t, e.p.Root, "checkout", "-q", "-B", "feature/x")
	other := e.commit("c.txt", "c\n")
	_, err = x.Export(ctx, Request{Actor: e.alice, Project: e.p.ID, Remote: remote, Branch: "feature/x", ExpectedHead: other})
	var ge *GitError
	if !errors.Is(err, ErrRejected) || !errors.As(err, &ge) || ge.Where != "host" {
		t.Errorf("non-fast-forward: %v", err)
	}
	if b := e.guestBundles(); len(b) != 0 {
		t.Errorf("bundles left in the machine: %v", b)
	}
}

// TestHeadMoved: the head check answers the actual head and nothing is
// bundled or recorded.
func TestHeadMoved(t *testing.T) {
	e := newEnv(t)
	remote := bareRemote(t)
	x := e.exporter(Options{AllowInsecure: true})
	stale := e.head
	newHead := e.commit("more.txt", "more\n")
	_, err := x.Export(context.Background(), Request{Actor: e.alice, Project: e.p.ID, Remote: remote, Branch: "main", ExpectedHead: stale})
	var hm *HeadMovedError
	if !errors.As(err, &hm) || hm.Actual != newHead || hm.Expected != stale || hm.Branch != "main" {
		t.Fatalf("error %v (%+v)", err, hm)
	}
	if a := e.artifacts(true); len(a) != 0 {
		t.Errorf("artifacts recorded: %+v", a)
	}
	if out := git(t, "/", "--git-dir", remote, "for-each-ref"); out != "" {
		t.Errorf("remote got refs: %s", out)
	}
}

// TestRefusals: invalid requests run nothing; a refused preparation (not a
// member, unknown project) records nothing; a missing branch and a
// workspace that is not a repository are told apart.
func TestRefusals(t *testing.T) {
	e := newEnv(t)
	remote := bareRemote(t)
	ctx := context.Background()
	strict := e.exporter(Options{})
	x := e.exporter(Options{AllowInsecure: true})
	ok := Request{Actor: e.alice, Project: e.p.ID, Remote: remote, Branch: "main", ExpectedHead: e.head}
	invalid := map[string]func(r *Request){
		"empty remote":     func(r *Request) { r.Remote = "" },
		"relative path":    func(r *Request) { r.Remote = "remote.git" },
		"ext transport":    func(r *Request) { r.Remote = "ext::sh -c touch% /tmp/pwned" },
		"ssh":              func(r *Request) { r.Remote = "ssh://git@example.com/r.git" },
		"dash":             func(r *Request) { r.Remote = "--upload-pack=touch /tmp/pwned" },
		"unclean path":     func(r *Request) { r.Remote = remote + "/../x" },
		"short head":       func(r *Request) { r.ExpectedHead = e.head[:12] },
		"branch dotdot":    func(r *Request) { r.Branch = "a..b" },
		"branch dash":      func(r *Request) { r.Branch = "-b" },
		"branch refs":      func(r *Request) { r.Branch = "refs/heads/main" },
		"branch space":     func(r *Request) { r.Branch = "a b" },
		"branch lock":      func(r *Request) { r.Branch = "x.lock" },
		"branch newline":   func(r *Request) { r.Branch = "a\nb" },
		"project zero":     func(r *Request) { r.Project = 0 },
		"https no host":    func(r *Request) { r.Remote = "https:///r.git" },
		"remote with ctrl": func(r *Request) { r.Remote = "https://example.com/\x01" },
	}
	for name, mutate := range invalid {
		r := ok
		mutate(&r)
		if _, err := x.Export(ctx, r); !errors.Is(err, ErrInvalid) {
			t.Errorf("%s: %v", name, err)
		}
	}
	for _, r := range []string{remote, "file://" + remote, "http://127.0.0.1/r.git"} {
		req := ok
		req.Remote = r
		if _, err := strict.Export(ctx, req); !errors.Is(err, ErrInvalid) {
			t.Errorf("strict exporter accepted %s: %v", r, err)
		}
	}
	if n := e.liveLeases(); n != 0 {
		t.Errorf("%d live leases after invalid requests", n)
	}

	// A stranger and an unknown project: refused at preparation.
	r := ok
	r.Actor = e.bob
	if _, err := x.Export(ctx, r); !errors.Is(err, sandbox.ErrDenied) {
		t.Errorf("non-member: %v", err)
	}
	r = ok
	r.Project = e.p.ID + 100
	if _, err := x.Export(ctx, r); !errors.Is(err, sandbox.ErrNotFound) {
		t.Errorf("unknown project: %v", err)
	}
	// The bundle step alone, refused at preparation, records nothing.
	arts, err := e.core.Artifacts()
	must(t, err)
	g := &guest{x: x, actor: e.bob, project: sandbox.ProjectRef{Kind: sandbox.ProjectManaged, ProjectID: e.p.ID}}
	if _, err := g.bundle(ctx, "main", arts); !errors.Is(err, sandbox.ErrDenied) || sandbox.KindOf(err) != sandbox.KindPrepare {
		t.Errorf("bundle as a stranger: %v", err)
	}
	if a := e.artifacts(true); len(a) != 0 {
		t.Errorf("artifacts recorded by refused preparations: %+v", a)
	}

	// A branch that does not exist; a workspace that is not a repository.
	r = ok
	r.Branch = "nope"
	if _, err := x.Export(ctx, r); !errors.Is(err, ErrNoBranch) {
		t.Errorf("missing branch: %v", err)
	}
	must(t, os.Rename(filepath.Join(e.p.Root, ".git"), filepath.Join(e.p.Root, "git.off")))
	if _, err := x.Export(ctx, ok); !errors.Is(err, ErrNotRepository) {
		t.Errorf("not a repository: %v", err)
	}
	if a := e.artifacts(true); len(a) != 0 {
		t.Errorf("artifacts recorded: %+v", a)
	}
	// A host project is not exported.
	host, err := e.st.CreateProject(ctx, store.NewProject{Kind: store.ProjectHost, Name: "h", Root: t.TempDir()})
	must(t, err)
	r = ok
	r.Project = host.ID
	if _, err := x.Export(ctx, r); !errors.Is(err, ErrInvalid) {
		t.Errorf("host project: %v", err)
	}
	if n := e.liveLeases(); n != 0 {
		t.Errorf("%d live leases", n)
	}
}

// TestFailedReadDeletesBundle: the bundle was created but reading it
// failed (larger than MaxBundle); the export deletes it and marks it.
func TestFailedReadDeletesBundle(t *testing.T) {
	e := newEnv(t)
	x := e.exporter(Options{AllowInsecure: true, MaxBundle: 16})
	_, err := x.Export(context.Background(), Request{Actor: e.alice, Project: e.p.ID, Remote: bareRemote(t), Branch: "main", ExpectedHead: e.head})
	if !errors.Is(err, ErrTooLarge) {
		t.Fatalf("error %v", err)
	}
	all := e.artifacts(true)
	if len(all) != 1 || all[0].Deleted.IsZero() {
		t.Errorf("artifacts %+v", all)
	}
	if b := e.guestBundles(); len(b) != 0 {
		t.Errorf("bundles left: %v", b)
	}
}

// TestFailedBundleCommand: git bundle create started (its ownership was
// recorded) and failed; the export deletes whatever it left and marks it.
func TestFailedBundleCommand(t *testing.T) {
	e := newEnv(t)
	x := e.exporter(Options{})
	arts, err := e.core.Artifacts()
	must(t, err)
	g := &guest{x: x, actor: e.alice, project: sandbox.ProjectRef{Kind: sandbox.ProjectManaged, ProjectID: e.p.ID}}
	_, err = g.bundle(context.Background(), "no-such-branch", arts)
	var ge *GitError
	if !errors.As(err, &ge) || ge.Where != "machine" || ge.Command != "bundle" || ge.Code == nil || *ge.Code == 0 {
		t.Fatalf("error %v", err)
	}
	all := e.artifacts(true)
	if len(all) != 1 || all[0].Deleted.IsZero() || !strings.HasPrefix(all[0].Path, BundlePrefix) {
		t.Errorf("artifacts %+v", all)
	}
	if b := e.guestBundles(); len(b) != 0 {
		t.Errorf("bundles left: %v", b)
	}
	if x.running(all[0].ID) {
		t.Error("still tracked as running")
	}
}

// TestSweeper: a bundle an interrupted export left (recorded, bytes in the
// machine) is deleted by the sweeper once older than the grace; a young
// one, one of a running export and files the exporter does not own are
// left alone.
func TestSweeper(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	x := e.exporter(Options{})

	// What a failed export leaves: the bytes of a bundle in the machine's
	// /tmp, recorded under the lease of the command that made them.
	res := e.run("sh", "-c", `cd /workspace && git -c core.fsmonitor=false bundle create -q /tmp/corral-export-left.bundle refs/heads/main && echo made > /tmp/corral-export-young.bundle && echo made > /tmp/corral-export-running.bundle && echo mine > /tmp/other.txt && ls /tmp`)
	if *res.Code != 0 || !strings.Contains(res.Stdout, "corral-export-left.bundle") {
		t.Fatalf("setup: %+v", res)
	}
	leases, err := e.st.ListLeases(ctx, store.LeaseFilter{})
	must(t, err)
	lease := leases[len(leases)-1].ID
	left, err := e.st.RecordArtifact(ctx, e.p.ID, "/tmp/corral-export-left.bundle", lease)
	must(t, err)
	running, err := e.st.RecordArtifact(ctx, e.p.ID, "/tmp/corral-export-running.bundle", lease)
	must(t, err)
	other, err := e.st.RecordArtifact(ctx, e.p.ID, "/tmp/other.txt", lease)
	must(t, err)
	x.track(running.ID, true)

	time.Sleep(50 * time.Millisecond)
	young, err := e.st.RecordArtifact(ctx, e.p.ID, "/tmp/corral-export-young.bundle", lease)
	must(t, err)
	// The grace spans the young record only.
	grace := time.Since(young.Created) + 25*time.Millisecond
	if grace > time.Since(left.Created) {
		t.Fatal("clock too coarse for this test")
	}
	s := x.Sweeper(SweepOptions{Grace: grace, Interval: time.Hour})
	n, err := s.Sweep(ctx)
	if err != nil || n != 1 {
		t.Fatalf("swept %d: %v", n, err)
	}
	got := map[int64]bool{}
	for _, a := range e.artifacts(true) {
		got[a.ID] = !a.Deleted.IsZero()
	}
	want := map[int64]bool{left.ID: true, running.ID: false, other.ID: false, young.ID: false}
	for id, deleted := range want {
		if got[id] != deleted {
			t.Errorf("artifact %d deleted=%v, want %v", id, got[id], deleted)
		}
	}
	res = e.run("ls", "/tmp")
	if strings.Contains(res.Stdout, "corral-export-left.bundle") || !strings.Contains(res.Stdout, "corral-export-young.bundle") ||
		!strings.Contains(res.Stdout, "corral-export-running.bundle") || !strings.Contains(res.Stdout, "other.txt") {
		t.Errorf("/tmp after the sweep: %q", res.Stdout)
	}
	// The lease's account left the project: an owner acts instead (the
	// young record is old enough by now too); with no member at all, the
	// sweep reports it and keeps the record.
	x.track(running.ID, false)
	carol, err := e.st.CreateAccount(ctx, "carol")
	must(t, err)
	_, err = e.st.AddMember(ctx, store.Member{Project: e.p.ID, Account: carol.ID, Role: store.RoleOwner})
	must(t, err)
	must(t, e.st.RemoveMember(ctx, e.p.ID, e.alice.AccountUserID))
	time.Sleep(grace)
	if n, err := s.Sweep(ctx); err != nil || n != 2 {
		t.Fatalf("second sweep: %d %v", n, err)
	}
	orphan, err := e.st.RecordArtifact(ctx, e.p.ID, "/tmp/corral-export-orphan.bundle", lease)
	must(t, err)
	must(t, e.st.RemoveMember(ctx, e.p.ID, carol.ID))
	time.Sleep(grace)
	if n, err := s.Sweep(ctx); err == nil || n != 0 {
		t.Errorf("sweep without members: %d %v", n, err)
	}
	for _, a := range e.artifacts(false) {
		if a.ID != orphan.ID && a.ID != other.ID {
			t.Errorf("left recorded: %+v", a)
		}
	}
}

// TestSweeperRun: Run sweeps at once and stops with its context.
func TestSweeperRun(t *testing.T) {
	e := newEnv(t)
	ctx, cancel := context.WithCancel(context.Background())
	x := e.exporter(Options{})
	e.run("sh", "-c", "echo x > /tmp/corral-export-a.bundle")
	a, err := e.st.RecordArtifact(ctx, e.p.ID, "/tmp/corral-export-a.bundle", "none")
	must(t, err)
	done := make(chan error, 1)
	go func() { done <- x.Sweeper(SweepOptions{Grace: time.Nanosecond, Interval: time.Hour}).Run(ctx) }()
	deadline := time.Now().Add(20 * time.Second)
	for len(e.artifacts(false)) != 0 {
		if time.Now().After(deadline) {
			t.Fatal("the sweeper did not delete the bundle")
		}
		time.Sleep(20 * time.Millisecond)
	}
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Errorf("Run: %v", err)
	}
	if res := e.run("ls", "/tmp"); strings.Contains(res.Stdout, "corral-export-a") {
		t.Errorf("bundle %d left: %q", a.ID, res.Stdout)
	}
}

// gitHTTPServer serves the bare repositories under root over Git's smart
// HTTP protocol (git http-backend), requiring Basic authentication with
// user and password; it counts the requests that presented them.
func gitHTTPServer(t *testing.T, root, user, password string) (*httptest.Server, *atomic.Int32) {
	t.Helper()
	backend := "/usr/lib/git-core/git-http-backend"
	if out, err := exec.Command("git", "--exec-path").Output(); err == nil {
		backend = filepath.Join(strings.TrimSpace(string(out)), "git-http-backend")
	}
	if _, err := os.Stat(backend); err != nil {
		t.Skipf("git http-backend not installed: %v", err)
	}
	var authed atomic.Int32
	h := &cgi.Handler{Path: backend, Root: "/", Env: []string{"GIT_PROJECT_ROOT=" + root, "GIT_HTTP_EXPORT_ALL=1", "GIT_CONFIG_NOSYSTEM=1"}}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		u, p, ok := r.BasicAuth()
		if !ok || u != user || p != password {
			w.Header().Set("WWW-Authenticate", `Basic realm="git"`)
			http.Error(w, "authentication required", http.StatusUnauthorized)
			return
		}
		authed.Add(1)
		h.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	return srv, &authed
}

// TestCredentialStaysOnTheHost pushes to a smart-HTTP remote that demands
// the token (so the credential helper demonstrably supplied it), then
// looks for the token everywhere in the machine: its files, the
// environment and command lines of its processes, and the journal of the
// commands run there.
func TestCredentialStaysOnTheHost(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	root := t.TempDir()
	remote := filepath.Join(root, "r.git")
	git(t, "/", "init", "-q", "--bare", remote)
	git(t, remote, "config", "http.receivepack", "true")
	const token = "ghp_CorralSecretToken0123456789abcdef"
	srv, authed := gitHTTPServer(t, root, DefaultUsername, token)
	url := srv.URL + "/r.git"

	// Without the token the remote refuses.
	_, err := e.exporter(Options{AllowInsecure: true}).Export(ctx, Request{Actor: e.alice, Project: e.p.ID, Remote: url, Branch: "main", ExpectedHead: e.head})
	if !errors.Is(err, ErrPush) || strings.Contains(err.Error(), token) {
		t.Fatalf("push without a token: %v", err)
	}
	if authed.Load() != 0 {
		t.Fatal("authenticated without a token")
	}
	// With it (from a token file), the push succeeds.
	tokenFile := filepath.Join(t.TempDir(), "token")
	must(t, os.WriteFile(tokenFile, []byte(token+"\n"), 0o600))
	x := e.exporter(Options{AllowInsecure: true, TokenFile: tokenFile})
	res, err := x.Export(ctx, Request{Actor: e.alice, Project: e.p.ID, Remote: url, Branch: "main", ExpectedHead: e.head})
	if err != nil {
		t.Fatal(err)
	}
	if res.Head != e.head || authed.Load() == 0 {
		t.Fatalf("result %+v, %d authenticated requests", res, authed.Load())
	}
	if got := git(t, "/", "--git-dir", remote, "rev-parse", "refs/heads/main"); got != e.head {
		t.Errorf("remote main %s", got)
	}
	// A wrong token: refused, and the message does not carry it.
	_, err = e.exporter(Options{AllowInsecure: true, Token: "wrong-" + token}).Export(ctx, Request{Actor: e.alice, Project: e.p.ID, Remote: url, Branch: "main", ExpectedHead: e.head})
	if !errors.Is(err, ErrPush) || strings.Contains(err.Error(), token) {
		t.Errorf("wrong token: %v", err)
	}

	// Nothing in the machine knows the token. A long-running process is
	// alive meanwhile so that /proc has more than the probe itself.
	// The probe gets the token base64-encoded, so that no process of the
	// machine has it in its arguments; it matches without running a
	// process with the token in its arguments where /proc is read.
	encoded := base64.StdEncoding.EncodeToString([]byte(token))
	probe := func() []string {
		res := e.run("sh", "-c", `
		t=$(printf %s "$1" | base64 -d)
		grep -r -a -l -F -e "$t" /workspace /tmp /home/corral >/dev/null 2>&1; echo "grep=$?"
		case "$(env)" in *"$t"*) echo env=found;; *) echo env=clean;; esac
		n=0
		for f in /proc/[0-9]*/cmdline /proc/[0-9]*/environ; do
			c=$(tr '\0' ' ' < "$f" 2>/dev/null)
			case "$c" in *"$t"*) n=$((n+1));; esac
		done
		echo "proc=$n"
		ls /tmp`, "sh", encoded)
		return strings.Split(strings.TrimSpace(res.Stdout), "\n")
	}
	lines := probe()
	if len(lines) < 3 || lines[0] != "grep=1" || lines[1] != "env=clean" || lines[2] != "proc=0" {
		t.Errorf("token found in the machine: %q", lines)
	}
	if strings.Contains(strings.Join(lines, " "), "corral-export-") {
		t.Errorf("bundle left: %q", lines)
	}
	// The probe does find a planted token.
	e.run("sh", "-c", `printf %s "$1" | base64 -d > /home/corral/planted`, "sh", encoded)
	if lines := probe(); len(lines) < 1 || lines[0] != "grep=0" {
		t.Errorf("the probe missed a planted token: %q", lines)
	}
	// The journal of every command run in the machine.
	entries, err := e.st.ListJournal(ctx, store.JournalFilter{})
	must(t, err)
	if len(entries) == 0 {
		t.Fatal("empty journal")
	}
	for _, en := range entries {
		if strings.Contains(strings.Join(en.Argv, " "), strings.TrimPrefix(token, "ghp_")) {
			t.Errorf("journal entry carries the token: %v", en.Argv)
		}
	}
	// Credentials in the remote's URL are the caller's own; they work and
	// are answered redacted.
	withUser := strings.Replace(url, "http://", "http://"+DefaultUsername+":"+token+"@", 1)
	res, err = e.exporter(Options{AllowInsecure: true}).Export(ctx, Request{Actor: e.alice, Project: e.p.ID, Remote: withUser, Branch: "main", ExpectedHead: e.head})
	if err != nil {
		t.Fatal(err)
	}
	if res.Remote != url {
		t.Errorf("remote answered as %q", res.Remote)
	}
	withWrong := strings.Replace(url, "http://", "http://"+DefaultUsername+":wrong-"+token+"@", 1)
	_, err = e.exporter(Options{AllowInsecure: true}).Export(ctx, Request{Actor: e.alice, Project: e.p.ID, Remote: withWrong, Branch: "main", ExpectedHead: e.head})
	if !errors.Is(err, ErrPush) || strings.Contains(err.Error(), token) {
		t.Errorf("wrong credentials in the URL: %v", err)
	}
}

type testWriter struct{ t testing.TB }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

func testLogger(t testing.TB) *slog.Logger {
	return slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug}))
}
