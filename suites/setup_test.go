package suites

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/corral-sandbox/corral/internal/pdeath"
	"github.com/corral-sandbox/corral/internal/pgtest"

	"go.uber.org/goleak"

	"github.com/corral-sandbox/corral/client"
	"github.com/corral-sandbox/corral/confine"
	"github.com/corral-sandbox/corral/core"
	"github.com/corral-sandbox/corral/daemon"
	"github.com/corral-sandbox/corral/internal/testworker"
	"github.com/corral-sandbox/corral/machine"
	"github.com/corral-sandbox/corral/store"
	"github.com/corral-sandbox/corral/worker"
)

var full = flag.Bool("corral.full", false, "run the full (long) versions of the load, fault and hostile-input suites")

func TestMain(m *testing.M) {
	confine.MaybeRun()
	worker.MaybeRunInit()
	testworker.MaybeRunChild()
	maybeRunDaemonChild()
	// pgtest.Main stops the PostgreSQL server tests shared; leaks are
	// looked for after it, as goleak.VerifyTestMain would.
	code := pgtest.Main(m)
	if code == 0 {
		if err := goleak.Find(goleak.IgnoreTopFunction(pdeath.SpawnerFunc)); err != nil {
			fmt.Fprintf(os.Stderr, "goleak: errors on successful test run: %v\n", err)
			code = 1
		}
	}
	os.Exit(code)
}

// stack is a real daemon over a real Unix socket, on a core with a real
// worker, with one account ("alice", member of every project) and its
// client.
type stack struct {
	core     *core.Core
	app      *daemon.App
	client   *client.Client
	worker   *testworker.Worker
	account  store.Account
	projects []store.Project
	socket   string
}

func newStack(t *testing.T, managedProjects int, wopts testworker.Options) *stack {
	t.Helper()
	ctx := context.Background()
	w := testworker.Start(t, wopts)
	metrics := daemon.NewMetrics()
	copts := core.Options{
		StorePath:           filepath.Join(t.TempDir(), "corral.db"),
		Migrate:             true,
		PrivilegedTransport: machine.SocketTransport{Path: w.Socket},
		Logger:              slog.New(slog.DiscardHandler),
	}
	copts.Control.Observe = metrics.Observe
	c, err := core.Build(ctx, copts)
	if err != nil {
		t.Fatal(err)
	}
	app, err := daemon.BuildApp(c, daemon.AppOptions{StateDir: t.TempDir(), Logger: slog.New(slog.DiscardHandler), Metrics: metrics})
	if err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(t.TempDir(), "corral.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: app, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	s := &stack{core: c, app: app, worker: w, socket: sock}
	t.Cleanup(func() {
		sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
		app.Close()
		c.Close()
	})
	st := c.Store()
	s.account, err = st.CreateAccount(ctx, "alice")
	must(t, err)
	token, _, err := st.CreateToken(ctx, s.account.ID, "t")
	must(t, err)
	s.client, err = client.New(sock, token)
	must(t, err)
	for i := 0; i < managedProjects; i++ {
		name := "p" + string(rune('a'+i))
		p, err := st.CreateProject(ctx, store.NewProject{Kind: store.ProjectManaged, Name: name, Root: w.Workspace(t, name)})
		must(t, err)
		_, err = st.AddMember(ctx, store.Member{Project: p.ID, Account: s.account.ID, Role: store.RoleOwner})
		must(t, err)
		s.projects = append(s.projects, p)
	}
	return s
}

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// apiKind returns the error kind of an API error, or "" for nil.
func apiKind(err error) string {
	var ae *client.Error
	if errors.As(err, &ae) {
		return ae.Kind
	}
	if err != nil {
		return "client:" + err.Error()
	}
	return ""
}

func countFDs() int {
	e, _ := os.ReadDir("/proc/self/fd")
	return len(e)
}

// fdTargets lists what this process's descriptors point at.
func fdTargets() []string {
	ents, _ := os.ReadDir("/proc/self/fd")
	var out []string
	for _, e := range ents {
		l, _ := os.Readlink("/proc/self/fd/" + e.Name())
		out = append(out, l)
	}
	return out
}
