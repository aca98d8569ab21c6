package suites

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/corral-sandbox/corral/client"
	"github.com/corral-sandbox/corral/daemon"
	"github.com/corral-sandbox/corral/internal/pgtest"
	"github.com/corral-sandbox/corral/internal/testworker"
	"github.com/corral-sandbox/corral/projects"
	"github.com/corral-sandbox/corral/sandbox/sandboxtest"
	"github.com/corral-sandbox/corral/store"
)

// replicas is several daemons ("replicas", children of the test running
// daemon.Run as `corral daemon` does) serving one store and one worker.
// They share a state directory (the worker's projects root is its
// projects/), each with its own API socket and name r0, r1, …; the
// account "admin" is their administrator.
type replicas struct {
	st     store.Store
	worker *testworker.Worker
	d      []*daemonProc
	admin  string // the admin's token
}

// backends are the stores replicas are tested on: an SQLite file that
// every replica opens, and PostgreSQL where its backend and server exist.
var backends = []struct {
	name string
	url  func(t testing.TB, state string) string
}{
	{"sqlite", func(_ testing.TB, state string) string { return store.DefaultURL(state) }},
	{"postgres", func(t testing.TB, _ string) string { return postgresURL(t, pgtest.NewDatabase(t)) }},
}

// postgresURL returns url, a new PostgreSQL database's, once this build's
// store opens it; it skips t, saying why, where it cannot.
func postgresURL(t testing.TB, url string) string {
	t.Helper()
	st, err := store.Open(context.Background(), url, store.Options{Migrate: true})
	if err != nil && strings.Contains(err.Error(), "not supported by this build") {
		t.Skip(err)
	}
	must(t, err)
	must(t, st.Close())
	return url
}

// startReplicas starts n replicas on the store url names, with a lease
// TTL of 1 s.
func startReplicas(t testing.TB, n int, url string, state string) *replicas {
	return startReplicasWith(t, n, url, state, false)
}

// startReplicasWith is startReplicas; defaultLeases gives the replicas the
// default lease TTL and sweep instead.
func startReplicasWith(t testing.TB, n int, url string, state string, defaultLeases bool) *replicas {
	t.Helper()
	ctx := context.Background()
	must(t, os.MkdirAll(projects.WorkspacesDir(state), 0o711))
	w := testworker.Start(t, testworker.Options{ProjectsRoot: projects.WorkspacesDir(state)})
	st, err := store.Open(ctx, url, store.Options{Migrate: true})
	must(t, err)
	t.Cleanup(func() { st.Close() })
	admin, err := st.CreateAccount(ctx, "admin")
	must(t, err)
	tok, _, err := st.CreateToken(ctx, admin.ID, "bootstrap")
	must(t, err)
	// sun_path holds 108 bytes: the sockets go to a short directory.
	socks, err := os.MkdirTemp("", "rep")
	must(t, err)
	t.Cleanup(func() { os.RemoveAll(socks) })
	rs := &replicas{st: st, worker: w, admin: tok}
	for i := 0; i < n; i++ {
		d := &daemonProc{state: state, worker: w.Socket, store: url,
			socket: filepath.Join(socks, fmt.Sprintf("r%d.sock", i)), replica: fmt.Sprintf("r%d", i), defaultLeases: defaultLeases}
		d.start(t)
		t.Cleanup(d.kill)
		rs.d = append(rs.d, d)
	}
	return rs
}

// client returns a client of replica i with token.
func (rs *replicas) client(t testing.TB, i int, token string) *client.Client {
	t.Helper()
	c, err := client.New(rs.d[i].sock(), token)
	must(t, err)
	return c
}

// clients returns a client of every replica with token.
func (rs *replicas) clients(t testing.TB, token string) []*client.Client {
	var cs []*client.Client
	for i := range rs.d {
		cs = append(cs, rs.client(t, i, token))
	}
	return cs
}

func apiStatus(err error) int {
	var ae *client.Error
	if errors.As(err, &ae) {
		return ae.Status
	}
	return 0
}

