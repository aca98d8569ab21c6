package runner_test

import (
	"bufio"
	"context"
	"crypto/sha256"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/corral-sandbox/corral/core"
	"github.com/corral-sandbox/corral/internal/testenv"
	"github.com/corral-sandbox/corral/internal/testworker"
	"github.com/corral-sandbox/corral/lease"
	"github.com/corral-sandbox/corral/machine"
	"github.com/corral-sandbox/corral/plugin"
	"github.com/corral-sandbox/corral/runner"
	"github.com/corral-sandbox/corral/sandbox"
	"github.com/corral-sandbox/corral/sandbox/sandboxtest"
	"github.com/corral-sandbox/corral/store"
)

// env is a state directory with a migrated database, one account that is
// a member of a host project and (with a worker) of a managed project, and
// a "daemon" core on that database whose reconciler sweeps every 50 ms.
type env struct {
	state   string
	daemon  *core.Core
	st      store.Store
	actor   sandbox.Actor
	host    store.Project
	managed store.Project
}

func setup(t *testing.T, w *testworker.Worker) *env {
	t.Helper()
	ctx := context.Background()
	e := &env{state: t.TempDir()}
	d, err := core.Build(ctx, core.Options{
		StorePath: filepath.Join(e.state, "corral.db"),
		Migrate:   true,
		Lease:     lease.Options{SweepInterval: 50 * time.Millisecond},
		Logger:    slog.New(slog.DiscardHandler),
	})
	must(t, err)
	t.Cleanup(func() { d.Close() })
	e.daemon, e.st = d, d.Store()
	acct, err := e.st.CreateAccount(ctx, "alice")
	must(t, err)
	e.actor = sandbox.Actor{AccountUserID: acct.ID}
	e.host, err = e.st.CreateProject(ctx, store.NewProject{Kind: store.ProjectHost, Name: "h", Root: t.TempDir()})
	must(t, err)
	_, err = e.st.AddMember(ctx, store.Member{Project: e.host.ID, Account: acct.ID, Role: store.RoleOwner})
	must(t, err)
	if w != nil {
		e.managed, err = e.st.CreateProject(ctx, store.NewProject{Kind: store.ProjectManaged, Name: "m", Root: w.Workspace(t, "m")})
		must(t, err)
		_, err = e.st.AddMember(ctx, store.Member{Project: e.managed.ID, Account: acct.ID, Role: store.RoleOwner})
		must(t, err)
	}
	return e
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func ref(p store.Project) sandbox.ProjectRef {
	return sandbox.ProjectRef{Kind: sandbox.ProjectKind(p.Kind), ProjectID: p.ID}
}

func argv(file string, args ...string) sandbox.Command {
	return sandbox.Command{Type: sandbox.CommandTypeArgv, File: file, Args: args}
}

// token is unique to this test run, to find the commands' processes.
func token(t *testing.T) string {
	return fmt.Sprintf("corral-runner-test-%d-%d", os.Getpid(), time.Now().UnixNano())
}

// longCommand runs for a minute in two shell processes whose command
// lines carry tok.
func longCommand(tok string) runner.JobCommand {
	return runner.JobCommand{
		Command:   argv("sh", "-c", `sh -c "sleep 60; : `+tok+`" & sleep 60; : `+tok),
		TimeoutMs: 60_000,
	}
}

// processesWith lists live (non-zombie) host processes whose command line
// contains tok.
func processesWith(tok string) []string {
	var found []string
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil || !strings.Contains(string(b), tok) {
			continue
		}
		if !alive(e.Name()) {
			continue
		}
		found = append(found, e.Name()+": "+strings.ReplaceAll(string(b), "\x00", " "))
	}
	return found
}

// alive reports whether process pid exists and is not a zombie.
func alive(pid string) bool {
	st, err := os.ReadFile(filepath.Join("/proc", pid, "stat"))
	if err != nil {
		return false
	}
	i := strings.LastIndexByte(string(st), ')')
	return i > 0 && i+2 < len(st) && st[i+2] != 'Z'
}

