package pgtest

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

func TestMain(m *testing.M) { os.Exit(Main(m)) }

// Each test gets a database of its own on the one shared server.
func TestNewDatabaseIsFreshAndOwn(t *testing.T) {
	ctx := context.Background()
	a, b := NewDatabase(t), NewDatabase(t)
	if a == b {
		t.Fatalf("two databases with one URL %s", a)
	}
	ca, err := pgx.Connect(ctx, a)
	if err != nil {
		t.Fatal(err)
	}
	defer ca.Close(ctx)
	if _, err := ca.Exec(ctx, "CREATE TABLE x (v int)"); err != nil {
		t.Fatal(err)
	}
	cb, err := pgx.Connect(ctx, b)
	if err != nil {
		t.Fatal(err)
	}
	defer cb.Close(ctx)
	var n int
	if err := cb.QueryRow(ctx, "SELECT count(*) FROM pg_tables WHERE tablename = 'x'").Scan(&n); err != nil || n != 0 {
		t.Fatalf("the other database has table x: %d, %v", n, err)
	}
	// Unix socket only: no TCP listener.
	var listen string
	if err := ca.QueryRow(ctx, "SHOW listen_addresses").Scan(&listen); err != nil || listen != "" {
		t.Fatalf("listen_addresses = %q, %v; want none", listen, err)
	}
}

// A server of a test's own restarts under its clients: their connection
// fails, and a new one works on the same data.
func TestRestart(t *testing.T) {
	if _, err := Shared(); err != nil {
		t.Skip(err)
	}
	s, err := Start()
	if err != nil {
		t.Fatal(err)
	}
	defer s.Stop(true)
	ctx := context.Background()
	url, err := s.CreateDatabase(ctx, "r")
	if err != nil {
		t.Fatal(err)
	}
	c, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Exec(ctx, "CREATE TABLE kept (v int); INSERT INTO kept VALUES (7)"); err != nil {
		t.Fatal(err)
	}
	if err := s.Restart(ctx, 10*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Exec(ctx, "SELECT 1"); err == nil {
		t.Fatal("a connection from before the restart still works")
	}
	c2, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close(ctx)
	var v int
	if err := c2.QueryRow(ctx, "SELECT v FROM kept").Scan(&v); err != nil || v != 7 {
		t.Fatalf("after restart: %d, %v", v, err)
	}
}