// TestReplicas: three replicas on one store and one worker serve the same
// accounts and projects. An account and token made through one work
// through the others at once; a project made through one runs commands
// through another; a command outlives many lease TTLs while every
// replica's reconciler sweeps (none expires another's live lease); a
// background process is answered for by its owner only, the others
// answering 409 with its name; revoking a token is refused by every
// replica at once and ends its live accesses on every replica (a session,
// a watch, a streamed command, a process-output follow) within the check
// interval; removing a member ends that member's watch.
func TestReplicas(t *testing.T) { onEveryBackend(t, 3, testReplicas) }

// onEveryBackend runs test with n replicas on each backend.
func onEveryBackend(t *testing.T, n int, test func(*testing.T, *replicas)) {
	for _, be := range backends {
		t.Run(be.name, func(t *testing.T) {
			state := t.TempDir()
			test(t, startReplicas(t, n, be.url(t, state), state))
		})
	}
}

func testReplicas(t *testing.T, rs *replicas) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	admin := rs.clients(t, rs.admin)

	// An account and a token made through r0 work through r1 and r2.
	_, err := admin[0].CreateAccount(ctx, "bob")
	must(t, err)
	tok, err := admin[0].CreateToken(ctx, "bob", "t")
	must(t, err)
	bob := rs.clients(t, tok.Token)
	for i, c := range bob {
		if _, err := c.Whoami(ctx); err != nil {
			t.Fatalf("r%d refused a token made through r0: %v", i, err)
		}
	}

	// A project made through r1 runs commands through r2 and r0.
	p, err := bob[1].CreateProject(ctx, client.ProjectRequest{Name: "shared"})
	must(t, err)
	for _, i := range []int{2, 0} {
		res, err := bob[i].RunCommand(ctx, p.ID, client.CommandRequest{Command: argv("echo", "via", fmt.Sprint(i))})
		if err != nil || res.Stdout != fmt.Sprintf("via %d\n", i) {
			t.Fatalf("r%d: %+v %v", i, res, err)
		}
	}
	_, err = admin[0].CreateAccount(ctx, "carol")
	must(t, err)
	ctok, err := admin[0].CreateToken(ctx, "carol", "t")
	must(t, err)
	must(t, bob[2].AddMember(ctx, p.ID, "carol", false))
	carol := rs.clients(t, ctok.Token)

	// Every replica sweeps leases 5 times a second with a TTL of 1 s: a
	// command of 3 s on r1 lives through all of it.
	res, err := bob[1].RunCommand(ctx, p.ID, client.CommandRequest{Command: argv("sh", "-c", "sleep 3; echo alive"), TimeoutMs: 30000})
	if err != nil || res.Stdout != "alive\n" {
		t.Fatalf("a command of a live replica outlasting its TTL: %+v %v", res, err)
	}

	// A background process started through r0 is r0's.
	proc, err := bob[0].StartProcess(ctx, p.ID, client.ProcessRequest{Argv: []string{"sleep", sandboxtest.SleepToken()}})
	must(t, err)
	if _, err := bob[0].Process(ctx, p.ID, proc.ID); err != nil {
		t.Fatalf("owner: %v", err)
	}
	for _, i := range []int{1, 2} {
		_, err := bob[i].Process(ctx, p.ID, proc.ID)
		if apiStatus(err) != http.StatusConflict || !strings.Contains(err.Error(), `"r0"`) {
			t.Errorf("r%d answered for r0's process with %v, want 409 naming r0", i, err)
		}
	}
	if _, err := bob[1].KillProcess(ctx, p.ID, proc.ID); apiStatus(err) != http.StatusConflict {
		t.Errorf("r1 killed r0's process: %v", err)
	}
	if _, err := bob[0].KillProcess(ctx, p.ID, proc.ID); err != nil {
		t.Errorf("r0 kill: %v", err)
	}
	if _, err := bob[2].Process(ctx, p.ID, "proc_00000000000000000000000000000000"); apiStatus(err) != http.StatusNotFound {
		t.Errorf("an unknown process: %v, want 404", err)
	}

	// Carol's watch on r2 ends within the check interval once she is
	// removed from the project (through the store, as `corral project`
	// does).
	cw, err := carol[2].WatchFiles(ctx, p.ID, "/workspace", "", true)
	must(t, err)
	carolEnded := make(chan error, 1)
	go func() {
		for {
			if _, err := cw.Next(ctx); err != nil {
				carolEnded <- err
				return
			}
		}
	}()
	bobID, err := rs.st.AccountByName(ctx, "carol")
	must(t, err)
	must(t, rs.st.RemoveMember(ctx, p.ID, bobID.ID))
	removed := time.Now()
	for i, c := range carol {
		if _, err := c.Project(ctx, p.ID); apiStatus(err) != http.StatusForbidden {
			t.Errorf("r%d: a removed member's request: %v, want 403", i, err)
		}
	}
	awaitEnd(t, "carol's watch on r2", carolEnded, removed, "no longer a member")

	// Bob's live accesses on every replica: a session on r0, a watch on
	// r1, a streamed command on r2, a process-output follow on r1.
	type access struct {
		name, reason string // reason: what the error says ("": anything)
		ended        chan error
	}
	var accesses []access
	open := func(name, reason string, run func() error) {
		a := access{name, reason, make(chan error, 1)}
		go func() { a.ended <- run() }()
		accesses = append(accesses, a)
	}
	sess, err := bob[0].OpenSession(ctx, p.ID, client.SessionRequest{Argv: []string{"sleep", sandboxtest.SleepToken()}})
	must(t, err)
	open("session on r0", "revoked", func() error { _, err := sess.Wait(); return err })
	bw, err := bob[1].WatchFiles(ctx, p.ID, "/workspace", "", true)
	must(t, err)
	open("watch on r1", "revoked", func() error {
		for {
			if _, err := bw.Next(ctx); err != nil {
				return err
			}
		}
	})
	streaming := make(chan struct{})
	var once sync.Once
	open("streamed command on r2", "revoked", func() error {
		_, err := bob[2].StreamCommand(ctx, p.ID, client.CommandRequest{Command: argv("sh", "-c", "echo up; exec sleep "+sandboxtest.SleepToken()), TimeoutMs: 60000},
			func([]byte) { once.Do(func() { close(streaming) }) }, nil)
		return err
	})
	<-streaming
	out, err := bob[1].StartProcess(ctx, p.ID, client.ProcessRequest{Argv: []string{"sleep", sandboxtest.SleepToken()}})
	must(t, err)
	open("output follow on r1", "", func() error {
		_, err := bob[1].ProcessOutput(ctx, p.ID, out.ID, client.OutputOptions{Follow: true}, func(client.OutputChunk) error { return nil })
		if err == nil {
			err = errors.New("the follow ended without an error")
		}
		return err
	})
	time.Sleep(200 * time.Millisecond) // the follow's request reaches r1

	toks, err := rs.st.ListTokens(ctx, tok.AccountID)
	must(t, err)
	must(t, rs.st.RevokeToken(ctx, toks[0].ID)) // as `corral token revoke` does
	revoked := time.Now()
	for i, c := range bob {
		if _, err := c.Whoami(ctx); apiStatus(err) != http.StatusUnauthorized {
			t.Errorf("r%d after the revocation: %v, want 401", i, err)
		}
	}
	for _, a := range accesses {
		awaitEnd(t, a.name, a.ended, revoked, a.reason)
	}
}