// socketInode returns the inode of c's socket.
func socketInode(t *testing.T, c *net.UnixConn) uint64 {
	t.Helper()
	rc, err := c.SyscallConn()
	must(t, err)
	var st unix.Stat_t
	must(t, rc.Control(func(fd uintptr) { err = unix.Fstat(int(fd), &st) }))
	must(t, err)
	return st.Ino
}

// fdTargets returns what process pid's descriptors point to.
func fdTargets(t *testing.T, pid int) []string {
	t.Helper()
	dir := fmt.Sprintf("/proc/%d/fd", pid)
	ents, err := os.ReadDir(dir)
	must(t, err)
	var out []string
	for _, e := range ents {
		if l, err := os.Readlink(filepath.Join(dir, e.Name())); err == nil {
			out = append(out, l)
		}
	}
	return out
}

func (e *env) leases(t *testing.T, f store.LeaseFilter) []store.Lease {
	t.Helper()
	ls, err := e.st.ListLeases(context.Background(), f)
	must(t, err)
	return ls
}

// TestJob: a job of three commands yields exactly three results with the
// pinned shapes, run through the one connection the runner inherited.
func TestJob(t *testing.T) {
	w := testworker.Start(t, testworker.Options{})
	e := setup(t, w)
	ctx := context.Background()
	tok := token(t)

	// The parent dials; the runner gets that connection and no socket path.
	conn, err := machine.Dial(ctx, w.Socket)
	must(t, err)
	ino := socketInode(t, conn)
	p, err := runner.Start(ctx, runner.StartOptions{
		StateDir: e.state,
		Conn:     conn,
		Env:      runnerEnv(),
		LeaseTTL: 3 * time.Second,
		Job: runner.Job{
			Actor:   e.actor,
			Project: ref(e.managed),
			Commands: []runner.JobCommand{
				{Command: argv("sh", "-c", "echo out-"+tok+"; echo err >&2")},
				{Command: argv("sh", "-c", "echo partial; exit 3"), OutputLimit: sandbox.OutputLimit{Combined: 1024}},
				{Command: argv("sh", "-c", "sleep 30; : "+tok), TimeoutMs: 1500},
			},
		},
	})
	must(t, err)
	if n := conn.Close(); n == nil {
		t.Error("Start left the parent's copy of the worker connection open")
	}
	targets := fdTargets(t, p.Pid())
	if want := fmt.Sprintf("socket:[%d]", ino); !slices.Contains(targets, want) {
		t.Errorf("runner's descriptors %v do not hold the inherited connection %s", targets, want)
	}
	for _, f := range []string{"cmdline", "environ"} {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/%s", p.Pid(), f))
		must(t, err)
		if strings.Contains(string(b), filepath.Dir(w.Socket)) {
			t.Errorf("the runner's %s names the worker's socket", f)
		}
	}

	results, err := p.Wait()
	if err != nil {
		t.Fatalf("Wait: %v (results %+v)", err, results)
	}
	if len(results) != 3 {
		t.Fatalf("%d results, want 3", len(results))
	}
	if r := results[0].Result; r == nil || r.Stdout != "out-"+tok+"\n" || r.Stderr != "err\n" || r.Code == nil || *r.Code != 0 || r.Signal != "" {
		t.Errorf("success: %+v %+v", results[0].Result, results[0].Err)
	}
	if r := results[1].Result; r == nil || r.Stdout != "partial\n" || r.Code == nil || *r.Code != 3 {
		t.Errorf("nonzero: %+v %+v", results[1].Result, results[1].Err)
	}
	if r := results[2]; r.Err == nil || r.Err.Kind != sandbox.KindTimeout || r.Result != nil {
		t.Errorf("timeout: %+v %+v", r.Result, r.Err)
	}
	sandboxtest.AssertNoProcesses(t, tok)

	// The commands ran in the managed machine, under runner leases held by
	// that runner process, and every lease was released.
	if ms := w.Machines(); len(ms) != 1 || ms[0].ProjectID != e.managed.ID {
		t.Errorf("worker machines %+v, want the managed project's", ms)
	}
	rows, err := e.st.ListJournal(ctx, store.JournalFilter{Project: e.managed.ID})
	must(t, err)
	if len(rows) != 3 {
		t.Fatalf("%d journal rows, want 3", len(rows))
	}
	for _, r := range rows {
		if r.LeaseKind != string(sandbox.LeaseRunner) || r.Domain != "sandbox" || r.Account != e.actor.AccountUserID {
			t.Errorf("journal row %+v", r.JournalCommand)
		}
	}
	holder := fmt.Sprintf("corral runner pid %d on ", p.Pid())
	ls := e.leases(t, store.LeaseFilter{Project: e.managed.ID})
	if len(ls) != 3 {
		t.Fatalf("%d leases, want 3", len(ls))
	}
	for _, l := range ls {
		if l.Kind != "runner" || !strings.HasPrefix(l.Holder, holder) || l.State != store.LeaseReleased || l.TTL != 3*time.Second {
			t.Errorf("lease %+v", l)
		}
	}
}

