package suites

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/corral-sandbox/corral/client"
	"github.com/corral-sandbox/corral/internal/pgtest"
	"github.com/corral-sandbox/corral/internal/testenv"
	"github.com/corral-sandbox/corral/store"
)

// TestStoreRestarted: PostgreSQL restarted (an immediate shutdown, as a
// crash, and 2 s down) under the load of three replicas. Every request
// either succeeds or fails with 503 "unavailable" before its deadline;
// /healthz says the store is down meanwhile; no journal row is lost (a
// command that answered a result has its row, finished) or doubled (no
// command has two); afterwards every replica serves again without a
// restart.
func TestStoreRestarted(t *testing.T) {
	srv, err := pgtest.Start()
	if errors.Is(err, pgtest.ErrUnavailable) {
		t.Skip(err)
	}
	must(t, err)
	t.Cleanup(func() { srv.Stop(true) })
	ctx := context.Background()
	url, err := srv.CreateDatabase(ctx, "restart")
	must(t, err)
	url = postgresURL(t, url)
	state := t.TempDir()
	rs := startReplicas(t, 3, url, state)
	admin := rs.clients(t, rs.admin)
	p, err := admin[0].CreateProject(ctx, client.ProjectRequest{Name: "load"})
	must(t, err)

	const deadline = 15 * time.Second
	type outcome struct {
		arg  string
		err  error
		took time.Duration
	}
	var (
		mu       sync.Mutex
		outcomes []outcome
		stop     = make(chan struct{})
		load     sync.WaitGroup
	)
	for g := 0; g < 6; g++ {
		load.Add(1)
		go func() {
			defer load.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				arg := fmt.Sprintf("load-%d-%d", g, i)
				rctx, cancel := context.WithTimeout(ctx, deadline)
				start := time.Now()
				res, err := admin[(g+i)%3].RunCommand(rctx, p.ID, client.CommandRequest{Command: argv("echo", arg)})
				cancel()
				if err == nil && res.Stdout != arg+"\n" {
					err = fmt.Errorf("stdout %q", res.Stdout)
				}
				mu.Lock()
				outcomes = append(outcomes, outcome{arg, err, time.Since(start)})
				mu.Unlock()
			}
		}()
	}
	time.Sleep(time.Second)
	restarted := make(chan error, 1)
	go func() { restarted <- srv.Restart(ctx, 2*time.Second) }()
	time.Sleep(500 * time.Millisecond)
	if _, err := admin[1].Health(ctx); apiStatus(err) != http.StatusServiceUnavailable || !strings.Contains(err.Error(), "store") {
		t.Errorf("/healthz with the store down: %v, want 503 naming the store", err)
	}
	must(t, <-restarted)
	time.Sleep(2 * time.Second)
	close(stop)
	load.Wait()

	// Afterwards: every replica is healthy and serves, without a restart.
	for i, c := range admin {
		testenv.WaitFor(t, 15*time.Second, fmt.Sprintf("r%d healthy", i), func() bool { _, err := c.Health(ctx); return err == nil })
		for j := 0; j < 3; j++ {
			if res, err := c.RunCommand(ctx, p.ID, client.CommandRequest{Command: argv("echo", "after")}); err != nil || res.Stdout != "after\n" {
				t.Fatalf("r%d after the restart: %+v %v", i, res, err)
			}
		}
	}

	var ok, unavailable int
	var bad []string
	for _, o := range outcomes {
		var ae *client.Error
		switch {
		case o.err == nil:
			ok++
		case errors.As(o.err, &ae) && ae.Status == http.StatusServiceUnavailable && ae.Kind == "unavailable":
			unavailable++
		default:
			bad = append(bad, fmt.Sprintf("%s: %v", o.arg, o.err))
		}
		if o.took > deadline {
			bad = append(bad, fmt.Sprintf("%s took %v", o.arg, o.took))
		}
	}
	t.Logf("%d requests: %d succeeded, %d unavailable", len(outcomes), ok, unavailable)
	if len(bad) > 0 {
		t.Errorf("%d requests failed otherwise than 503 unavailable, or late; first: %v", len(bad), bad[:min(5, len(bad))])
	}
	if ok == 0 || unavailable == 0 {
		t.Errorf("%d succeeded and %d were unavailable: the restart did not happen under load", ok, unavailable)
	}

	// The journal: once every lease settled, one row per command that
	// answered a result (finished), at most one per other command.
	var rows []store.JournalEntry
	testenv.WaitFor(t, 30*time.Second, "every journal row finished", func() bool {
		rows, err = rs.st.ListJournal(ctx, store.JournalFilter{Project: p.ID, Limit: 1 << 20})
		if err != nil {
			return false
		}
		for _, r := range rows {
			if r.End.Outcome == "" {
				return false
			}
		}
		return true
	})
	byArg := map[string][]store.JournalEntry{}
	for _, r := range rows {
		if len(r.Argv) == 2 {
			byArg[r.Argv[1]] = append(byArg[r.Argv[1]], r)
		}
	}
	for _, o := range outcomes {
		got := byArg[o.arg]
		switch {
		case len(got) > 1:
			t.Errorf("%s has %d journal rows", o.arg, len(got))
		case o.err == nil && len(got) == 0:
			t.Errorf("%s answered a result and has no journal row", o.arg)
		case o.err == nil && got[0].End.Outcome != store.OutcomeExit:
			t.Errorf("%s answered a result and is journaled %+v", o.arg, got[0].End)
		}
	}
	countStatements(t, url) // the connection works after the restart
}

// countStatements returns how many transactions the database url names
// has committed or rolled back (pg_stat_database): each statement outside
// a transaction is one, so its growth per command is the command's round
// trips to the store, less the statements of explicit transactions.
func countStatements(t testing.TB, url string) int64 {
	t.Helper()
	ctx := context.Background()
	c, err := pgx.Connect(ctx, url)
	must(t, err)
	defer c.Close(ctx)
	// Statistics are sent to the collector at the end of a transaction
	// and read as a snapshot: clear it so that this read is fresh.
	_, err = c.Exec(ctx, "SELECT pg_stat_clear_snapshot()")
	must(t, err)
	var n int64
	must(t, c.QueryRow(ctx, "SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = current_database()").Scan(&n))
	return n
}
