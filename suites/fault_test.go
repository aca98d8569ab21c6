package suites

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/corral-sandbox/corral/client"
	"github.com/corral-sandbox/corral/daemon"
	"github.com/corral-sandbox/corral/internal/pdeath"
	"github.com/corral-sandbox/corral/internal/testworker"
	"github.com/corral-sandbox/corral/lease"
	"github.com/corral-sandbox/corral/sandbox/sandboxtest"
	"github.com/corral-sandbox/corral/store"
)

const daemonChildEnv = "CORRAL_SUITES_DAEMON"

// maybeRunDaemonChild serves a daemon (daemon.Run, what `corral daemon`
// runs) in a child process of the test (so a test can kill it with
// SIGKILL): state dir, worker socket and, for replicas, store URL, API
// socket and replica name come from the environment; the lease TTL is one
// second (unless _LEASES is "default": the defaults); the account "admin"
// is an administrator.
func maybeRunDaemonChild() {
	state := os.Getenv(daemonChildEnv)
	if state == "" {
		return
	}
	leases := lease.Options{TTL: time.Second, SweepInterval: 200 * time.Millisecond}
	if os.Getenv(daemonChildEnv+"_LEASES") == "default" {
		leases = lease.Options{}
	}
	err := daemon.Run(context.Background(), daemon.Config{
		StateDir:     state,
		Store:        os.Getenv(daemonChildEnv + "_STORE"),
		Socket:       os.Getenv(daemonChildEnv + "_SOCKET"),
		Replica:      os.Getenv(daemonChildEnv + "_REPLICA"),
		WorkerSocket: os.Getenv(daemonChildEnv + "_WORKER"),
		Admins:       []string{"admin"},
		Logger:       slog.New(slog.DiscardHandler),
		Lease:        leases,
	})
	fmt.Fprintln(os.Stderr, "daemon child:", err)
	os.Exit(1)
}

// daemonProc is a daemon child. Store, socket and replica are optional
// (empty: the state directory's database and socket, the default holder
// name); defaultLeases gives it the default lease TTL and sweep.
type daemonProc struct {
	state, worker          string
	store, socket, replica string
	defaultLeases          bool
	cmd                    *exec.Cmd
	done                   chan struct{}
}

// sock returns the daemon's API socket.
func (d *daemonProc) sock() string {
	if d.socket != "" {
		return d.socket
	}
	return filepath.Join(d.state, "corral.sock")
}