// TestRunLines runs a job in-process over pipes and checks the exact
// lines: one JSON object per command, in the pinned shapes.
func TestRunLines(t *testing.T) {
	e := setup(t, nil)
	job := runner.Job{
		Actor:   e.actor,
		Project: ref(e.host),
		Commands: []runner.JobCommand{
			{Command: argv("echo", "hi"), Cwd: e.host.Root},
			{Command: argv("sh", "-c", "exit 7"), Cwd: e.host.Root},
			{Command: argv("no-such-program-anywhere"), Cwd: e.host.Root},
			{Command: argv("true"), Cwd: e.host.Root, TimeoutMs: -1},
		},
	}
	in, inw := io.Pipe()
	defer inw.Close()
	var out strings.Builder
	done := make(chan error, 1)
	go func() {
		done <- runner.Run(context.Background(), runner.Options{
			StorePath: filepath.Join(e.state, "corral.db"),
			Stdin:     in, Stdout: &out,
			Logger: slog.New(slog.DiscardHandler),
		})
	}()
	must(t, json.NewEncoder(inw).Encode(job))
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSuffix(out.String(), "\n"), "\n")
	if len(lines) != 4 {
		t.Fatalf("%d lines, want 4:\n%s", len(lines), out.String())
	}
	keys := func(line string) []string {
		var m map[string]json.RawMessage
		must(t, json.Unmarshal([]byte(line), &m))
		var ks []string
		for k := range m {
			ks = append(ks, k)
		}
		slices.Sort(ks)
		return ks
	}
	if got := lines[0]; got != `{"stdout":"hi\n","stderr":"","code":0,"signal":null}` {
		t.Errorf("line 1 = %s", got)
	}
	if got := lines[1]; got != `{"stdout":"","stderr":"","code":7,"signal":null}` {
		t.Errorf("line 2 = %s", got)
	}
	for i, kind := range map[int]string{2: "start", 3: "prepare"} {
		if ks := keys(lines[i]); !slices.Equal(ks, []string{"error"}) {
			t.Errorf("line %d keys %v", i+1, ks)
		}
		var body struct{ Error map[string]string }
		must(t, json.Unmarshal([]byte(lines[i]), &body))
		ks := slices.Sorted(func(yield func(string) bool) {
			for k := range body.Error {
				if !yield(k) {
					return
				}
			}
		})
		if !slices.Equal(ks, []string{"kind", "message", "stderr", "stdout"}) || body.Error["kind"] != kind {
			t.Errorf("line %d = %s, want kind %s", i+1, lines[i], kind)
		}
	}
	var r runner.Result
	must(t, json.Unmarshal([]byte(lines[2]), &r))
	if r.Err == nil || r.Result != nil {
		t.Errorf("decoded error line: %+v", r)
	}
}

