package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/corral-sandbox/corral/internal/pgtest"
	"github.com/jackc/pgx/v5"
	_ "modernc.org/sqlite"
)

// clock is a settable test clock.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func newClock() *clock { return &clock{t: time.UnixMilli(1_800_000_000_000)} }

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *clock) Advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }

// openTest opens the SQLite file at path (for the tests of SQLite alone).
func openTest(t *testing.T, path string, opts Options) *sqliteStore {
	t.Helper()
	s, err := openSQLite(context.Background(), path, opts)
	if err != nil {
		t.Fatalf("Open(%s, %+v): %v", path, opts, err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// testDB is one test's empty database on one backend: the conformance
// suite runs each test on both (eachBackend).
type testDB struct {
	backend string // SchemeSQLite or SchemePostgres
	url     string
}

// eachBackend runs f as subtests "sqlite" and "postgres", each with an
// empty database of its own. The PostgreSQL subtest is skipped, saying
// why, where no server can run (pgtest).
func eachBackend(t *testing.T, f func(t *testing.T, d *testDB)) {
	t.Run("sqlite", func(t *testing.T) {
		f(t, &testDB{backend: SchemeSQLite, url: DefaultURL(t.TempDir())})
	})
	t.Run("postgres", func(t *testing.T) {
		f(t, &testDB{backend: SchemePostgres, url: pgtest.NewDatabase(t)})
	})
}

// open opens a handle on d (one per process: the daemon's, a runner's),
// closed when t ends.
func (d *testDB) open(t testing.TB, opts Options) Store {
	t.Helper()
	s, err := Open(context.Background(), d.url, opts)
	if err != nil {
		t.Fatalf("Open(%s, %+v): %v", d.backend, opts, err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// newStore opens d migrated, with a test clock.
func (d *testDB) newStore(t testing.TB) (Store, *clock) {
	t.Helper()
	c := newClock()
	return d.open(t, Options{Migrate: true, Now: c.Now}), c
}

// queryInt runs q (? placeholders), a query of one integer, on d's
// database directly, bypassing the package, to inspect it.
func (d *testDB) queryInt(t testing.TB, q string, args ...any) int64 {
	t.Helper()
	var v int64
	d.direct(t, q, func(c *pgx.Conn) error { return c.QueryRow(context.Background(), rebind(q), args...).Scan(&v) },
		func(db *sql.DB) error { return db.QueryRow(q, args...).Scan(&v) })
	return v
}

// direct runs q on d's database opened directly, bypassing the package:
// with onPG or onSQLite, as d's backend is; an error fails t.
func (d *testDB) direct(t testing.TB, q string, onPG func(*pgx.Conn) error, onSQLite func(*sql.DB) error) {
	t.Helper()
	var err error
	if d.backend == SchemePostgres {
		c, cerr := pgx.Connect(context.Background(), d.url)
		if cerr != nil {
			t.Fatal(cerr)
		}
		defer c.Close(context.Background())
		err = onPG(c)
	} else {
		_, path, _ := SplitURL(d.url)
		db := rawDB(t, path)
		err = onSQLite(db)
		db.Close()
	}
	if err != nil {
		t.Fatalf("%s: %v", q, err)
	}
}

// refused returns how many leases s refused with ErrTenancyChanged.
func refused(s Store) int64 {
	switch s := s.(type) {
	case *sqliteStore:
		return s.tenancy.refused.Load()
	case *pgStore:
		return s.tenancy.refused.Load()
	}
	panic(fmt.Sprintf("store %T", s))
}

func newTestStore(t *testing.T) (*sqliteStore, *clock) {
	t.Helper()
	c := newClock()
	return openTest(t, filepath.Join(t.TempDir(), "corral.db"), Options{Migrate: true, Now: c.Now}), c
}

// rawDB opens the file directly, bypassing the package, to inspect or
// tamper with it.
func rawDB(t testing.TB, path string) *sql.DB {
	t.Helper()
	db, err := sql.Open("sqlite", path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

func TestMigrationsApplyAndAreIdempotent(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "corral.db")
	s := openTest(t, path, Options{Migrate: true})
	v, err := s.SchemaVersion(ctx)
	if err != nil || v != LatestVersion() || v < 1 {
		t.Fatalf("SchemaVersion = %d, %v; want %d", v, err, LatestVersion())
	}
	a, err := s.CreateAccount(ctx, "alice")
	if err != nil {
		t.Fatal(err)
	}
	var mode string
	if err := s.w.QueryRowContext(ctx, "PRAGMA journal_mode").Scan(&mode); err != nil || mode != "wal" {
		t.Errorf("journal_mode = %q, %v; want wal", mode, err)
	}
	var fk int
	if err := s.r.QueryRowContext(ctx, "PRAGMA foreign_keys").Scan(&fk); err != nil || fk != 1 {
		t.Errorf("foreign_keys on reader = %d, %v; want 1", fk, err)
	}
	s.Close()

	// Migrating again applies nothing and keeps the data.
	s2 := openTest(t, path, Options{Migrate: true})
	if got, err := s2.GetAccount(ctx, a.ID); err != nil || got.Name != "alice" {
		t.Fatalf("after re-migrate GetAccount = %+v, %v", got, err)
	}
	if v, _ := s2.SchemaVersion(ctx); v != LatestVersion() {
		t.Fatalf("version after re-migrate = %d", v)
	}
	s2.Close()

	// A process that must not migrate opens an up-to-date database.
	s3 := openTest(t, path, Options{})
	if _, err := s3.GetAccount(ctx, a.ID); err != nil {
		t.Fatal(err)
	}
}

func TestConcurrentMigratorsApplyOnce(t *testing.T) {
	eachBackend(t, func(t *testing.T, d *testDB) {
		var wg sync.WaitGroup
		errs := make(chan error, 4)
		for range 4 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				s, err := Open(context.Background(), d.url, Options{Migrate: true})
				if err != nil {
					errs <- err
					return
				}
				errs <- s.Close()
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			if err != nil {
				t.Fatal(err)
			}
		}
		s := d.open(t, Options{})
		if v, _ := s.SchemaVersion(context.Background()); v != LatestVersion() {
			t.Fatalf("version = %d", v)
		}
	})
}

func TestNoMigrateRefusesUnknownSchema(t *testing.T) {
	eachBackend(t, func(t *testing.T, d *testDB) {
		ctx := context.Background()
		refused := func(t *testing.T, migrate bool, have int, says string) {
			t.Helper()
			_, err := Open(ctx, d.url, Options{Migrate: migrate})
			var se *SchemaError
			if !errors.Is(err, ErrSchemaMismatch) || !errors.As(err, &se) || se.Have != have || se.Want != LatestVersion() || !strings.Contains(err.Error(), says) {
				t.Fatalf("Open(Migrate: %v) = %v; want *SchemaError{Have: %d} saying %q", migrate, err, have, says)
			}
		}

		// A database never migrated: nothing there, or nothing of corral's.
		refused(t, false, 0, "migrated")
		if d.backend == SchemeSQLite {
			_, path, _ := SplitURL(d.url)
			if _, err := os.Stat(path); !errors.Is(err, os.ErrNotExist) {
				t.Fatalf("Open without Migrate created the file: %v", err)
			}
		} else if n := d.queryInt(t, "SELECT count(*) FROM pg_tables WHERE schemaname = current_schema()"); n != 0 {
			t.Fatalf("Open without Migrate created %d table(s)", n)
		}
		d.exec(t, "CREATE TABLE unrelated (x integer)")
		refused(t, false, 0, "migrated")

		// Older, then newer than this binary.
		d.open(t, Options{Migrate: true}).Close()
		d.setVersion(t, LatestVersion()-1)
		refused(t, false, LatestVersion()-1, "migrated")
		d.setVersion(t, LatestVersion()+1)
		for _, migrate := range []bool{false, true} {
			refused(t, migrate, LatestVersion()+1, "newer")
		}
	})
}

// exec runs q on d's database directly, bypassing the package.
func (d *testDB) exec(t testing.TB, q string) {
	t.Helper()
	d.direct(t, q, func(c *pgx.Conn) error { _, err := c.Exec(context.Background(), q); return err },
		func(db *sql.DB) error { _, err := db.Exec(q); return err })
}

// setVersion sets d's schema version as a binary of version v would have.
func (d *testDB) setVersion(t testing.TB, v int) {
	t.Helper()
	if d.backend == SchemePostgres {
		d.exec(t, "UPDATE corral_schema SET version = "+strconv.Itoa(v))
		return
	}
	d.exec(t, "PRAGMA user_version = "+strconv.Itoa(v))
}

func TestAccountsAndTokens(t *testing.T) {
	eachBackend(t, func(t *testing.T, d *testDB) {
		ctx := context.Background()
		s, c := d.newStore(t)
		alice, err := s.CreateAccount(ctx, "alice")
		if err != nil {
			t.Fatal(err)
		}
		if _, err := s.CreateAccount(ctx, "alice"); !errors.Is(err, ErrExists) {
			t.Fatalf("duplicate account: %v; want ErrExists", err)
		}
		if got, err := s.AccountByName(ctx, "alice"); err != nil || got != alice {
			t.Fatalf("AccountByName = %+v, %v; want %+v", got, err, alice)
		}
		if _, err := s.GetAccount(ctx, 999); !errors.Is(err, ErrNotFound) {
			t.Fatalf("GetAccount(999) = %v; want ErrNotFound", err)
		}

		plain, tok, err := s.CreateToken(ctx, alice.ID, "laptop")
		if err != nil {
			t.Fatal(err)
		}
		if !strings.HasPrefix(plain, TokenPrefix) || len(plain) < len(TokenPrefix)+40 {
			t.Fatalf("token %q: want prefix %q and 256 bits", plain, TokenPrefix)
		}
		if _, _, err := s.CreateToken(ctx, 999, "x"); !errors.Is(err, ErrNotFound) {
			t.Fatalf("CreateToken(unknown account) = %v; want ErrNotFound", err)
		}

		// The plaintext appears nowhere in the table; its hash does.
		secret := strings.TrimPrefix(plain, TokenPrefix)
		if n := d.queryInt(t, `SELECT count(*) FROM tokens WHERE hash LIKE '%' || ? || '%' OR name LIKE '%' || ? || '%'`, secret, secret); n != 0 {
			t.Errorf("%d token row(s) hold the token's plaintext", n)
		}
		if n := d.queryInt(t, "SELECT count(*) FROM tokens WHERE hash = ?", HashToken(plain)); n != 1 {
			t.Error("the token's SHA-256 is not stored")
		}
		// Nor is it anywhere in SQLite's file (WAL included).
		for _, f := range []string{s.Path(), s.Path() + "-wal"} {
			if s.Path() == "" {
				break
			}
			b, err := os.ReadFile(f)
			if err != nil && !errors.Is(err, os.ErrNotExist) {
				t.Fatal(err)
			}
			if strings.Contains(string(b), secret) {
				t.Errorf("%s contains the token's plaintext", f)
			}
		}

		got, err := s.Authenticate(ctx, plain)
		if err != nil || got.ID != alice.ID {
			t.Fatalf("Authenticate = %+v, %v; want alice", got, err)
		}
		toks, err := s.ListTokens(ctx, alice.ID)
		if err != nil || len(toks) != 1 || toks[0].ID != tok.ID || !toks[0].LastUsed.Equal(c.Now()) {
			t.Fatalf("ListTokens = %+v, %v; want one token used now", toks, err)
		}
		for _, bad := range []string{"", "corral_nope", plain + "x", strings.TrimPrefix(plain, TokenPrefix), HashToken(plain)} {
			if _, err := s.Authenticate(ctx, bad); !errors.Is(err, ErrNotFound) {
				t.Errorf("Authenticate(%q) = %v; want ErrNotFound", bad, err)
			}
		}

		c.Advance(time.Hour)
		if err := s.RevokeToken(ctx, tok.ID); err != nil {
			t.Fatal(err)
		}
		if err := s.RevokeToken(ctx, tok.ID); err != nil {
			t.Fatalf("second revoke: %v", err)
		}
		if err := s.RevokeToken(ctx, 999); !errors.Is(err, ErrNotFound) {
			t.Fatalf("RevokeToken(999) = %v", err)
		}
		if _, err := s.Authenticate(ctx, plain); !errors.Is(err, ErrNotFound) {
			t.Fatalf("Authenticate(revoked) = %v; want ErrNotFound", err)
		}
		toks, _ = s.ListTokens(ctx, alice.ID)
		if !toks[0].Revoked.Equal(c.Now()) {
			t.Fatalf("Revoked = %v; want %v", toks[0].Revoked, c.Now())
		}
	})
}

func TestProjectsAndMembers(t *testing.T) {
	eachBackend(t, func(t *testing.T, d *testDB) {
		ctx := context.Background()
		s, _ := d.newStore(t)
		alice, _ := s.CreateAccount(ctx, "alice")
		bob, _ := s.CreateAccount(ctx, "bob")

		p, err := s.CreateProject(ctx, NewProject{Kind: ProjectHost, Name: "web", Root: "/srv/web"})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := s.CreateProject(ctx, NewProject{Kind: ProjectManaged, Name: "web", Root: "/x"}); !errors.Is(err, ErrExists) {
			t.Fatalf("duplicate project = %v; want ErrExists", err)
		}
		if _, err := s.CreateProject(ctx, NewProject{Kind: "vm", Name: "v", Root: "/x"}); err == nil {
			t.Fatal("invalid kind accepted")
		}
		m, err := s.CreateProject(ctx, NewProject{Kind: ProjectManaged, Name: "api", Root: "/var/lib/corral/api"})
		if err != nil {
			t.Fatal(err)
		}
		if got, err := s.GetProject(ctx, p.ID); err != nil || got != p {
			t.Fatalf("GetProject = %+v, %v; want %+v", got, err, p)
		}
		if got, err := s.ProjectByName(ctx, "api"); err != nil || got != m {
			t.Fatalf("ProjectByName = %+v, %v", got, err)
		}
		if list, err := s.ListProjects(ctx); err != nil || len(list) != 2 || list[0] != p || list[1] != m {
			t.Fatalf("ListProjects = %+v, %v", list, err)
		}

		if _, err := s.AddMember(ctx, Member{Project: p.ID, Account: alice.ID, Role: RoleOwner, Trusted: true}); err != nil {
			t.Fatal(err)
		}
		if _, err := s.AddMember(ctx, Member{Project: p.ID, Account: bob.ID}); err != nil {
			t.Fatal(err)
		}
		if _, err := s.AddMember(ctx, Member{Project: p.ID, Account: bob.ID}); !errors.Is(err, ErrExists) {
			t.Fatalf("duplicate member = %v; want ErrExists", err)
		}
		if _, err := s.AddMember(ctx, Member{Project: 999, Account: bob.ID}); !errors.Is(err, ErrNotFound) {
			t.Fatalf("member of unknown project = %v; want ErrNotFound", err)
		}
		if mm, err := s.GetMember(ctx, p.ID, alice.ID); err != nil || mm.Role != RoleOwner || !mm.Trusted {
			t.Fatalf("GetMember(alice) = %+v, %v; want trusted owner", mm, err)
		}
		if mm, err := s.GetMember(ctx, p.ID, bob.ID); err != nil || mm.Role != RoleMember || mm.Trusted {
			t.Fatalf("GetMember(bob) = %+v, %v; want untrusted member", mm, err)
		}
		if _, err := s.GetMember(ctx, m.ID, bob.ID); !errors.Is(err, ErrNotFound) {
			t.Fatalf("GetMember(non-member) = %v; want ErrNotFound", err)
		}
		// GetProjectMember agrees with GetProject and GetMember.
		for _, c := range []struct {
			project, account int64
			member           bool
		}{{p.ID, alice.ID, true}, {p.ID, bob.ID, true}, {m.ID, bob.ID, false}} {
			wantP, _ := s.GetProject(ctx, c.project)
			wantM, _ := s.GetMember(ctx, c.project, c.account)
			gotP, gotM, err := s.GetProjectMember(ctx, c.project, c.account)
			if gotP != wantP || gotM != wantM || (err == nil) != c.member ||
				(!c.member && (!errors.Is(err, ErrNotMember) || !errors.Is(err, ErrNotFound))) {
				t.Fatalf("GetProjectMember(%d, %d) = %+v, %+v, %v; want %+v, %+v (member %v)",
					c.project, c.account, gotP, gotM, err, wantP, wantM, c.member)
			}
		}
		if gotP, gotM, err := s.GetProjectMember(ctx, 999, alice.ID); !errors.Is(err, ErrNotFound) || errors.Is(err, ErrNotMember) || gotP != (Project{}) || gotM != (Member{}) {
			t.Fatalf("GetProjectMember(unknown project) = %+v, %+v, %v; want ErrNotFound only", gotP, gotM, err)
		}
		if err := s.UpdateMember(ctx, Member{Project: p.ID, Account: bob.ID, Role: RoleMember, Trusted: true}); err != nil {
			t.Fatal(err)
		}
		if mm, _ := s.GetMember(ctx, p.ID, bob.ID); !mm.Trusted {
			t.Fatal("UpdateMember did not mark bob trusted")
		}
		if list, err := s.ListMembers(ctx, p.ID); err != nil || len(list) != 2 {
			t.Fatalf("ListMembers = %+v, %v", list, err)
		}
		if err := s.RemoveMember(ctx, p.ID, bob.ID); err != nil {
			t.Fatal(err)
		}
		if err := s.RemoveMember(ctx, p.ID, bob.ID); !errors.Is(err, ErrNotFound) {
			t.Fatalf("second RemoveMember = %v; want ErrNotFound", err)
		}

		if err := s.DeleteProject(ctx, p.ID); err != nil {
			t.Fatal(err)
		}
		if _, err := s.GetProject(ctx, p.ID); !errors.Is(err, ErrNotFound) {
			t.Fatalf("deleted project: %v", err)
		}
		if _, err := s.GetMember(ctx, p.ID, alice.ID); !errors.Is(err, ErrNotFound) {
			t.Fatalf("membership survived its project: %v", err)
		}
		if err := s.DeleteProject(ctx, p.ID); !errors.Is(err, ErrNotFound) {
			t.Fatalf("second DeleteProject = %v; want ErrNotFound", err)
		}
		// IDs are never reused (the journal refers to them).
		q, _ := s.CreateProject(ctx, NewProject{Kind: ProjectHost, Name: "web", Root: "/srv/web"})
		if q.ID <= m.ID {
			t.Fatalf("project ID %d reused", q.ID)
		}
	})
}

func TestLeaseLifecycle(t *testing.T) {
	eachBackend(t, func(t *testing.T, d *testDB) {
		ctx := context.Background()
		s, c := d.newStore(t)
		p, _ := s.CreateProject(ctx, NewProject{Kind: ProjectHost, Name: "p", Root: "/p"})
		const ttl = 15 * time.Second

		if _, err := s.CreateLease(ctx, NewLease{Project: 999, Kind: "terminal", TTL: ttl}, c.Now()); !errors.Is(err, ErrNotFound) {
			t.Fatalf("lease on unknown project = %v; want ErrNotFound", err)
		}
		l, err := s.CreateLease(ctx, NewLease{Account: 7, Project: p.ID, Kind: "terminal", Domain: "sandbox", Holder: "test", TTL: ttl}, c.Now())
		if err != nil {
			t.Fatal(err)
		}
		if l.ID == "" || l.State != LeaseLive || !l.ExpiresAt.Equal(c.Now().Add(ttl)) {
			t.Fatalf("CreateLease = %+v", l)
		}
		if _, err := s.CreateLease(ctx, NewLease{ID: l.ID, Project: p.ID, Kind: "terminal", TTL: ttl}, c.Now()); !errors.Is(err, ErrExists) {
			t.Fatalf("duplicate lease ID = %v; want ErrExists", err)
		}
		if got, err := s.GetLease(ctx, l.ID); err != nil || got != l {
			t.Fatalf("GetLease = %+v, %v; want %+v", got, err, l)
		}

		c.Advance(10 * time.Second)
		if err := s.HeartbeatLease(ctx, l.ID, c.Now()); err != nil {
			t.Fatal(err)
		}
		c.Advance(10 * time.Second) // 20 s after creation, 10 s after the beat
		if exp, err := s.ExpireLeases(ctx, c.Now()); err != nil || len(exp) != 0 {
			t.Fatalf("ExpireLeases after a heartbeat = %+v, %v; want none", exp, err)
		}
		if n, _ := s.LiveLeaseCount(ctx); n != 1 {
			t.Fatalf("LiveLeaseCount = %d", n)
		}
		if got, err := s.GetLease(ctx, l.ID); err != nil || !got.HeartbeatAt.Equal(c.Now().Add(-10*time.Second)) || !got.ExpiresAt.Equal(got.HeartbeatAt.Add(ttl)) || got.TTL != ttl {
			t.Fatalf("after heartbeat GetLease = %+v, %v", got, err)
		}
		if list, err := s.ListLeases(ctx, LeaseFilter{Project: p.ID, State: LeaseLive, Account: 7, Holder: "test"}); err != nil || len(list) != 1 || list[0].ID != l.ID {
			t.Fatalf("ListLeases(live) = %+v, %v", list, err)
		}

		// Overdue: heartbeat and release both report expiry; the lease is
		// expired by exactly one ExpireLeases.
		c.Advance(ttl)
		if err := s.HeartbeatLease(ctx, l.ID, c.Now()); !errors.Is(err, ErrLeaseExpired) {
			t.Fatalf("heartbeat overdue = %v; want ErrLeaseExpired", err)
		}
		if _, err := s.ReleaseLease(ctx, l.ID, c.Now()); !errors.Is(err, ErrLeaseExpired) {
			t.Fatalf("release overdue = %v; want ErrLeaseExpired", err)
		}
		exp, err := s.ExpireLeases(ctx, c.Now())
		if err != nil || len(exp) != 1 || exp[0].ID != l.ID || exp[0].State != LeaseExpired || !exp[0].ExpiredAt.Equal(c.Now()) {
			t.Fatalf("ExpireLeases = %+v, %v; want the lease", exp, err)
		}
		if exp, _ := s.ExpireLeases(ctx, c.Now()); len(exp) != 0 {
			t.Fatalf("second ExpireLeases = %+v", exp)
		}
		// The ended row keeps the lease's last heartbeat and expiry.
		if got, _ := s.GetLease(ctx, l.ID); got != exp[0] || !got.ExpiresAt.Equal(c.Now().Add(-10*time.Second)) {
			t.Fatalf("expired GetLease = %+v; want %+v", got, exp[0])
		}
		if list, _ := s.ListLeases(ctx, LeaseFilter{State: LeaseLive}); len(list) != 0 {
			t.Fatalf("ListLeases(live) after expiry = %+v", list)
		}
		if _, err := s.ReleaseLease(ctx, l.ID, c.Now()); !errors.Is(err, ErrLeaseExpired) {
			t.Fatalf("release expired = %v; want ErrLeaseExpired", err)
		}

		// Release is idempotent; heartbeat after release is refused.
		r, _ := s.CreateLease(ctx, NewLease{Project: p.ID, Kind: "files", TTL: ttl}, c.Now())
		for i := range 2 {
			got, err := s.ReleaseLease(ctx, r.ID, c.Now())
			if err != nil || got.State != LeaseReleased || !got.ReleasedAt.Equal(c.Now()) {
				t.Fatalf("release #%d = %+v, %v", i, got, err)
			}
		}
		if err := s.HeartbeatLease(ctx, r.ID, c.Now()); !errors.Is(err, ErrLeaseReleased) {
			t.Fatalf("heartbeat released = %v; want ErrLeaseReleased", err)
		}
		if err := s.HeartbeatLease(ctx, "nope", c.Now()); !errors.Is(err, ErrNotFound) {
			t.Fatalf("heartbeat unknown = %v; want ErrNotFound", err)
		}
		if _, err := s.ReleaseLease(ctx, "nope", c.Now()); !errors.Is(err, ErrNotFound) {
			t.Fatalf("release unknown = %v; want ErrNotFound", err)
		}
	})
}

func TestHeartbeatLeasesBatch(t *testing.T) {
	eachBackend(t, func(t *testing.T, d *testDB) {
		ctx := context.Background()
		s, c := d.newStore(t)
		p, _ := s.CreateProject(ctx, NewProject{Kind: ProjectHost, Name: "p", Root: "/p"})
		const ttl = 15 * time.Second
		var ids []string
		for range 5 {
			l, err := s.CreateLease(ctx, NewLease{Project: p.ID, Kind: "lsp", TTL: ttl}, c.Now())
			if err != nil {
				t.Fatal(err)
			}
			ids = append(ids, l.ID)
		}
		if _, err := s.ReleaseLease(ctx, ids[1], c.Now()); err != nil {
			t.Fatal(err)
		}
		c.Advance(5 * time.Second)
		errs, err := s.HeartbeatLeases(ctx, append(ids, "missing"), c.Now())
		if err != nil {
			t.Fatal(err)
		}
		for i, want := range []error{nil, ErrLeaseReleased, nil, nil, nil, ErrNotFound} {
			if (want == nil) != (errs[i] == nil) || (want != nil && !errors.Is(errs[i], want)) {
				t.Errorf("errs[%d] = %v; want %v", i, errs[i], want)
			}
		}
		got, _ := s.LeasesByID(ctx, ids)
		if l := got[ids[0]]; !l.ExpiresAt.Equal(c.Now().Add(ttl)) || !l.HeartbeatAt.Equal(c.Now()) {
			t.Fatalf("heartbeat did not extend: %+v", l)
		}
	})
}

func TestDeleteProjectBlockedByLiveLease(t *testing.T) {
	eachBackend(t, func(t *testing.T, d *testDB) {
		ctx := context.Background()
		s, c := d.newStore(t)
		p, _ := s.CreateProject(ctx, NewProject{Kind: ProjectManaged, Name: "p", Root: "/p"})
		l, _ := s.CreateLease(ctx, NewLease{Project: p.ID, Kind: "terminal", TTL: time.Second}, c.Now())
		if err := s.DeleteProject(ctx, p.ID); !errors.Is(err, ErrProjectBusy) {
			t.Fatalf("DeleteProject with a live lease = %v; want ErrProjectBusy", err)
		}
		// Even overdue, a live lease blocks until it is marked expired.
		c.Advance(time.Minute)
		if err := s.DeleteProject(ctx, p.ID); !errors.Is(err, ErrProjectBusy) {
			t.Fatalf("DeleteProject with an overdue lease = %v; want ErrProjectBusy", err)
		}
		if _, err := s.ExpireLeases(ctx, c.Now()); err != nil {
			t.Fatal(err)
		}
		if err := s.DeleteProject(ctx, p.ID); err != nil {
			t.Fatalf("DeleteProject after expiry: %v", err)
		}
		if _, err := s.GetLease(ctx, l.ID); !errors.Is(err, ErrNotFound) {
			t.Fatalf("lease history survived its project: %v", err)
		}
	})
}

func TestJournalRoundTrip(t *testing.T) {
	eachBackend(t, func(t *testing.T, d *testDB) {
		ctx := context.Background()
		s, c := d.newStore(t)
		in := JournalCommand{
			Account: 3, Project: 4, Domain: "editor", Lease: "L1", LeaseKind: "editor",
			Argv: []string{"git", "-c", "http.extraHeader=[REDACTED]", "log"}, Limits: Limits{TimeoutMS: 10000, Stdout: 1 << 20, Stderr: 1 << 20},
		}
		id, err := s.JournalStart(ctx, in)
		if err != nil {
			t.Fatal(err)
		}
		started := c.Now()
		list, err := s.ListJournal(ctx, JournalFilter{Lease: "L1"})
		if err != nil || len(list) != 1 || list[0].End.Outcome != "" || !list[0].Ended.IsZero() {
			t.Fatalf("running entry = %+v, %v", list, err)
		}
		c.Advance(1500 * time.Millisecond)
		code := 2
		end := JournalEnd{Outcome: OutcomeExit, Code: &code, StdoutBytes: 10, StderrBytes: 3, Message: "exit status 2"}
		if err := s.JournalFinish(ctx, id, end); err != nil {
			t.Fatal(err)
		}
		if err := s.JournalFinish(ctx, id, end); !errors.Is(err, ErrNotFound) {
			t.Fatalf("second finish = %v; want ErrNotFound", err)
		}
		if err := s.JournalFinish(ctx, id, JournalEnd{Outcome: OutcomeExit}); err == nil {
			t.Fatal("exit outcome without a code accepted")
		}
		list, err = s.ListJournal(ctx, JournalFilter{Project: 4})
		if err != nil || len(list) != 1 {
			t.Fatalf("ListJournal = %+v, %v", list, err)
		}
		e := list[0]
		if e.ID != id || e.Account != 3 || e.Domain != "editor" || e.LeaseKind != "editor" ||
			strings.Join(e.Argv, " ") != strings.Join(in.Argv, " ") || e.Limits != in.Limits ||
			!e.Started.Equal(started) || !e.Ended.Equal(c.Now()) ||
			e.End.Outcome != OutcomeExit || e.End.Code == nil || *e.End.Code != 2 || e.End.StdoutBytes != 10 ||
			e.End.StderrBytes != 3 || e.End.Message != "exit status 2" {
			t.Fatalf("entry = %+v", e)
		}

		// A signal, an error, and an interrupted one.
		id2, _ := s.JournalStart(ctx, JournalCommand{Project: 4, Lease: "L2", LeaseKind: "runner", Argv: []string{"sleep", "9"}})
		id3, _ := s.JournalStart(ctx, JournalCommand{Project: 4, Lease: "L2", LeaseKind: "runner", Argv: []string{"yes"}})
		id4, _ := s.JournalStart(ctx, JournalCommand{Project: 5, Lease: "L3", LeaseKind: "runner"})
		if err := s.JournalFinish(ctx, id3, JournalEnd{Outcome: OutcomeExit, Code: &code, OOMKilled: true}); err == nil {
			t.Fatal("an OOM kill with an exit code accepted")
		}
		if err := s.JournalFinish(ctx, id2, JournalEnd{Outcome: OutcomeSignal, Signal: "SIGKILL", OOMKilled: true}); err != nil {
			t.Fatal(err)
		}
		if err := s.JournalFinish(ctx, id3, JournalEnd{Outcome: OutcomeError, ErrorKind: "overflow", StdoutBytes: 1 << 20}); err != nil {
			t.Fatal(err)
		}
		if n, err := s.JournalInterrupt(ctx, "L3", "lease expired"); err != nil || n != 1 {
			t.Fatalf("JournalInterrupt = %d, %v", n, err)
		}
		if n, _ := s.JournalInterrupt(ctx, "L2", "lease expired"); n != 0 {
			t.Fatalf("JournalInterrupt touched %d finished entries", n)
		}
		all, _ := s.ListJournal(ctx, JournalFilter{})
		if len(all) != 4 || all[0].ID != id4 || all[0].End.Outcome != OutcomeInterrupted || all[0].Argv == nil ||
			all[1].End.ErrorKind != "overflow" || all[1].End.Code != nil ||
			all[2].End.Signal != "SIGKILL" || all[2].End.Code != nil || !all[2].End.OOMKilled || all[1].End.OOMKilled {
			t.Fatalf("journal = %+v", all)
		}
		if lim, _ := s.ListJournal(ctx, JournalFilter{Limit: 2}); len(lim) != 2 || lim[0].ID != id4 {
			t.Fatalf("Limit 2 = %+v", lim)
		}
	})
}

func TestArtifacts(t *testing.T) {
	eachBackend(t, func(t *testing.T, d *testDB) {
		ctx := context.Background()
		s, c := d.newStore(t)
		p, _ := s.CreateProject(ctx, NewProject{Kind: ProjectManaged, Name: "p", Root: "/p"})
		a, err := s.RecordArtifact(ctx, p.ID, "/tmp/corral-export-1.bundle", "L1")
		if err != nil {
			t.Fatal(err)
		}
		b, _ := s.RecordArtifact(ctx, p.ID, "/tmp/corral-export-2.bundle", "L2")
		if _, err := s.RecordArtifact(ctx, 999, "/x", "L"); !errors.Is(err, ErrNotFound) {
			t.Fatalf("artifact of unknown project = %v", err)
		}
		c.Advance(time.Second)
		if err := s.MarkArtifactDeleted(ctx, a.ID); err != nil {
			t.Fatal(err)
		}
		if err := s.MarkArtifactDeleted(ctx, a.ID); err != nil {
			t.Fatalf("second mark: %v", err)
		}
		if err := s.MarkArtifactDeleted(ctx, 999); !errors.Is(err, ErrNotFound) {
			t.Fatalf("mark unknown = %v", err)
		}
		live, _ := s.ListArtifacts(ctx, p.ID, false)
		if len(live) != 1 || live[0] != b {
			t.Fatalf("live artifacts = %+v; want %+v", live, b)
		}
		all, _ := s.ListArtifacts(ctx, p.ID, true)
		if len(all) != 2 || all[0].Path != a.Path || !all[0].Deleted.Equal(c.Now()) {
			t.Fatalf("all artifacts = %+v", all)
		}
	})
}

// Two handles on one file, as the daemon and a runner hold, see each other's
// writes, and writers in both do not fail each other with SQLITE_BUSY.
func TestTwoHandlesShareLeases(t *testing.T) {
	eachBackend(t, func(t *testing.T, d *testDB) {
		ctx := context.Background()
		c := newClock()
		daemon := d.open(t, Options{Migrate: true, Now: c.Now})
		runner := d.open(t, Options{Now: c.Now})
		p, _ := daemon.CreateProject(ctx, NewProject{Kind: ProjectManaged, Name: "p", Root: "/p"})

		l, err := runner.CreateLease(ctx, NewLease{Project: p.ID, Kind: "runner", Holder: "runner", TTL: 15 * time.Second}, c.Now())
		if err != nil {
			t.Fatal(err)
		}
		if got, err := daemon.GetLease(ctx, l.ID); err != nil || got.State != LeaseLive {
			t.Fatalf("daemon sees runner's lease: %+v, %v", got, err)
		}
		if err := daemon.DeleteProject(ctx, p.ID); !errors.Is(err, ErrProjectBusy) {
			t.Fatalf("daemon deleting a project with the runner's lease = %v; want ErrProjectBusy", err)
		}

		// Concurrent writers on both handles.
		var wg sync.WaitGroup
		errs := make(chan error, 400)
		for _, st := range []Store{daemon, runner} {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for range 200 {
					l, err := st.CreateLease(ctx, NewLease{Project: p.ID, Kind: "files", TTL: time.Minute}, c.Now())
					if err == nil {
						_, err = st.ReleaseLease(ctx, l.ID, c.Now())
					}
					if err != nil {
						errs <- err
					}
				}
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatal(err)
		}

		if _, err := runner.ReleaseLease(ctx, l.ID, c.Now()); err != nil {
			t.Fatal(err)
		}
		if n, _ := daemon.LiveLeaseCount(ctx); n != 0 {
			t.Fatalf("daemon LiveLeaseCount = %d", n)
		}
		if err := daemon.DeleteProject(ctx, p.ID); err != nil {
			t.Fatalf("DeleteProject after the runner released: %v", err)
		}
	})
}

func TestProjectMachineSpec(t *testing.T) {
	eachBackend(t, func(t *testing.T, d *testDB) {
		s, _ := d.newStore(t)
		ctx := context.Background()
		a, err := s.CreateProject(ctx, NewProject{Kind: ProjectManaged, Name: "a", Root: "/w/a"})
		if err != nil {
			t.Fatal(err)
		}
		if a.Image != DefaultImage || a.Limits != (MachineLimits{}) {
			t.Errorf("new project: image %q limits %+v, want %q and none", a.Image, a.Limits, DefaultImage)
		}
		b, err := s.CreateProject(ctx, NewProject{Kind: ProjectManaged, Name: "b", Root: "/w/b", Image: "debian",
			Limits: MachineLimits{Memory: 1 << 30, CPUMillis: 500}})
		if err != nil {
			t.Fatal(err)
		}
		want := MachineLimits{Memory: 256 << 20, Pids: 64, CPUMillis: 1500, Disk: 1 << 30, Tmp: 64 << 20}
		if err := s.SetProjectMachine(ctx, a.ID, "debian", want); err != nil {
			t.Fatal(err)
		}
		got, err := s.GetProject(ctx, a.ID)
		if err != nil {
			t.Fatal(err)
		}
		if got.Image != "debian" || got.Limits != want {
			t.Errorf("after set: image %q limits %+v, want debian %+v", got.Image, got.Limits, want)
		}
		using, err := s.ProjectsUsingImage(ctx, "debian")
		if err != nil {
			t.Fatal(err)
		}
		if len(using) != 2 || using[0].ID != a.ID || using[1].ID != b.ID || using[1].Limits.CPUMillis != 500 {
			t.Errorf("projects using debian: %+v", using)
		}
		if using, _ := s.ProjectsUsingImage(ctx, DefaultImage); len(using) != 0 {
			t.Errorf("projects using base: %+v", using)
		}
		if err := s.SetProjectMachine(ctx, 999, "", MachineLimits{}); !errors.Is(err, ErrNotFound) {
			t.Errorf("unknown project: %v, want ErrNotFound", err)
		}
		// The tenancy read carries the spec too.
		acc, err := s.CreateAccount(ctx, "alice")
		if err != nil {
			t.Fatal(err)
		}
		if _, err := s.AddMember(ctx, Member{Project: a.ID, Account: acc.ID, Role: RoleOwner}); err != nil {
			t.Fatal(err)
		}
		p, _, err := s.GetProjectMember(ctx, a.ID, acc.ID)
		if err != nil {
			t.Fatal(err)
		}
		if p.Image != "debian" || p.Limits != want {
			t.Errorf("tenancy read: %+v", p)
		}
	})
}

func TestProjectNetwork(t *testing.T) {
	eachBackend(t, func(t *testing.T, d *testDB) {
		s, _ := d.newStore(t)
		ctx := context.Background()
		off, err := s.CreateProject(ctx, NewProject{Kind: ProjectHost, Name: "off", Root: "/h/off"})
		if err != nil {
			t.Fatal(err)
		}
		on, err := s.CreateProject(ctx, NewProject{Kind: ProjectHost, Name: "on", Root: "/h/on", Network: true})
		if err != nil {
			t.Fatal(err)
		}
		if got, _ := s.GetProject(ctx, off.ID); got.Network {
			t.Errorf("a new project allows the network by default")
		}
		if got, _ := s.GetProject(ctx, on.ID); !got.Network {
			t.Errorf("created with network, read without")
		}
		if err := s.SetProjectNetwork(ctx, off.ID, true); err != nil {
			t.Fatal(err)
		}
		acc, err := s.CreateAccount(ctx, "alice")
		if err != nil {
			t.Fatal(err)
		}
		if _, err := s.AddMember(ctx, Member{Project: off.ID, Account: acc.ID}); err != nil {
			t.Fatal(err)
		}
		if p, _, err := s.GetProjectMember(ctx, off.ID, acc.ID); err != nil || !p.Network {
			t.Errorf("tenancy read after SetProjectNetwork: %+v, %v", p, err)
		}
		if err := s.SetProjectNetwork(ctx, 999, true); !errors.Is(err, ErrNotFound) {
			t.Errorf("unknown project: %v, want ErrNotFound", err)
		}
	})
}

// An entry whose lease was released (its process died before journaling the
// end) is closed once the grace has passed; running entries of live leases,
// recently released ones and finished ones are left alone.
func TestJournalInterruptReleased(t *testing.T) {
	eachBackend(t, func(t *testing.T, d *testDB) {
		s, clk := d.newStore(t)
		ctx := context.Background()
		p, err := s.CreateProject(ctx, NewProject{Kind: ProjectManaged, Name: "p", Root: "/w/p"})
		if err != nil {
			t.Fatal(err)
		}
		entry := func(name string) (Lease, int64) {
			l, err := s.CreateLease(ctx, NewLease{Project: p.ID, Account: 1, Kind: "terminal", TTL: 15 * time.Second}, clk.Now())
			if err != nil {
				t.Fatal(err)
			}
			id, err := s.JournalStart(ctx, JournalCommand{Account: 1, Project: p.ID, Lease: l.ID, LeaseKind: "terminal", Argv: []string{name}})
			if err != nil {
				t.Fatal(err)
			}
			return l, id
		}
		orphan, orphanID := entry("orphan")
		_, liveID := entry("live")
		done, doneID := entry("done")
		if _, err := s.ReleaseLease(ctx, orphan.ID, clk.Now()); err != nil {
			t.Fatal(err)
		}
		if _, err := s.ReleaseLease(ctx, done.ID, clk.Now()); err != nil {
			t.Fatal(err)
		}
		code := 0
		if err := s.JournalFinish(ctx, doneID, JournalEnd{Outcome: OutcomeExit, Code: &code}); err != nil {
			t.Fatal(err)
		}
		// Within the grace: nothing closed.
		if n, err := s.JournalInterruptReleased(ctx, clk.Now().Add(-3*time.Second), "gone"); err != nil || n != 0 {
			t.Fatalf("within the grace: %d, %v", n, err)
		}
		clk.Advance(5 * time.Second)
		if n, err := s.JournalInterruptReleased(ctx, clk.Now().Add(-3*time.Second), "gone"); err != nil || n != 1 {
			t.Fatalf("after the grace: %d closed, %v; want 1", n, err)
		}
		rows, err := s.ListJournal(ctx, JournalFilter{Project: p.ID})
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range rows {
			want := map[int64]Outcome{orphanID: OutcomeInterrupted, liveID: "", doneID: OutcomeExit}[r.ID]
			if r.End.Outcome != want {
				t.Errorf("entry %v: outcome %q, want %q", r.Argv, r.End.Outcome, want)
			}
		}
	})
}

// TestJournalIndexes: the journal's only index by lease is the partial one
// of running entries (schema 10 dropped journal_lease, which every
// JournalStart paid for), and both interrupt paths still look entries up
// through it rather than scanning the journal.
func TestJournalIndexes(t *testing.T) {
	s, _ := newTestStore(t)
	ctx := context.Background()
	rows, err := s.r.QueryContext(ctx, "SELECT name FROM sqlite_master WHERE type = 'index' AND tbl_name = 'journal' AND sql IS NOT NULL ORDER BY name")
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for rows.Next() {
		var n string
		if err := rows.Scan(&n); err != nil {
			t.Fatal(err)
		}
		names = append(names, n)
	}
	rows.Close()
	if !slices.Equal(names, []string{"journal_project", "journal_running"}) {
		t.Errorf("journal indexes = %v, want [journal_project journal_running]", names)
	}
	for _, q := range []string{
		"UPDATE journal SET outcome = 'interrupted' WHERE lease = 'x' AND outcome IS NULL",
		`UPDATE journal SET outcome = 'interrupted' WHERE outcome IS NULL AND EXISTS (SELECT 1 FROM leases l
			WHERE l.id = journal.lease AND l.state = 'released' AND l.released_at < 1)`,
	} {
		plan, err := s.r.QueryContext(ctx, "EXPLAIN QUERY PLAN "+q)
		if err != nil {
			t.Fatal(err)
		}
		var steps []string
		for plan.Next() {
			var id, parent, unused int
			var detail string
			if err := plan.Scan(&id, &parent, &unused, &detail); err != nil {
				t.Fatal(err)
			}
			steps = append(steps, detail)
		}
		plan.Close()
		if !strings.Contains(strings.Join(steps, "; "), "journal_running") {
			t.Errorf("plan of %q = %q: does not use journal_running", q, steps)
		}
	}
}
