package store

import (
	"context"
	"errors"
	"path/filepath"
	"strconv"
	"testing"
	"time"
)

// A database written by schema version 1, with live, released and expired
// leases, migrates to the latest version without losing any lease's
// values, and its leases then work as new ones do.
func TestMigrateFromVersion1(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "corral.db")
	d := &testDB{backend: SchemeSQLite, url: path}
	db := rawDB(t, path)
	if _, err := db.Exec(loadMigrations(SchemeSQLite)[0].sql); err != nil {
		t.Fatal(err)
	}
	const t0 = 1_800_000_000_000
	for _, q := range []string{
		"INSERT INTO projects (id, kind, name, root, created_at) VALUES (1, 'host', 'p', '/p', 0), (2, 'host', 'q', '/q', 0)",
		// live, heartbeated once: its clock, not its row, has the expiry.
		`INSERT INTO leases (seq, id, account, project, kind, domain, holder, state, ttl_ms, created_at, heartbeat_at, expires_at)
			VALUES (1, 'live', 7, 1, 'terminal', 'd', 'h', 'live', 15000, 1800000000000, 1800000000000, 1800000015000)`,
		"INSERT INTO lease_clock (seq, expires_at, ttl_ms) VALUES (1, 1800000020000, 15000)",
		`INSERT INTO leases (seq, id, account, project, kind, domain, holder, state, ttl_ms, created_at, heartbeat_at, expires_at, released_at)
			VALUES (2, 'released', 7, 1, 'files', '', 'h', 'released', 15000, 1800000000000, 1800000000000, 1800000015000, 1800000001000)`,
		`INSERT INTO leases (seq, id, account, project, kind, domain, holder, state, ttl_ms, created_at, heartbeat_at, expires_at, expired_at)
			VALUES (3, 'expired', 7, 2, 'files', '', 'h', 'expired', 15000, 1800000000000, 1800000000000, 1800000015000, 1800000016000)`,
		"PRAGMA user_version = 1",
	} {
		if _, err := db.Exec(q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	db.Close()

	if _, err := Open(ctx, path, Options{}); !errors.Is(err, ErrSchemaMismatch) {
		t.Fatalf("Open(version 1) without Migrate = %v; want ErrSchemaMismatch", err)
	}
	c := newClock()
	s := openTest(t, path, Options{Migrate: true, Now: c.Now})
	if v, err := s.SchemaVersion(ctx); err != nil || v != LatestVersion() {
		t.Fatalf("SchemaVersion = %d, %v; want %d", v, err, LatestVersion())
	}
	// Another process without Migrate now opens it.
	openTest(t, path, Options{Now: c.Now})

	live, err := s.GetLease(ctx, "live")
	if err != nil || live.State != LeaseLive || live.ExpiresAt.UnixMilli() != t0+20000 || live.HeartbeatAt.UnixMilli() != t0+5000 {
		t.Fatalf("live lease after migration = %+v, %v", live, err)
	}
	for id, state := range map[string]LeaseState{"released": LeaseReleased, "expired": LeaseExpired} {
		if l, err := s.GetLease(ctx, id); err != nil || l.State != state || l.ExpiresAt.UnixMilli() != t0+15000 {
			t.Fatalf("%s lease after migration = %+v, %v", id, l, err)
		}
	}
	checkClockInvariant(t, d, s, 1, 2)
	if err := s.DeleteProject(ctx, 1); !errors.Is(err, ErrProjectBusy) {
		t.Fatalf("DeleteProject with a migrated live lease = %v; want ErrProjectBusy", err)
	}

	// The indexes are the new ones.
	var n int
	if err := s.r.QueryRowContext(ctx,
		"SELECT count(*) FROM sqlite_schema WHERE type = 'index' AND name = 'leases_state'").Scan(&n); err != nil || n != 0 {
		t.Fatalf("leases_state index: %d, %v; want dropped", n, err)
	}
	var cols []string
	rows, err := s.r.QueryContext(ctx, "SELECT name FROM pragma_index_info('leases_project')")
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var c string
		if err := rows.Scan(&c); err != nil {
			t.Fatal(err)
		}
		cols = append(cols, c)
	}
	rows.Close()
	if len(cols) != 1 || cols[0] != "project" {
		t.Fatalf("leases_project columns = %v; want [project]", cols)
	}

	// Migrated and new leases live, end and expire as usual.
	at := time.UnixMilli(t0 + 10000)
	if err := s.HeartbeatLease(ctx, "live", at); err != nil {
		t.Fatal(err)
	}
	if _, err := s.ReleaseLease(ctx, "live", at); err != nil {
		t.Fatal(err)
	}
	if got, _ := s.GetLease(ctx, "live"); got.State != LeaseReleased || got.ExpiresAt.UnixMilli() != t0+25000 {
		t.Fatalf("released migrated lease = %+v", got)
	}
	n2, err := s.CreateLease(ctx, NewLease{Project: 2, Kind: "terminal", TTL: time.Second}, at)
	if err != nil {
		t.Fatal(err)
	}
	checkClockInvariant(t, d, s, 1, 2)
	exp, err := s.ExpireLeases(ctx, at.Add(2*time.Second))
	if err != nil || len(exp) != 1 || exp[0].ID != n2.ID || exp[0].State != LeaseExpired {
		t.Fatalf("ExpireLeases = %+v, %v", exp, err)
	}
	checkClockInvariant(t, d, s, 1, 2)
	if err := s.DeleteProject(ctx, 1); err != nil {
		t.Fatalf("DeleteProject after release: %v", err)
	}
}