// TestRunBadJob: a malformed job is refused before the store is opened;
// a closed stdin without a job is abandonment.
func TestRunBadJob(t *testing.T) {
	for _, c := range []struct {
		in   string
		want error
	}{
		{`{"actor":{"accountUserId":1},"nope":1}`, runner.ErrBadJob},
		{`[1,2]`, runner.ErrBadJob},
		{``, runner.ErrAbandoned},
		{`{"actor":`, runner.ErrAbandoned},
	} {
		var out strings.Builder
		err := runner.Run(context.Background(), runner.Options{
			StorePath: filepath.Join(t.TempDir(), "absent.db"),
			Stdin:     strings.NewReader(c.in), Stdout: &out,
		})
		if !errors.Is(err, c.want) || out.Len() != 0 {
			t.Errorf("job %q: %v, output %q; want %v", c.in, err, out.String(), c.want)
		}
	}
}

// TestCore: a runner core has no plugin services, no Sites control, no
// transport unless given one, and never migrates.
func TestCore(t *testing.T) {
	e := setup(t, nil)
	ctx := context.Background()
	path := filepath.Join(e.state, "corral.db")
	c, err := runner.NewCore(ctx, runner.Options{StorePath: path, Logger: slog.New(slog.DiscardHandler)})
	must(t, err)
	defer c.Close()
	if c.Services() != nil {
		t.Error("a runner core has a plugin-service manager")
	}
	if c.Migrated() {
		t.Error("a runner core was built with Migrate")
	}
	if _, err := c.Sandbox(); err != nil {
		t.Errorf("no sandbox control: %v", err)
	}
	if ctl, err := plugin.ResolveCoreAs[any](c.Registry(), plugin.DomainSites); err == nil {
		t.Errorf("a runner core resolves a Sites control: %T", ctl)
	}
	if _, ok := c.Registry().Owner(plugin.DomainSites); ok {
		t.Error("the sites domain has an owner in a runner core")
	}
	if _, err := c.Gateway().Dial(ctx, machine.Project{ID: 1, Workspace: "/nonexistent"}, 80); !errors.Is(err, machine.ErrNoPrivilegedTransport) {
		t.Errorf("gateway without a transport: %v", err)
	}
	if c.Leases().TTL() != lease.DefaultTTL {
		t.Errorf("default lease TTL %v", c.Leases().TTL())
	}

	// A database that does not exist is not created.
	missing := filepath.Join(t.TempDir(), "corral.db")
	if _, err := runner.NewCore(ctx, runner.Options{StorePath: missing}); !errors.Is(err, store.ErrSchemaMismatch) {
		t.Errorf("missing database: %v", err)
	}
	if _, err := os.Stat(missing); !os.IsNotExist(err) {
		t.Errorf("a runner created the database: %v", err)
	}
}

// TestNeverMigrates: a runner given a database of a newer schema exits 1
// with a schema error, reports nothing and leaves the database untouched.
func TestNeverMigrates(t *testing.T) {
	ctx := context.Background()
	state := t.TempDir()
	path := filepath.Join(state, "corral.db")
	st, err := store.Open(ctx, path, store.Options{Migrate: true})
	must(t, err)
	must(t, st.Close())
	db, err := sql.Open("sqlite", path)
	must(t, err)
	newer := store.LatestVersion() + 1
	_, err = db.ExecContext(ctx, fmt.Sprintf("PRAGMA user_version = %d", newer))
	must(t, err)
	must(t, db.Close())
	before := digest(t, state)

	p, err := runner.Start(ctx, runner.StartOptions{
		StateDir: state,
		Env:      runnerEnv(),
		Job: runner.Job{Actor: sandbox.Actor{AccountUserID: 1}, Project: sandbox.ProjectRef{Kind: sandbox.ProjectHost, ProjectID: 1},
			Commands: []runner.JobCommand{{Command: argv("true")}}},
	})
	must(t, err)
	results, err := p.Wait()
	var ee *runner.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != runner.ExitFailure || len(results) != 0 {
		t.Fatalf("Wait = %v, %v; want exit status %d and no results", results, err, runner.ExitFailure)
	}
	if !strings.Contains(ee.Stderr, fmt.Sprintf("schema version %d, newer than", newer)) {
		t.Errorf("stderr %q does not explain the schema", ee.Stderr)
	}
	if after := digest(t, state); after != before {
		t.Errorf("the state directory changed:\n%s\n%s", before, after)
	}
}