// hostProcesses lists the host processes whose command line contains s.
func hostProcesses(s string) []string {
	var out []string
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		b, _ := os.ReadFile("/proc/" + e.Name() + "/cmdline")
		if c := strings.ReplaceAll(string(b), "\x00", " "); strings.Contains(c, s) {
			out = append(out, e.Name()+": "+c)
		}
	}
	return out
}

// awaitEnd waits for an access to end after a change made at changed,
// and checks that it ended within two check intervals, saying why.
func awaitEnd(t *testing.T, name string, ended <-chan error, changed time.Time, reason string) {
	t.Helper()
	select {
	case err := <-ended:
		took := time.Since(changed)
		t.Logf("%s ended %v after the change: %v", name, took.Round(time.Millisecond), err)
		if took > 2*daemon.DefaultSessionCheckInterval+time.Second {
			t.Errorf("%s ended %v after the change", name, took)
		}
		if err == nil || (reason != "" && !strings.Contains(err.Error(), reason)) {
			t.Errorf("%s ended with %v, want the reason %q", name, err, reason)
		}
	case <-time.After(30 * time.Second):
		t.Errorf("%s still runs 30 s after the change", name)
	}
}

// TestReplicaKilled: kill -9 of one of three replicas in the middle of 50
// running commands. Every one of them ends (its processes gone within the
// lease TTL), the journal shows each as interrupted (the surviving
// replicas' reconcilers expired their leases), and the other replicas
// keep serving without a failed request meanwhile.
func TestReplicaKilled(t *testing.T) { onEveryBackend(t, 3, testReplicaKilled) }

