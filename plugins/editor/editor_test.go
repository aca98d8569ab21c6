package editor_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/corral-sandbox/corral/api"
	"github.com/corral-sandbox/corral/internal/pdeath"

	"github.com/corral-sandbox/corral/confine"
	"github.com/corral-sandbox/corral/core"
	"github.com/corral-sandbox/corral/plugin"
	"github.com/corral-sandbox/corral/plugins/editor"
	"github.com/corral-sandbox/corral/sandbox"
	"github.com/corral-sandbox/corral/store"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	// The test binary is the confinement helper of the host provider
	// (core's SelfExe defaults to os.Executable()).
	confine.MaybeRun()
	goleak.VerifyTestMain(m, goleak.IgnoreTopFunction(pdeath.SpawnerFunc))
}

// env is a real core with the sandbox and editor plugins, one host project
// whose root is a directory the test fills, a member and a non-member.
type env struct {
	core     *core.Core
	root     string // the project root (host path)
	project  int64
	member   sandbox.Actor
	outsider sandbox.Actor
}

func newEnv(t *testing.T, disabled ...string) *env {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("the host provider's tests run as root (as CI does)")
	}
	if _, err := exec.LookPath("git"); err != nil {
		t.Skip("git is not installed")
	}
	ctx := context.Background()
	dir := t.TempDir()
	c, err := core.Build(ctx, core.Options{
		StorePath:    filepath.Join(dir, "corral.db"),
		Migrate:      true,
		Plugins:      []core.PluginFactory{core.SandboxPlugin, core.EditorPlugin},
		PluginConfig: plugin.Config{Disabled: disabled},
		Logger:       slog.New(slog.DiscardHandler),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	st := c.Store()
	root := filepath.Join(dir, "project")
	if err := os.Mkdir(root, 0o755); err != nil {
		t.Fatal(err)
	}
	alice, err := st.CreateAccount(ctx, "alice")
	if err != nil {
		t.Fatal(err)
	}
	mallory, err := st.CreateAccount(ctx, "mallory")
	if err != nil {
		t.Fatal(err)
	}
	proj, err := st.CreateProject(ctx, store.NewProject{Kind: store.ProjectHost, Name: "p", Root: root})
	if err != nil {
		t.Fatal(err)
	}
	// Confined unless this kernel cannot confine: then the member must be
	// trusted for host commands to run at all.
	_, noLandlock := confine.Available()
	if _, err := st.AddMember(ctx, store.Member{Project: proj.ID, Account: alice.ID, Role: store.RoleOwner, Trusted: noLandlock != nil}); err != nil {
		t.Fatal(err)
	}
	return &env{
		core: c, root: root, project: proj.ID,
		member:   sandbox.Actor{AccountUserID: alice.ID},
		outsider: sandbox.Actor{AccountUserID: mallory.ID},
	}
}

func (e *env) editor(t *testing.T) *editor.Editor {
	t.Helper()
	ed, err := plugin.ResolveCoreAs[*editor.Editor](e.core.Registry(), plugin.DomainEditor)
	if err != nil {
		t.Fatal(err)
	}
	return ed
}

// git runs the host's git in the project root, for building fixtures.
func (e *env) git(t *testing.T, args ...string) string {
	t.Helper()
	out, err := e.gitErr(args...)
	if err != nil {
		t.Fatalf("git %v: %v\n%s", args, err, out)
	}
	return strings.TrimSpace(out)
}

func (e *env) gitErr(args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, "git", args...)
	cmd.Dir = e.root
	cmd.Env = []string{
		"PATH=" + os.Getenv("PATH"), "HOME=" + filepath.Dir(e.root), "LC_ALL=C",
		"GIT_CONFIG_NOSYSTEM=1", "GIT_CONFIG_GLOBAL=/dev/null",
		"GIT_AUTHOR_NAME=Ada Lovelace", "GIT_AUTHOR_EMAIL=ada@example.com",
		"GIT_COMMITTER_NAME=Ada Lovelace", "GIT_COMMITTER_EMAIL=ada@example.com",
		"GIT_AUTHOR_DATE=2024-01-02T03:04:05Z", "GIT_COMMITTER_DATE=2024-01-02T03:04:05Z",
	}
	out, err := cmd.CombinedOutput()
	return string(out), err
}