// digest sums every file in dir.
func digest(t *testing.T, dir string) string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	must(t, err)
	var out []string
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join(dir, e.Name()))
		must(t, err)
		out = append(out, fmt.Sprintf("%s %x", e.Name(), sha256.Sum256(b)))
	}
	return strings.Join(out, "\n")
}

// TestParentKilled: SIGKILLing the runner's parent while a command runs
// ends the runner (parent-death signal and stdin EOF): it cancels the
// command, releases its lease and exits ExitAbandoned; the command's
// processes are gone well within the lease TTL.
func TestParentKilled(t *testing.T) {
	w := testworker.Start(t, testworker.Options{})
	e := setup(t, w)
	tok := token(t)
	const ttl = 2 * time.Second

	// Orphans re-parent to this process, so the runner can be reaped and
	// its exit status checked.
	must(t, unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0))
	t.Cleanup(func() { _ = unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0) })

	cfg, err := json.Marshal(parentConfig{
		WorkerSocket: w.Socket, StateDir: e.state, LeaseTTL: ttl,
		Job: runner.Job{Actor: e.actor, Project: ref(e.managed), Commands: []runner.JobCommand{longCommand(tok)}},
	})
	must(t, err)
	parent := exec.Command(os.Args[0])
	parent.Env = append(os.Environ(), roleEnv+"=parent", parentEnv+"="+string(cfg))
	parent.Stderr = os.Stderr
	out, err := parent.StdoutPipe()
	must(t, err)
	must(t, parent.Start())
	defer parent.Process.Kill()
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		parent.Wait()
		t.Fatalf("parent: %v", err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(strings.TrimPrefix(line, "pid ")))
	must(t, err)

	testenv.WaitFor(t, 10*time.Second, "the command to run", func() bool { return len(processesWith(tok)) == 2 })
	if ls := e.leases(t, store.LeaseFilter{State: store.LeaseLive}); len(ls) != 1 || ls[0].Kind != "runner" {
		t.Fatalf("live leases %+v, want the runner's", ls)
	}

	must(t, parent.Process.Kill())
	_ = parent.Wait()
	killed := time.Now()

	var ws unix.WaitStatus
	exited := make(chan error, 1)
	go func() {
		_, err := unix.Wait4(pid, &ws, 0, nil)
		exited <- err
	}()
	select {
	case err := <-exited:
		must(t, err)
	case <-time.After(ttl + 5*time.Second):
		_ = unix.Kill(pid, unix.SIGKILL)
		<-exited
		t.Fatal("the runner outlived its parent")
	}
	if !ws.Exited() || ws.ExitStatus() != runner.ExitAbandoned {
		t.Errorf("runner wait status %v, want exit %d", ws, runner.ExitAbandoned)
	}
	sandboxtest.AssertNoProcesses(t, tok)
	testenv.WaitFor(t, ttl, "no live lease", func() bool {
		return len(e.leases(t, store.LeaseFilter{State: store.LeaseLive})) == 0
	})
	if d := time.Since(killed); d > ttl+time.Second {
		t.Errorf("cleanup took %v, lease TTL %v", d, ttl)
	}
	// The runner cleaned up itself: released, not expired.
	if ls := e.leases(t, store.LeaseFilter{Project: e.managed.ID}); len(ls) != 1 || ls[0].State != store.LeaseReleased {
		t.Errorf("leases %+v, want one released", ls)
	}
	rows, err := e.st.ListJournal(context.Background(), store.JournalFilter{Project: e.managed.ID})
	must(t, err)
	if len(rows) != 1 || rows[0].End.ErrorKind != string(sandbox.KindAbort) {
		t.Errorf("journal %+v, want one aborted command", rows)
	}
}

