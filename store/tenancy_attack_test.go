package store

import (
	"context"
	"errors"
	"path/filepath"
	"testing"
	"time"
)

// TestTenancyTriggersAfterMigration: a database of schema 10 (before the
// tenancy version), with a project and its members, migrated to the
// latest schema, has every tenancy trigger, and a trust withdrawn by a
// plain SQL connection that knows nothing of the cache (another tool, an
// older process's statement) refuses a lease under the version read
// before it; so do a member's removal by cascade from its account and
// a project change, while another project's changes do not. A binary of an older schema cannot open the migrated
// file to write around the triggers.
func TestTenancyTriggersAfterMigration(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "corral.db")
	db := rawDB(t, path)
	for _, m := range loadMigrations(SchemeSQLite)[:10] {
		if _, err := db.Exec(m.sql); err != nil {
			t.Fatalf("%s: %v", m.name, err)
		}
	}
	for _, q := range []string{
		"INSERT INTO accounts (id, name, created_at) VALUES (1, 'alice', 0), (2, 'bob', 0)",
		"INSERT INTO projects (id, kind, name, root, created_at) VALUES (1, 'host', 'p', '/p', 0), (2, 'host', 'q', '/q', 0)",
		"INSERT INTO members (project, account, role, trusted, created_at) VALUES (1, 1, 'owner', 1, 0), (1, 2, 'member', 1, 0), (2, 1, 'owner', 1, 0)",
		"PRAGMA user_version = 10",
	} {
		if _, err := db.Exec(q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	s := openTest(t, path, Options{Migrate: true})
	for _, name := range []string{"tenancy_member_insert", "tenancy_member_update", "tenancy_member_delete",
		"tenancy_project_update", "command_end_insert", "command_start_insert"} {
		var n int
		if err := s.r.QueryRowContext(ctx, "SELECT count(*) FROM sqlite_schema WHERE type = 'trigger' AND name = ?", name).Scan(&n); err != nil || n != 1 {
			t.Errorf("trigger %s after migration: %d, %v", name, n, err)
		}
	}
	// FK actions fire the triggers only with foreign keys on, which every
	// connection of the store must have.
	var fk int
	if err := s.r.QueryRowContext(ctx, "PRAGMA foreign_keys").Scan(&fk); err != nil || fk != 1 {
		t.Errorf("foreign_keys on the read connection: %d, %v", fk, err)
	}

	lease := func(account, version int64) error {
		_, err := s.CreateLease(ctx, NewLease{Account: account, Project: 1, Kind: "terminal", TTL: time.Minute, TenancyVersion: version}, time.Now())
		return err
	}
	withJournal := func(account, version int64) error {
		_, err := s.CreateLease(ctx, NewLease{Account: account, Project: 1, Kind: "terminal", TTL: time.Minute, TenancyVersion: version,
			Journal: &JournalCommand{Account: account, Project: 1, LeaseKind: "terminal", Argv: []string{"true"}}}, time.Now())
		return err
	}
	read := func(account int64) Tenancy {
		t.Helper()
		ten, err := s.CachedTenancy(ctx, 1, account)
		if err != nil {
			t.Fatal(err)
		}
		return ten
	}
	refused := func(what string, account int64, ten Tenancy) {
		t.Helper()
		for _, create := range []func(int64, int64) error{lease, withJournal} {
			if err := create(account, ten.Version); !errors.Is(err, ErrTenancyChanged) {
				t.Fatalf("%s: lease under the version before it: %v, want ErrTenancyChanged", what, err)
			}
		}
	}

	ten := read(2)
	if !ten.Member.Trusted {
		t.Fatal("bob's migrated membership is not trusted")
	}
	// Trust withdrawn by a plain connection to the file.
	raw := rawDB(t, path)
	if _, err := raw.Exec("UPDATE members SET trusted = 0 WHERE project = 1 AND account = 2"); err != nil {
		t.Fatal(err)
	}
	refused("trust withdrawn by raw SQL", 2, ten)
	if got := read(2); got.Member.Trusted {
		t.Fatal("the cache still says trusted after the refusal")
	}

	// Bob's account deleted by a plain connection with foreign keys on:
	// his membership goes by cascade.
	ten = read(2)
	raw.SetMaxOpenConns(1) // the pragma holds for the one connection
	if _, err := raw.Exec("PRAGMA foreign_keys = ON"); err != nil {
		t.Fatal(err)
	}
	if _, err := raw.Exec("DELETE FROM accounts WHERE id = 2"); err != nil {
		t.Fatal(err)
	}
	refused("account deleted", 2, ten)
	if _, err := s.CachedTenancy(ctx, 1, 2); !errors.Is(err, ErrNotMember) {
		t.Fatalf("after the account's deletion: %v, want ErrNotMember", err)
	}

	// Another project's changes (its member's trust, its network) leave
	// project 1's version alone (schema 16).
	ten = read(1)
	for _, q := range []string{"UPDATE members SET trusted = 0 WHERE project = 2", "UPDATE projects SET network = 1 - network WHERE id = 2"} {
		if _, err := raw.Exec(q); err != nil {
			t.Fatal(err)
		}
	}
	if err := withJournal(1, ten.Version); err != nil {
		t.Fatalf("lease after another project's changes: %v", err)
	}

	// The project's egress policy set, changed and deleted by raw SQL
	// (schema 17): each refuses a lease under the version before it, and
	// the next read has the policy.
	for _, q := range []string{
		`INSERT INTO egress_policies (project, policy, updated_at) VALUES (1, '{"mode":"proxy"}', 0)`,
		`UPDATE egress_policies SET policy = '{"mode":"proxy","allow":["a.example"]}' WHERE project = 1`,
		`DELETE FROM egress_policies WHERE project = 1`,
	} {
		ten = read(1)
		if _, err := raw.Exec(q); err != nil {
			t.Fatal(err)
		}
		refused(q, 1, ten)
		var want string
		must(t, raw.QueryRow("SELECT coalesce((SELECT policy FROM egress_policies WHERE project = 1), '')").Scan(&want))
		if got := read(1).EgressPolicy; got != want {
			t.Fatalf("after %s: cached policy %q, want %q", q, got, want)
		}
	}

	// A project change (the network switched) by raw SQL.
	ten = read(1)
	if _, err := raw.Exec("UPDATE projects SET network = 1 - network WHERE id = 1"); err != nil {
		t.Fatal(err)
	}
	refused("project changed", 1, ten)
	if err := lease(1, read(1).Version); err != nil {
		t.Fatalf("lease under the new version: %v", err)
	}
}

// TestReleaseAndFinishOtherEntry: the one-statement end of a command
// (command_end) finishes only the journal entry of the lease it releases.
// Given the ID of another command's entry (of another account, still
// running), it must not write that entry's outcome: each tenant's journal
// shows only what its own commands did. (Fails with schema 13's trigger.)
func TestReleaseAndFinishOtherEntry(t *testing.T) {
	eachBackend(t, func(t *testing.T, d *testDB) {
		ctx := context.Background()
		s := d.open(t, Options{Migrate: true})
		p, err := s.CreateProject(ctx, NewProject{Kind: ProjectManaged, Name: "p", Root: "/p"})
		must(t, err)
		q, err := s.CreateProject(ctx, NewProject{Kind: ProjectManaged, Name: "q", Root: "/q"})
		must(t, err)
		now := time.Now()
		start := func(account int64, project int64) Lease {
			l, err := s.CreateLease(ctx, NewLease{Account: account, Project: project, Kind: "terminal", TTL: time.Minute,
				Journal: &JournalCommand{Account: account, Project: project, LeaseKind: "terminal", Argv: []string{"sleep", "1"}}}, now)
			must(t, err)
			return l
		}
		mine, theirs := start(1, p.ID), start(2, q.ID)
		code := 0
		journaled, err := s.ReleaseAndFinish(ctx, mine.ID, now, theirs.Journal, JournalEnd{Outcome: OutcomeExit, Code: &code, Message: "forged"})
		if err != nil {
			t.Fatal(err)
		}
		es, err := s.ListJournal(ctx, JournalFilter{Project: q.ID})
		must(t, err)
		if len(es) != 1 || es[0].ID != theirs.Journal {
			t.Fatalf("their journal: %+v", es)
		}
		if es[0].End.Outcome != "" || es[0].End.Message == "forged" {
			t.Fatalf("another lease's end finished their running entry: %+v (journaled %v)", es[0].End, journaled)
		}
		if l, err := s.GetLease(ctx, mine.ID); err != nil || l.State != LeaseReleased {
			t.Fatalf("my lease: %+v, %v; want released", l, err)
		}
	})
}

// TestJournalIDsNotReused: the journal keeps no AUTOINCREMENT (schema 12),
// so an ID would be reused if the newest entry were deleted, and a project
// or account ID reused would show its predecessor's entries to whoever
// gets it. Deleting the newest entries' account and project removes no
// entry; the next entry's ID is still greater; and a new account and
// project get IDs of their own (their tables keep AUTOINCREMENT), so
// their journal is empty.
func TestJournalIDsNotReused(t *testing.T) {
	eachBackend(t, func(t *testing.T, d *testDB) {
		ctx := context.Background()
		s := d.open(t, Options{Migrate: true})
		a, err := s.CreateAccount(ctx, "a")
		must(t, err)
		p, err := s.CreateProject(ctx, NewProject{Kind: ProjectManaged, Name: "p", Root: "/p"})
		must(t, err)
		_, err = s.AddMember(ctx, Member{Project: p.ID, Account: a.ID, Role: RoleOwner})
		must(t, err)
		var last int64
		for range 3 {
			l, err := s.CreateLease(ctx, NewLease{Account: a.ID, Project: p.ID, Kind: "terminal", TTL: time.Minute,
				Journal: &JournalCommand{Account: a.ID, Project: p.ID, LeaseKind: "terminal", Argv: []string{"secret-of-a"}}}, time.Now())
			must(t, err)
			must(t, s.ReleaseHeldLease(ctx, l.ID, time.Now()))
			last = l.Journal
		}
		must(t, s.DeleteProject(ctx, p.ID))
		must(t, s.DeleteAccount(ctx, a.ID))
		if es, err := s.ListJournal(ctx, JournalFilter{Account: a.ID}); err != nil || len(es) != 3 {
			t.Fatalf("the deleted account's entries: %d, %v; want all 3 kept", len(es), err)
		}
		b, err := s.CreateAccount(ctx, "b")
		must(t, err)
		q, err := s.CreateProject(ctx, NewProject{Kind: ProjectManaged, Name: "q", Root: "/q"})
		must(t, err)
		if b.ID == a.ID || q.ID == p.ID {
			t.Fatalf("IDs reused: account %d (was %d), project %d (was %d)", b.ID, a.ID, q.ID, p.ID)
		}
		for _, f := range []JournalFilter{{Account: b.ID}, {Project: q.ID}} {
			if es, err := s.ListJournal(ctx, f); err != nil || len(es) != 0 {
				t.Fatalf("a new account's or project's journal %+v: %+v, %v; want empty", f, es, err)
			}
		}
		l, err := s.CreateLease(ctx, NewLease{Account: b.ID, Project: q.ID, Kind: "terminal", TTL: time.Minute,
			Journal: &JournalCommand{Account: b.ID, Project: q.ID, LeaseKind: "terminal", Argv: []string{"true"}}}, time.Now())
		must(t, err)
		if l.Journal <= last {
			t.Fatalf("new entry ID %d, not after the newest %d", l.Journal, last)
		}
	})
}