func (e *env) write(t *testing.T, name, content string) {
	t.Helper()
	p := filepath.Join(e.root, name)
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

const secretURL = "https://user:s3cret@example.invalid/x.git"

// richRepo holds the commits of the repository built by buildRich.
type richRepo struct {
	base, ours, theirs, upstream string
}

// buildRich builds a repository in the middle of a conflicted merge, with
// a staged change, an unstaged change, a staged rename, untracked files and
// an upstream (whose URL carries a password) one commit ahead and one
// behind.
func (e *env) buildRich(t *testing.T) richRepo {
	t.Helper()
	var r richRepo
	e.git(t, "init", "-q", "-b", "main")
	e.write(t, "a.txt", "a\n")
	e.write(t, "b.txt", "b\n")
	e.write(t, "old.txt", strings.Repeat("a line that makes renames detectable\n", 20))
	e.write(t, "conflict.txt", "base\n")
	e.write(t, "remote.txt", "the remote is "+secretURL+"\n")
	e.write(t, "bin.dat", "\x00\x01\x02binary\x00")
	e.git(t, "add", ".")
	e.git(t, "commit", "-q", "-m", "initial")
	r.base = e.git(t, "rev-parse", "HEAD")

	e.git(t, "checkout", "-q", "-b", "other")
	e.write(t, "conflict.txt", "theirs\n")
	e.git(t, "commit", "-q", "-am", "theirs")
	r.theirs = e.git(t, "rev-parse", "HEAD")

	e.git(t, "checkout", "-q", "main")
	e.write(t, "conflict.txt", "ours\n")
	e.git(t, "commit", "-q", "-am", "ours\n\nPushed to "+secretURL+" later.\nSecond body line.")
	r.ours = e.git(t, "rev-parse", "HEAD")

	e.git(t, "remote", "add", "origin", secretURL)
	r.upstream = e.git(t, "commit-tree", r.base+"^{tree}", "-p", r.base, "-m", "upstream")
	e.git(t, "update-ref", "refs/remotes/origin/main", r.upstream)
	e.git(t, "branch", "-q", "--set-upstream-to=origin/main", "main")

	if out, err := e.gitErr("merge", "other"); err == nil {
		t.Fatalf("merge did not conflict:\n%s", out)
	}
	e.write(t, "a.txt", "a staged\n")
	e.git(t, "add", "a.txt")
	e.write(t, "b.txt", "b unstaged\n")
	e.git(t, "mv", "old.txt", "new.txt")
	e.write(t, "u.txt", "untracked\n")
	e.write(t, "dir/nested.txt", "untracked too\n")
	return r
}

func TestStatus(t *testing.T) {
	e := newEnv(t)
	r := e.buildRich(t)
	st, err := e.editor(t).Status(context.Background(), e.member, e.project)
	if err != nil {
		t.Fatal(err)
	}
	if !st.IsRepo || st.Truncated {
		t.Fatalf("isRepo %v truncated %v", st.IsRepo, st.Truncated)
	}
	b := st.Branch
	if b == nil || b.Head != "main" || b.OID != r.ours || b.Detached || b.Initial || b.Upstream != "origin/main" {
		t.Fatalf("branch = %+v", b)
	}
	if b.Ahead == nil || b.Behind == nil || *b.Ahead != 1 || *b.Behind != 1 {
		t.Fatalf("ahead/behind = %v/%v, want 1/1", b.Ahead, b.Behind)
	}
	byPath := map[string]editor.Entry{}
	for _, en := range st.Entries {
		byPath[en.Path] = en
	}
	check := func(path string, kind editor.EntryKind, index, worktree string) editor.Entry {
		t.Helper()
		en, ok := byPath[path]
		if !ok {
			t.Fatalf("no entry for %s in %+v", path, st.Entries)
		}
		if en.Kind != kind || en.Index != index || en.Worktree != worktree {
			t.Errorf("%s: kind %s %s%s, want %s %s%s", path, en.Kind, en.Index, en.Worktree, kind, index, worktree)
		}
		return en
	}
	staged := check("a.txt", editor.EntryOrdinary, "M", ".")
	if staged.ModeHead != "100644" || staged.OIDHead == "" || staged.OIDHead == staged.OIDIndex {
		t.Errorf("a.txt modes/oids: %+v", staged)
	}
	check("b.txt", editor.EntryOrdinary, ".", "M")
	ren := check("new.txt", editor.EntryRenamed, "R", ".")
	if ren.OrigPath != "old.txt" || ren.Score != 100 {
		t.Errorf("rename: orig %q score %d", ren.OrigPath, ren.Score)
	}
	con := check("conflict.txt", editor.EntryUnmerged, "U", "U")
	if !con.Conflicted || con.Conflict != "both modified" || len(con.Stages) != 3 {
		t.Errorf("conflict: %+v", con)
	} else {
		want := []string{
			e.git(t, "rev-parse", r.base+":conflict.txt"),
			e.git(t, "rev-parse", r.ours+":conflict.txt"),
			e.git(t, "rev-parse", r.theirs+":conflict.txt"),
		}
		for i, s := range con.Stages {
			if s.Stage != i+1 || s.Mode != "100644" || s.OID != want[i] {
				t.Errorf("stage %d = %+v, want oid %s", i+1, s, want[i])
			}
		}
	}
	check("u.txt", editor.EntryUntracked, "?", "?")
	check("dir/nested.txt", editor.EntryUntracked, "?", "?")
	if len(st.Entries) != 6 {
		t.Errorf("%d entries, want 6: %+v", len(st.Entries), st.Entries)
	}
	noSecret(t, st)
}

func TestStatusEmptyRepository(t *testing.T) {
	e := newEnv(t)
	e.git(t, "init", "-q", "-b", "trunk")
	e.write(t, "x", "x\n")
	st, err := e.editor(t).Status(context.Background(), e.member, e.project)
	if err != nil {
		t.Fatal(err)
	}
	if st.Branch == nil || !st.Branch.Initial || st.Branch.Head != "trunk" || st.Branch.Ahead != nil {
		t.Fatalf("branch %+v", st.Branch)
	}
	if len(st.Entries) != 1 || st.Entries[0].Kind != editor.EntryUntracked {
		t.Fatalf("entries %+v", st.Entries)
	}
	lg, err := e.editor(t).Log(context.Background(), e.member, e.project, editor.LogOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if !lg.IsRepo || len(lg.Commits) != 0 || lg.HasMore {
		t.Fatalf("log of an empty branch: %+v", lg)
	}
}

func TestLogPaging(t *testing.T) {
	e := newEnv(t)
	e.git(t, "init", "-q", "-b", "main")
	for i := range 7 {
		name := "f.txt"
		if i%2 == 1 {
			name = "g.txt"
		}
		e.write(t, name, fmt.Sprintf("version %d\n", i))
		e.git(t, "add", name)
		e.git(t, "commit", "-q", "-m", fmt.Sprintf("commit %d\nsubject continues\n\nbody of %d\n\nsecond paragraph", i, i))
	}
	all := strings.Fields(e.git(t, "rev-list", "HEAD"))
	ed := e.editor(t)
	ctx := context.Background()

	for skip, wantMore := range map[int]bool{0: true, 3: true, 6: false} {
		lg, err := ed.Log(ctx, e.member, e.project, editor.LogOptions{Skip: skip, Limit: 3})
		if err != nil {
			t.Fatal(err)
		}
		if lg.HasMore != wantMore {
			t.Errorf("skip %d: hasMore %v, want %v", skip, lg.HasMore, wantMore)
		}
		for i, c := range lg.Commits {
			if c.Hash != all[skip+i] {
				t.Errorf("skip %d: commit %d is %s, want %s", skip, i, c.Hash, all[skip+i])
			}
		}
		if want := min(3, 7-skip); len(lg.Commits) != want {
			t.Errorf("skip %d: %d commits, want %d", skip, len(lg.Commits), want)
		}
	}
	lg, err := ed.Log(ctx, e.member, e.project, editor.LogOptions{Limit: 2})
	if err != nil {
		t.Fatal(err)
	}
	c := lg.Commits[0]
	if c.Subject != "commit 6 subject continues" || c.Body != "body of 6\n\nsecond paragraph\n" ||
		c.AuthorName != "Ada Lovelace" || c.AuthorEmail != "ada@example.com" ||
		c.AuthorDate != "2024-01-02T03:04:05+00:00" || c.CommitterDate != "2024-01-02T03:04:05+00:00" ||
		len(c.Parents) != 1 || c.Parents[0] != all[1] {
		t.Errorf("commit = %+v", c)
	}
	if !lg.HasMore || len(lg.Commits) != 2 {
		t.Errorf("limit 2: %d commits, hasMore %v", len(lg.Commits), lg.HasMore)
	}

	// A path limits history; a ref other than HEAD works.
	lg, err = ed.Log(ctx, e.member, e.project, editor.LogOptions{Ref: all[2], Path: "g.txt"})
	if err != nil {
		t.Fatal(err)
	}
	var hashes []string
	for _, c := range lg.Commits {
		hashes = append(hashes, c.Hash)
	}
	want := strings.Fields(e.git(t, "rev-list", all[2], "--", "g.txt"))
	if strings.Join(hashes, " ") != strings.Join(want, " ") || len(want) != 2 || lg.HasMore {
		t.Errorf("path history %v, want %v", hashes, want)
	}
	root := lg.Commits[len(lg.Commits)-1]
	if len(want) > 0 && root.Hash == all[6] && len(root.Parents) != 0 {
		t.Errorf("root commit has parents %v", root.Parents)
	}

	// An unknown ref is ErrUnknownRevision; a ref that looks like an
	// option is refused before anything runs.
	if _, err := ed.Log(ctx, e.member, e.project, editor.LogOptions{Ref: "nope"}); !errors.Is(err, editor.ErrUnknownRevision) {
		t.Errorf("unknown ref: %v", err)
	}
	for _, bad := range []editor.LogOptions{{Ref: "--output=/tmp/x"}, {Ref: "a b"}, {Path: "../x"}, {Path: "/etc"}, {Limit: -1}, {Skip: -1}, {Limit: 100000}} {
		if _, err := ed.Log(ctx, e.member, e.project, bad); !errors.Is(err, editor.ErrBadInput) {
			t.Errorf("%+v: %v, want ErrBadInput", bad, err)
		}
	}
}

func TestDiff(t *testing.T) {
	e := newEnv(t)
	r := e.buildRich(t)
	ed := e.editor(t)
	ctx := context.Background()
	diff := func(o editor.DiffOptions) *editor.Diff {
		t.Helper()
		d, err := ed.Diff(ctx, e.member, e.project, o)
		if err != nil {
			t.Fatalf("%+v: %v", o, err)
		}
		if !d.IsRepo {
			t.Fatalf("%+v: not a repo", o)
		}
		noSecret(t, d)
		return d
	}

	wt := diff(editor.DiffOptions{Path: "b.txt"})
	if !strings.Contains(wt.Patch, "-b\n+b unstaged\n") || wt.Truncated {
		t.Errorf("working tree diff:\n%s", wt.Patch)
	}
	if all := diff(editor.DiffOptions{}); strings.Contains(all.Patch, "a staged") || !strings.Contains(all.Patch, "b unstaged") {
		t.Errorf("working tree diff shows the staged change or misses the unstaged one:\n%s", all.Patch)
	}
	staged := diff(editor.DiffOptions{Staged: true})
	if !strings.Contains(staged.Patch, "+a staged\n") || strings.Contains(staged.Patch, "b unstaged") ||
		!strings.Contains(staged.Patch, "rename from old.txt\nrename to new.txt") {
		t.Errorf("staged diff:\n%s", staged.Patch)
	}
	refs := diff(editor.DiffOptions{From: r.base, To: r.ours})
	if !strings.Contains(refs.Patch, "-base\n+ours\n") || strings.Contains(refs.Patch, "a staged") {
		t.Errorf("diff between refs:\n%s", refs.Patch)
	}
	full := diff(editor.DiffOptions{From: r.base, To: r.theirs})
	cutd := diff(editor.DiffOptions{From: r.base, To: r.theirs, MaxBytes: 40})
	if !cutd.Truncated || len(cutd.Patch) > 40 || !strings.HasPrefix(full.Patch, cutd.Patch) || full.Truncated {
		t.Errorf("truncated diff (%v, %d bytes):\n%s", cutd.Truncated, len(cutd.Patch), cutd.Patch)
	}
	exact := diff(editor.DiffOptions{From: r.base, To: r.theirs, MaxBytes: int64(len(full.Patch))})
	if exact.Truncated || exact.Patch != full.Patch {
		t.Errorf("a diff of exactly max bytes is truncated")
	}
	// A large working-tree diff overflows the command's limit: that is
	// truncation, not an error.
	e.write(t, "b.txt", strings.Repeat("a long line of changes to overflow the limit\n", 3000))
	big := diff(editor.DiffOptions{Path: "b.txt", MaxBytes: 1000})
	if !big.Truncated || len(big.Patch) > 1000 || !strings.HasPrefix(big.Patch, "diff --git a/b.txt b/b.txt\n") {
		t.Errorf("big diff truncated %v, %d bytes", big.Truncated, len(big.Patch))
	}

	if _, err := ed.Diff(ctx, e.member, e.project, editor.DiffOptions{From: "nope"}); !errors.Is(err, editor.ErrUnknownRevision) {
		t.Errorf("unknown ref: %v", err)
	}
	for _, bad := range []editor.DiffOptions{{To: "HEAD"}, {From: "-p"}, {From: "HEAD", To: "HEAD", Staged: true}, {MaxBytes: -1}, {Path: "-x"}} {
		if _, err := ed.Diff(ctx, e.member, e.project, bad); !errors.Is(err, editor.ErrBadInput) {
			t.Errorf("%+v: %v, want ErrBadInput", bad, err)
		}
	}
}

func TestShow(t *testing.T) {
	e := newEnv(t)
	r := e.buildRich(t)
	ed := e.editor(t)
	ctx := context.Background()
	show := func(ref, path string, max int64) *editor.File {
		t.Helper()
		f, err := ed.Show(ctx, e.member, e.project, ref, path, max)
		if err != nil {
			t.Fatalf("show %s:%s: %v", ref, path, err)
		}
		noSecret(t, f)
		return f
	}
	if f := show(r.base, "conflict.txt", 0); f.Content != "base\n" || f.Size != 5 || f.Binary || f.Truncated || f.Mode != "100644" {
		t.Errorf("base: %+v", f)
	}
	if f := show("", "conflict.txt", 0); f.Content != "ours\n" || f.Ref != "HEAD" {
		t.Errorf("HEAD: %+v", f)
	}
	if f := show("other", "./conflict.txt", 0); f.Content != "theirs\n" || f.Path != "conflict.txt" {
		t.Errorf("other: %+v", f)
	}
	if f := show(r.base, "bin.dat", 0); !f.Binary || f.Content != "" || f.Size != 10 {
		t.Errorf("binary: %+v", f)
	}
	if f := show(r.base, "old.txt", 10); !f.Truncated || f.Content != "a line tha" || f.Size != 37*20 {
		t.Errorf("truncated: %+v", f)
	}
	if f := show(r.base, "remote.txt", 0); !f.Redacted || !strings.Contains(f.Content, "https://[REDACTED]@example.invalid/x.git") {
		t.Errorf("remote.txt not redacted: %+v", f)
	}
	for _, c := range []struct {
		ref, path string
		want      error
	}{
		{r.base, "missing.txt", editor.ErrUnknownRevision},
		{"nope", "a.txt", editor.ErrUnknownRevision},
		{r.ours, "new.txt", editor.ErrUnknownRevision}, // only staged
		{"", "", editor.ErrBadInput},
		{"-x", "a.txt", editor.ErrBadInput},
		{"HEAD", "../a.txt", editor.ErrBadInput},
	} {
		if _, err := ed.Show(ctx, e.member, e.project, c.ref, c.path, 0); !errors.Is(err, c.want) {
			t.Errorf("show %q:%q: %v, want %v", c.ref, c.path, err, c.want)
		}
	}
	e.write(t, "conflict.txt", "resolved\n")
	e.write(t, "d/f", "x")
	e.git(t, "add", "d/f", "conflict.txt")
	e.git(t, "commit", "-q", "-m", "dir") // concludes the merge
	if _, err := ed.Show(ctx, e.member, e.project, "HEAD", "d", 0); !errors.Is(err, editor.ErrNotFile) {
		t.Errorf("directory: %v", err)
	}
}

func TestNotARepository(t *testing.T) {
	e := newEnv(t)
	e.write(t, "plain.txt", "not tracked by anything\n")
	ed := e.editor(t)
	ctx := context.Background()
	st, err := ed.Status(ctx, e.member, e.project)
	if err != nil || st.IsRepo || st.Branch != nil || st.Entries != nil {
		t.Errorf("status: %+v, %v", st, err)
	}
	lg, err := ed.Log(ctx, e.member, e.project, editor.LogOptions{})
	if err != nil || lg.IsRepo {
		t.Errorf("log: %+v, %v", lg, err)
	}
	d, err := ed.Diff(ctx, e.member, e.project, editor.DiffOptions{})
	if err != nil || d.IsRepo {
		t.Errorf("diff: %+v, %v", d, err)
	}
	f, err := ed.Show(ctx, e.member, e.project, "HEAD", "plain.txt", 0)
	if err != nil || f.IsRepo {
		t.Errorf("show: %+v, %v", f, err)
	}
	for _, v := range []any{st, lg, d, f} {
		if b, err := json.Marshal(v); err != nil || string(b) != `{"isRepo":false}` {
			t.Errorf("%T JSON %s, %v", v, b, err)
		}
	}
}

// TestNoRepositoryDiscoveryAbove checks that a project root inside another
// repository is not that repository: git never looks above the project.
func TestNoRepositoryDiscoveryAbove(t *testing.T) {
	e := newEnv(t)
	outer := filepath.Dir(e.root)
	cmd := exec.Command("git", "init", "-q", outer)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	e.write(t, "inner.txt", "x")
	st, err := e.editor(t).Status(context.Background(), e.member, e.project)
	if err != nil || st.IsRepo {
		t.Fatalf("status of a directory inside a repository: %+v, %v", st, err)
	}
}

func TestTenancy(t *testing.T) {
	e := newEnv(t)
	e.git(t, "init", "-q")
	ed := e.editor(t)
	ctx := context.Background()
	if _, err := ed.Status(ctx, e.outsider, e.project); !errors.Is(err, sandbox.ErrDenied) {
		t.Errorf("non-member: %v", err)
	}
	if _, err := ed.Status(ctx, e.member, e.project+100); !errors.Is(err, sandbox.ErrNotFound) {
		t.Errorf("unknown project: %v", err)
	}
}

func TestMissingSandbox(t *testing.T) {
	e := newEnv(t, "sandbox")
	e.git(t, "init", "-q")
	ed := e.editor(t)
	_, err := ed.Status(context.Background(), e.member, e.project)
	if !errors.Is(err, sandbox.ErrUnavailable) {
		t.Fatalf("status without a sandbox: %v", err)
	}
	code, body := read(t, ed, e.member, fmt.Sprintf("/v1/projects/%d/git/status", e.project))
	if code != http.StatusServiceUnavailable || errorKind(t, body) != string(editor.KindUnavailable) {
		t.Fatalf("status without a sandbox: %d %s", code, body)
	}
}

// TestHardening arms every repository setting that would make a read run a
// program, checks the editor's reads run none of them, then checks that a
// plain git does (so the trap was armed).
func TestHardening(t *testing.T) {
	e := newEnv(t)
	e.git(t, "init", "-q", "-b", "main")
	e.write(t, "f.txt", "one\n")
	e.write(t, ".gitattributes", "* filter=evil diff=evil\n")
	e.git(t, "add", ".")
	e.git(t, "commit", "-q", "-m", "initial")
	markers := filepath.Join(e.root, ".git", "markers")
	if err := os.Mkdir(markers, 0o777); err != nil {
		t.Fatal(err)
	}
	// A trap never reads its input: a process filter would otherwise wait
	// for git forever.
	trap := func(name string) string { return "touch " + filepath.Join(markers, name) + "; exit 1" }
	traps := map[string]string{
		"core.fsmonitor":      trap("fsmonitor"),
		"core.pager":          trap("pager"),
		"pager.diff":          trap("pager.diff"),
		"pager.log":           trap("pager.log"),
		"diff.external":       trap("external"),
		"diff.evil.command":   trap("diff-command"),
		"diff.evil.textconv":  trap("textconv"),
		"filter.evil.clean":   trap("clean"),
		"filter.evil.smudge":  trap("smudge"),
		"filter.evil.process": trap("process"),
		"core.hooksPath":      markers,
		"core.worktree":       "/",
	}
	for key, val := range traps {
		e.git(t, "config", key, val)
	}
	e.write(t, "f.txt", "two\n")
	e.write(t, "g.txt", "new\n")
	ed := e.editor(t)
	ctx := context.Background()
	if st, err := ed.Status(ctx, e.member, e.project); err != nil || len(st.Entries) != 2 {
		t.Fatalf("status: %+v, %v", st, err)
	}
	if d, err := ed.Diff(ctx, e.member, e.project, editor.DiffOptions{}); err != nil || !strings.Contains(d.Patch, "-one\n+two\n") {
		t.Fatalf("diff: %+v, %v", d, err)
	}
	if _, err := ed.Diff(ctx, e.member, e.project, editor.DiffOptions{From: "HEAD"}); err != nil {
		t.Fatal(err)
	}
	if _, err := ed.Log(ctx, e.member, e.project, editor.LogOptions{}); err != nil {
		t.Fatal(err)
	}
	if f, err := ed.Show(ctx, e.member, e.project, "HEAD", "f.txt", 0); err != nil || f.Content != "one\n" {
		t.Fatalf("show: %+v, %v", f, err)
	}
	if got := listDir(t, markers); len(got) != 0 {
		t.Fatalf("a read ran the project's programs: %v", got)
	}

	// Each trap is armed: plain git, with that trap alone, runs it. (The
	// pagers only run on a terminal, hooks never on a read, and smudge
	// only with other drivers or on checkout: they are set above but not
	// proved here.)
	proved := []string{"core.fsmonitor", "diff.external", "diff.evil.command", "diff.evil.textconv", "filter.evil.clean", "filter.evil.process"}
	for key := range traps {
		e.git(t, "config", "--unset-all", key)
	}
	for _, key := range proved {
		e.git(t, "config", key, traps[key])
		e.gitErr("status")
		e.gitErr("diff")
		e.git(t, "config", "--unset-all", key)
		if got := listDir(t, markers); len(got) != 1 {
			t.Errorf("plain git with %s ran %v, want exactly its trap: the test proves nothing for it", key, got)
		}
		for _, m := range listDir(t, markers) {
			os.Remove(filepath.Join(markers, m))
		}
	}
}

func listDir(t *testing.T, dir string) []string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	return names
}

// TestCredentialsNeverLeak checks every read's answer, through Serve, for
// the remote URL's password.
func TestCredentialsNeverLeak(t *testing.T) {
	e := newEnv(t)
	r := e.buildRich(t)
	// The unstaged change adds the URL too.
	e.write(t, "b.txt", "b unstaged, pushing to "+secretURL+"\n")
	ed := e.editor(t)
	base := fmt.Sprintf("/v1/projects/%d/git/", e.project)
	redacted := 0
	for _, q := range []string{
		"status",
		"log", "log?limit=1", "log?ref=origin/main",
		"diff", "diff?staged=true", "diff?from=" + r.base + "&to=" + r.ours, "diff?from=" + r.base,
		"diff?from=" + r.base + "&to=origin/nope",
		"show?ref=" + r.base + "&path=remote.txt", "show?path=remote.txt&max=20",
	} {
		code, body := read(t, ed, e.member, base+q)
		if strings.Contains(body, "s3cret") {
			t.Errorf("%s (%d) leaks the password: %s", q, code, body)
		}
		if strings.Contains(body, "[REDACTED]") {
			redacted++
		}
		if code != http.StatusOK && !strings.Contains(q, "nope") {
			t.Errorf("%s: %d %s", q, code, body)
		}
	}
	if redacted < 4 {
		t.Errorf("only %d responses carried a redacted URL: the password never reached the redactor", redacted)
	}
	// The upstream's name is kept.
	_, body := read(t, ed, e.member, base+"status")
	if !strings.Contains(body, `"upstream":"origin/main"`) {
		t.Errorf("status lost the upstream: %s", body)
	}
}

// TestServe runs each read through Serve, the daemon's entry, and its
// failures' kinds (the API's: the daemon answers them with their statuses;
// authentication is the daemon's).
func TestServe(t *testing.T) {
	e := newEnv(t)
	e.git(t, "init", "-q", "-b", "main")
	for i := range 3 {
		e.write(t, "f.txt", strconv.Itoa(i))
		e.git(t, "add", ".")
		e.git(t, "commit", "-q", "-m", "c"+strconv.Itoa(i))
	}
	ed := e.editor(t)
	p := fmt.Sprintf("/v1/projects/%d/git/", e.project)

	code, body := read(t, ed, e.member, p+"log?limit=2&skip=0")
	var lg editor.Log
	if code != 200 || json.Unmarshal([]byte(body), &lg) != nil || len(lg.Commits) != 2 || !lg.HasMore || lg.Commits[0].Subject != "c2" {
		t.Fatalf("log: %d %s", code, body)
	}
	code, body = read(t, ed, e.member, p+"show?ref=HEAD~2&path=f.txt")
	var f editor.File
	if code != 200 || json.Unmarshal([]byte(body), &f) != nil || f.Content != "0" {
		t.Fatalf("show: %d %s", code, body)
	}
	code, body = read(t, ed, e.member, p+"diff?from=HEAD~1&to=HEAD&max=10")
	var d editor.Diff
	if code != 200 || json.Unmarshal([]byte(body), &d) != nil || !d.Truncated || len(d.Patch) > 10 {
		t.Fatalf("diff: %d %s", code, body)
	}
	code, body = read(t, ed, e.member, p+"status")
	var st editor.Status
	if code != 200 || json.Unmarshal([]byte(body), &st) != nil || !st.IsRepo || st.Branch.Head != "main" ||
		!strings.Contains(body, `"entries":[]`) {
		t.Fatalf("status of a clean repository: %d %s", code, body)
	}

	for _, c := range []struct {
		actor sandbox.Actor
		path  string
		code  int
		kind  api.ErrorKind
	}{
		{e.outsider, p + "status", 403, editor.KindForbidden},
		{e.member, fmt.Sprintf("/v1/projects/%d/git/status", e.project+9), 404, editor.KindNotFound},
		{e.member, "/v1/projects/x/git/status", 400, editor.KindInvalid},
		{e.member, p + "log?ref=-x", 400, editor.KindInvalid},
		{e.member, p + "log?limit=z", 400, editor.KindInvalid},
		{e.member, p + "diff?staged=maybe", 400, editor.KindInvalid},
		{e.member, p + "show?path=", 400, editor.KindInvalid},
		{e.member, p + "log?ref=nope", 404, editor.KindUnknownRevision},
		{e.member, p + "show?path=missing", 404, editor.KindUnknownRevision},
	} {
		actor := c.actor
		code, body := read(t, ed, actor, c.path)
		if code != c.code || errorKind(t, body) != string(c.kind) {
			t.Errorf("%s as %d: %d %s, want %d %s", c.path, actor.AccountUserID, code, body, c.code, c.kind)
		}
	}
}

// read runs the Git read of path through Serve as actor and returns what
// the daemon answers: 200 and the read's JSON, or the status of the
// error's kind and {"error":{"kind","message"}}.
func read(t *testing.T, ed editor.Domain, actor sandbox.Actor, path string) (int, string) {
	t.Helper()
	v, err := editor.Serve(ed, httptest.NewRequest(http.MethodGet, path, nil), actor)
	if err != nil {
		var e *editor.Error
		if !errors.As(err, &e) {
			t.Fatalf("%s: %T is not an *editor.Error: %v", path, err, err)
		}
		var body struct {
			Error struct {
				Kind    api.ErrorKind `json:"kind"`
				Message string        `json:"message"`
			} `json:"error"`
		}
		body.Error.Kind, body.Error.Message = e.Kind, e.Message
		b, _ := json.Marshal(body)
		return e.Kind.Status(), string(b)
	}
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return http.StatusOK, string(b)
}

func errorKind(t *testing.T, body string) string {
	t.Helper()
	var v struct {
		Error struct{ Kind, Message string }
	}
	if err := json.Unmarshal([]byte(body), &v); err != nil {
		t.Fatalf("error body %q: %v", body, err)
	}
	return v.Error.Kind
}

func noSecret(t *testing.T, v any) {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(b), "s3cret") {
		t.Errorf("response leaks the password: %s", b)
	}
}

// TestBuiltin checks that core loads the editor by default and that it
// reaches the sandbox through its own consumer.
func TestBuiltin(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("the host provider's tests run as root (as CI does)")
	}
	c, err := core.Build(context.Background(), core.Options{
		StorePath: filepath.Join(t.TempDir(), "corral.db"), Migrate: true, Logger: slog.New(slog.DiscardHandler),
	})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ed, err := plugin.ResolveCoreAs[*editor.Editor](c.Registry(), plugin.DomainEditor)
	if err != nil {
		t.Fatalf("the editor is not a built-in: %v", err)
	}
	if _, err := ed.Status(context.Background(), sandbox.Actor{AccountUserID: 1}, 1); !errors.Is(err, sandbox.ErrNotFound) {
		t.Fatalf("status of a missing project: %v", err)
	}
}