// The write connection checkpoints at walAutoCheckpoint pages, in WAL mode,
// without giving up the synchronous=NORMAL durability of every commit.
func TestWriterSettings(t *testing.T) {
	ctx := context.Background()
	s, _ := newTestStore(t)
	for pragma, want := range map[string]string{
		"wal_autocheckpoint": strconv.Itoa(walAutoCheckpoint),
		"journal_mode":       "wal",
		"synchronous":        "1", // NORMAL
		"foreign_keys":       "1",
	} {
		var got string
		if err := s.w.QueryRowContext(ctx, "PRAGMA "+pragma).Scan(&got); err != nil || got != want {
			t.Errorf("PRAGMA %s = %q, %v; want %q", pragma, got, err, want)
		}
	}
}

// A journal written before schema 12 (AUTOINCREMENT IDs) keeps its rows,
// IDs and running entries through the rebuild; a new entry takes the next
// ID, and the running ones still finish and are found by lease.
func TestMigrateJournalRowid(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "corral.db")
	db := rawDB(t, path)
	for _, m := range loadMigrations(SchemeSQLite)[:11] {
		if _, err := db.Exec(m.sql); err != nil {
			t.Fatalf("%s: %v", m.name, err)
		}
	}
	for _, q := range []string{
		`INSERT INTO journal (id, account, project, domain, lease, lease_kind, argv, limits, started_at, ended_at, outcome, code, oom_killed)
			VALUES (5, 1, 1, 'd', 'L5', 'terminal', '["true"]', '{}', 1, 2, 'exit', 0, 0),
			       (9, 1, 1, '', 'L9', 'terminal', '["sleep","9"]', '{"timeoutMs":5}', 3, NULL, NULL, NULL, 0)`,
		"PRAGMA user_version = 11",
	} {
		if _, err := db.Exec(q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	db.Close()
	s := openTest(t, path, Options{Migrate: true})
	list, err := s.ListJournal(ctx, JournalFilter{})
	if err != nil || len(list) != 2 || list[0].ID != 9 || list[1].ID != 5 || list[1].End.Outcome != OutcomeExit ||
		list[0].Limits.TimeoutMS != 5 || list[0].Argv[1] != "9" || list[1].Domain != "d" {
		t.Fatalf("journal after migration = %+v, %v", list, err)
	}
	id, err := s.JournalStart(ctx, JournalCommand{Account: 1, Project: 1, Lease: "L10", LeaseKind: "terminal", Argv: []string{"x"}})
	if err != nil || id != 10 {
		t.Fatalf("JournalStart after migration = %d, %v; want 10", id, err)
	}
	if n, err := s.JournalInterrupt(ctx, "L9", "gone"); err != nil || n != 1 {
		t.Fatalf("JournalInterrupt of a migrated running entry = %d, %v", n, err)
	}
	var auto int
	if err := s.r.QueryRowContext(ctx, "SELECT count(*) FROM sqlite_schema WHERE name = 'journal' AND sql LIKE '%AUTOINCREMENT%'").Scan(&auto); err != nil || auto != 0 {
		t.Fatalf("journal still AUTOINCREMENT: %d, %v", auto, err)
	}
}
