package store

import (
	"context"
	"errors"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/corral-sandbox/corral/internal/pgtest"
	"github.com/jackc/pgx/v5"
)

// A membership change still in flight (its transaction has raised the
// project's tenancy version and not committed) when a command's lease is
// inserted under the old version: the insert waits for the change (it
// locks the project's row FOR SHARE) and, once the change commits, is
// refused. Without the lock the lease would commit after the revocation,
// unseen by whoever ends the revoked member's work.
func TestTenancyChangeInFlightRefusesLease(t *testing.T) {
	ctx := context.Background()
	d := &testDB{backend: SchemePostgres, url: pgtest.NewDatabase(t)}
	s, c := d.newStore(t)
	a, err := s.CreateAccount(ctx, "a")
	must(t, err)
	p, err := s.CreateProject(ctx, NewProject{Kind: ProjectHost, Name: "p", Root: "/p"})
	must(t, err)
	_, err = s.AddMember(ctx, Member{Project: p.ID, Account: a.ID})
	must(t, err)
	ten, err := s.CachedTenancy(ctx, p.ID, a.ID)
	must(t, err)

	admin, err := pgx.Connect(ctx, d.url)
	must(t, err)
	defer admin.Close(ctx)
	tx, err := admin.Begin(ctx)
	must(t, err)
	if _, err := tx.Exec(ctx, `WITH m AS (DELETE FROM members WHERE project = $1 AND account = $2 RETURNING project)
		UPDATE projects SET tenancy_version = tenancy_version + 1 WHERE id IN (SELECT project FROM m)`, p.ID, a.ID); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		_, err := s.CreateLease(ctx, NewLease{Account: a.ID, Project: p.ID, Kind: "terminal", TTL: time.Minute, TenancyVersion: ten.Version,
			Journal: &JournalCommand{Account: a.ID, Project: p.ID, LeaseKind: "terminal", Argv: []string{"true"}}}, c.Now())
		done <- err
	}()
	// The insert waits for the change's lock: wait until the server says so.
	for deadline := time.Now().Add(10 * time.Second); ; {
		var waiting int
		must(t, admin.QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'").Scan(&waiting))
		if waiting == 1 {
			break
		}
		select {
		case err := <-done:
			t.Fatalf("the lease insert did not wait for the change in flight: %v", err)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatal("the lease insert never waited for the change's lock")
		}
		time.Sleep(5 * time.Millisecond)
	}
	must(t, tx.Commit(ctx))
	if err := <-done; !errors.Is(err, ErrTenancyChanged) {
		t.Fatalf("lease under the version before the change = %v; want ErrTenancyChanged", err)
	}
	if n, err := s.LiveLeaseCount(ctx); err != nil || n != 0 {
		t.Fatalf("%d live leases, %v; want none", n, err)
	}
}

// The server restarts under a store: calls while it is down fail with
// ErrUnavailable within their deadline, and once it is back the same
// store works again, without reopening.
func TestPostgresRestartUnavailable(t *testing.T) {
	if _, err := pgtest.Shared(); err != nil {
		t.Skip(err)
	}
	srv, err := pgtest.Start()
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Stop(true)
	ctx := context.Background()
	url, err := srv.CreateDatabase(ctx, "restart")
	must(t, err)
	s, err := Open(ctx, url, Options{Migrate: true, ConnectTimeout: time.Second})
	must(t, err)
	defer s.Close()
	_, err = s.CreateAccount(ctx, "before")
	must(t, err)

	must(t, srv.Stop(false))
	// A call that hung until its deadline would fail with
	// context.DeadlineExceeded instead.
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	_, err = s.ListAccounts(cctx)
	cancel()
	if !errors.Is(err, ErrUnavailable) {
		t.Fatalf("ListAccounts with the server down = %v; want ErrUnavailable", err)
	}
	must(t, srv.Restart(ctx, 0))
	// The pool drops the broken connections and dials new ones.
	var as []Account
	for deadline := time.Now().Add(10 * time.Second); ; {
		if as, err = s.ListAccounts(ctx); err == nil || time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err != nil || len(as) != 1 || as[0].Name != "before" {
		t.Fatalf("after the restart: %+v, %v", as, err)
	}
}

// A role with a password: Open finds it in PGPASSWORD or in a passfile as
// libpq does, and a wrong one fails without the password in the error.
func TestPostgresPassword(t *testing.T) {
	srv, err := pgtest.Shared()
	if err != nil {
		t.Skip(err)
	}
	ctx := context.Background()
	db := "pwdb_" + strconv.FormatInt(time.Now().UnixNano(), 36)
	if _, err := srv.CreateDatabase(ctx, db); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		srv.DropDatabase(context.Background(), db)
		srv.Exec(context.Background(), "DROP ROLE IF EXISTS "+db)
	})
	must(t, srv.Exec(ctx, "CREATE ROLE "+db+" LOGIN PASSWORD 'hunter2-"+db+"'"))
	must(t, srv.Exec(ctx, "ALTER DATABASE "+db+" OWNER TO "+db))
	u := "postgres:///" + db + "?host=" + url.QueryEscape(srv.SocketDir()) + "&user=" + db
	open := func() error {
		s, err := Open(ctx, u, Options{Migrate: true})
		if err == nil {
			s.Close()
		}
		return err
	}

	t.Setenv("PGPASSFILE", filepath.Join(t.TempDir(), "none"))
	t.Setenv("PGPASSWORD", "")
	if err := open(); err == nil {
		t.Fatal("Open without a password succeeded")
	}
	t.Setenv("PGPASSWORD", "hunter2-"+db)
	if err := open(); err != nil {
		t.Fatalf("with PGPASSWORD: %v", err)
	}
	t.Setenv("PGPASSWORD", "")
	passfile := filepath.Join(t.TempDir(), "pgpass")
	must(t, os.WriteFile(passfile, []byte("*:*:*:"+db+":hunter2-"+db+"\n"), 0o600))
	t.Setenv("PGPASSFILE", passfile)
	if err := open(); err != nil {
		t.Fatalf("with a passfile: %v", err)
	}
	wrong := strings.Replace(u, "postgres:///", "postgres://"+db+":wrong-secret@/", 1)
	_, err = Open(ctx, wrong, Options{})
	if err == nil || strings.Contains(err.Error(), "wrong-secret") {
		t.Fatalf("Open with a wrong password = %v; want an error without the password", err)
	}
}