func (d *daemonProc) start(t testing.TB) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), daemonChildEnv+"="+d.state, daemonChildEnv+"_WORKER="+d.worker,
		daemonChildEnv+"_STORE="+d.store, daemonChildEnv+"_SOCKET="+d.socket, daemonChildEnv+"_REPLICA="+d.replica)
	if d.defaultLeases {
		cmd.Env = append(cmd.Env, daemonChildEnv+"_LEASES=default")
	}
	cmd.Stderr = os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	// From pdeath's permanent thread: the signal follows the forking
	// thread, and a thread of this process may end (a locked goroutine's,
	// confine's prepared threads end when idle), killing the daemon.
	must(t, pdeath.Start(cmd))
	d.cmd, d.done = cmd, make(chan struct{})
	go func(c *exec.Cmd, done chan struct{}) { _ = c.Wait(); close(done) }(cmd, d.done)
	deadline := time.Now().Add(10 * time.Second)
	for {
		c, err := net.Dial("unix", d.sock())
		if err == nil {
			c.Close()
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("daemon child did not listen: %v", err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func (d *daemonProc) kill() {
	if d.cmd == nil {
		return
	}
	_ = d.cmd.Process.Signal(syscall.SIGKILL)
	<-d.done
	d.cmd = nil
}

// TestDaemonKilled kills -9 the daemon at random points of a command's life
// — before the worker accepted it, right after it started, in the middle of
// its output, and while it is being cancelled — and checks that the caller
// gets an error (never a result), that no process of the command survives
// on the host, that a restarted daemon expires the dead one's lease and the
// journal says the command was interrupted, and that the next command works.
func TestDaemonKilled(t *testing.T) {
	ctx := context.Background()
	w := testworker.Start(t, testworker.Options{})
	state := t.TempDir()
	st, err := store.Open(ctx, filepath.Join(state, "corral.db"), store.Options{Migrate: true})
	must(t, err)
	acct, err := st.CreateAccount(ctx, "alice")
	must(t, err)
	token, _, err := st.CreateToken(ctx, acct.ID, "t")
	must(t, err)
	proj, err := st.CreateProject(ctx, store.NewProject{Kind: store.ProjectManaged, Name: "p", Root: w.Workspace(t, "p")})
	must(t, err)
	_, err = st.AddMember(ctx, store.Member{Project: proj.ID, Account: acct.ID, Role: store.RoleOwner})
	must(t, err)

	d := &daemonProc{state: state, worker: w.Socket}
	d.start(t)
	t.Cleanup(d.kill)
	cl, err := client.New(filepath.Join(state, "corral.sock"), token)
	must(t, err)

	points := []string{"beforeAccept", "afterStart", "midOutput", "duringCancel"}
	rounds := 1
	if *full {
		rounds = 5
	}
	for r := 0; r < rounds; r++ {
		for _, point := range points {
			t.Run(fmt.Sprintf("%s/%d", point, r), func(t *testing.T) {
				// Connections pooled from a daemon killed before are dead: a
				// POST on one fails with EOF (it is not retried).
				cl.HTTPClient().CloseIdleConnections()
				tok := fmt.Sprintf("300.%d", rand.Uint32())
				rctx, cancel := context.WithCancel(ctx)
				defer cancel()
				errc := make(chan error, 1)
				go func() {
					res, err := cl.RunCommand(rctx, proj.ID, client.CommandRequest{
						Command:   argv("sh", "-c", "i=0; while [ $i -lt 100000 ]; do echo line $i; i=$((i+1)); done; sleep "+tok),
						TimeoutMs: 60000,
					})
					if err == nil {
						err = fmt.Errorf("got a result %+v from a killed daemon", res)
						if res == nil {
							err = nil
						}
					}
					errc <- err
				}()
				switch point {
				case "beforeAccept":
					time.Sleep(time.Duration(rand.IntN(3000)) * time.Microsecond)
				case "afterStart":
					waitProc(t, "sh -c i=0")
				case "midOutput":
					waitProc(t, "sh -c i=0")
					time.Sleep(time.Duration(50+rand.IntN(200)) * time.Millisecond)
				case "duringCancel":
					waitProc(t, "sh -c i=0")
					cancel()
					time.Sleep(time.Duration(rand.IntN(2000)) * time.Microsecond)
				}
				d.kill()
				if err := <-errc; err == nil {
					t.Fatal("the caller of a killed daemon got no error")
				} else if strings.Contains(err.Error(), "got a result") {
					t.Fatal(err)
				}
				sandboxtest.AssertNoProcesses(t, "sh -c i=0")
				sandboxtest.AssertNoProcesses(t, tok)

				// A new daemon expires the dead one's lease; the journal says
				// what happened.
				d.start(t)
				cl.HTTPClient().CloseIdleConnections()
				deadline := time.Now().Add(10 * time.Second)
				for {
					n, err := st.LiveLeaseCount(ctx)
					must(t, err)
					rows, err := st.ListJournal(ctx, store.JournalFilter{Project: proj.ID, Limit: 1000})
					must(t, err)
					running := 0
					for _, row := range rows {
						if row.End.Outcome == "" {
							running++
						}
					}
					if n == 0 && running == 0 {
						break
					}
					if time.Now().After(deadline) {
						t.Fatalf("%d live leases, %d journal rows still running, 10 s after the restart", n, running)
					}
					time.Sleep(50 * time.Millisecond)
				}
				res, err := cl.RunCommand(ctx, proj.ID, client.CommandRequest{Command: argv("echo", "next")})
				if err != nil || res.Stdout != "next\n" {
					t.Fatalf("next command: %+v %v", res, err)
				}
			})
		}
	}
	rows, err := st.ListJournal(ctx, store.JournalFilter{Project: proj.ID, Limit: 1000})
	must(t, err)
	interrupted := 0
	for _, row := range rows {
		if row.End.Outcome == store.OutcomeInterrupted {
			interrupted++
		}
	}
	if interrupted == 0 {
		t.Errorf("no journal row says interrupted: %d rows", len(rows))
	}
	st.Close()
}

// waitProc waits until a host process whose command line contains s runs.
func waitProc(t *testing.T, s string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for len(hostProcesses(s)) == 0 {
		if time.Now().After(deadline) {
			t.Fatalf("no process %q started", s)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