// TestRunnerKilled: a runner SIGKILLed mid-command cannot clean up. Its
// worker connection closes, so the worker ends the command; its lease
// stops being heartbeated and the daemon's reconciler expires it within
// the TTL, marking the command interrupted.
func TestRunnerKilled(t *testing.T) {
	w := testworker.Start(t, testworker.Options{})
	e := setup(t, w)
	tok := token(t)
	const ttl = 1500 * time.Millisecond

	p, err := runner.Start(context.Background(), runner.StartOptions{
		StateDir: e.state, WorkerSocket: w.Socket, Env: runnerEnv(), LeaseTTL: ttl,
		Job: runner.Job{Actor: e.actor, Project: ref(e.managed), Commands: []runner.JobCommand{longCommand(tok)}},
	})
	must(t, err)
	testenv.WaitFor(t, 10*time.Second, "the command to run", func() bool { return len(processesWith(tok)) == 2 })
	must(t, syscall.Kill(p.Pid(), syscall.SIGKILL))
	killed := time.Now()
	results, err := p.Wait()
	var ee *runner.ExitError
	if !errors.As(err, &ee) || ee.State == nil || ee.State.Exited() || len(results) != 0 {
		t.Fatalf("Wait = %v, %v; want a killed runner", results, err)
	}
	sandboxtest.AssertNoProcesses(t, tok)
	testenv.WaitFor(t, ttl+time.Second, "the lease to expire", func() bool {
		return len(e.leases(t, store.LeaseFilter{State: store.LeaseLive})) == 0
	})
	t.Logf("lease gone %v after the kill (TTL %v)", time.Since(killed), ttl)
	if ls := e.leases(t, store.LeaseFilter{Project: e.managed.ID}); len(ls) != 1 || ls[0].State != store.LeaseExpired {
		t.Errorf("leases %+v, want one expired", ls)
	}
	testenv.WaitFor(t, time.Second, "the journal to mark the command interrupted", func() bool {
		rows, err := e.st.ListJournal(context.Background(), store.JournalFilter{Project: e.managed.ID})
		must(t, err)
		return len(rows) == 1 && rows[0].End.Outcome == store.OutcomeInterrupted
	})
}

// TestAbandon: closing the runner's stdin (the parent's pipe) alone, with
// no signal, makes the runner cancel its command, release the lease and
// exit ExitAbandoned. No worker: a runner without --worker-fd runs host
// commands.
func TestAbandon(t *testing.T) {
	e := setup(t, nil)
	tok := token(t)
	cmd := longCommand(tok)
	cmd.Cwd = e.host.Root
	p, err := runner.Start(context.Background(), runner.StartOptions{
		StateDir: e.state, Env: runnerEnv(),
		Job: runner.Job{Actor: e.actor, Project: ref(e.host), Commands: []runner.JobCommand{cmd}},
	})
	must(t, err)
	testenv.WaitFor(t, 10*time.Second, "the command to run", func() bool { return len(processesWith(tok)) == 2 })
	p.Abandon()
	results, err := p.Wait()
	var ee *runner.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != runner.ExitAbandoned || len(results) != 0 {
		t.Fatalf("Wait = %v, %v; want exit status %d", results, err, runner.ExitAbandoned)
	}
	if !strings.Contains(ee.Stderr, "stdin closed") {
		t.Errorf("stderr %q", ee.Stderr)
	}
	sandboxtest.AssertNoProcesses(t, tok)
	if ls := e.leases(t, store.LeaseFilter{Project: e.host.ID}); len(ls) != 1 || ls[0].State != store.LeaseReleased || ls[0].Kind != "runner" {
		t.Errorf("leases %+v, want one released runner lease", ls)
	}
}