func testReplicaKilled(t *testing.T, rs *replicas) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	admin := rs.clients(t, rs.admin)
	p, err := admin[0].CreateProject(ctx, client.ProjectRequest{Name: "busy"})
	must(t, err)
	const n = 50
	marker := sandboxtest.SleepToken()
	errs := make(chan error, n)
	for i := 0; i < n; i++ {
		go func() {
			res, err := admin[2].RunCommand(ctx, p.ID, client.CommandRequest{Command: argv("sleep", marker), TimeoutMs: 60000})
			if err == nil {
				errs <- fmt.Errorf("a result from a killed replica: %+v", res)
				return
			}
			errs <- nil
		}()
	}
	deadline := time.Now().Add(60 * time.Second)
	for len(hostProcesses(marker)) < n {
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d commands started", len(hostProcesses(marker)), n)
		}
		time.Sleep(20 * time.Millisecond)
	}

	// The survivors serve two clients each, without pause.
	var served, failed atomic.Int64
	var firstFailure atomic.Value
	stop := make(chan struct{})
	var loops sync.WaitGroup
	for _, c := range []*client.Client{admin[0], admin[0], admin[1], admin[1]} {
		loops.Add(1)
		go func() {
			defer loops.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				res, err := c.RunCommand(ctx, p.ID, client.CommandRequest{Command: argv("echo", "ok")})
				if err != nil || res.Stdout != "ok\n" {
					failed.Add(1)
					firstFailure.CompareAndSwap(nil, fmt.Sprintf("%+v %v", res, err))
					continue
				}
				served.Add(1)
			}
		}()
	}
	time.Sleep(300 * time.Millisecond)
	rs.d[2].kill()
	killed := time.Now()
	for i := 0; i < n; i++ {
		if err := <-errs; err != nil {
			t.Error(err)
		}
	}
	for len(hostProcesses(marker)) > 0 {
		if time.Since(killed) > 10*time.Second {
			t.Fatalf("processes of the killed replica's commands still run: %v", hostProcesses(marker))
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Logf("the killed replica's commands ended %v after the kill", time.Since(killed).Round(time.Millisecond))
	if took := time.Since(killed); took > time.Second { // the children's lease TTL
		t.Errorf("the killed replica's commands ended %v after the kill, beyond the lease TTL", took)
	}
	for {
		rows, err := rs.st.ListJournal(ctx, store.JournalFilter{Project: p.ID, Limit: 100000})
		must(t, err)
		var interrupted, open int
		for _, r := range rows {
			if len(r.Argv) == 2 && r.Argv[1] == marker {
				switch r.End.Outcome {
				case store.OutcomeInterrupted:
					interrupted++
				case "":
					open++
				default:
					t.Fatalf("a killed replica's command journaled as %+v", r.End)
				}
			}
		}
		if interrupted == n {
			t.Logf("the journal shows all %d interrupted %v after the kill", n, time.Since(killed).Round(time.Millisecond))
			break
		}
		if interrupted+open != n {
			t.Fatalf("%d journal rows for %d commands", interrupted+open, n)
		}
		if time.Since(killed) > 20*time.Second {
			t.Fatalf("%d of %d journal rows interrupted 20 s after the kill", interrupted, n)
		}
		time.Sleep(100 * time.Millisecond)
	}
	time.Sleep(time.Second) // the survivors keep serving a while longer
	close(stop)
	loops.Wait()
	t.Logf("the surviving replicas served %d commands meanwhile", served.Load())
	if f := failed.Load(); f != 0 {
		t.Errorf("the surviving replicas failed %d requests (served %d); first: %v", f, served.Load(), firstFailure.Load())
	}
	if served.Load() == 0 {
		t.Error("the surviving replicas served nothing")
	}
}
