package store

import (
	"context"
	"errors"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/corral-sandbox/corral/internal/pgtest"
)

// An installation made through the store on SQLite (accounts and tokens,
// projects and members, an egress policy, a site, leases live and ended,
// the journal, artifacts, egress log) moves to PostgreSQL whole: every row
// reads back the same through the store, tokens still authenticate, new
// IDs come after the copied ones, and a second copy into the now
// non-empty target is refused and writes nothing.
func TestCopySQLiteToPostgres(t *testing.T) {
	ctx := context.Background()
	c := newClock()
	src := openTest(t, filepath.Join(t.TempDir(), DefaultFile), Options{Migrate: true, Now: c.Now})
	now := c.Now()

	alice, err := src.CreateAccount(ctx, "alice")
	must(t, err)
	bob, err := src.CreateAccount(ctx, "bob")
	must(t, err)
	must(t, src.SetHostPaths(ctx, bob.ID, true))
	plain, _, err := src.CreateToken(ctx, alice.ID, "laptop")
	must(t, err)
	_, revoked, err := src.CreateToken(ctx, bob.ID, "old")
	must(t, err)
	must(t, src.RevokeToken(ctx, revoked.ID))
	p, err := src.CreateProject(ctx, NewProject{Kind: ProjectManaged, Name: "web", Root: "/w", Limits: MachineLimits{Memory: 1 << 30}})
	must(t, err)
	h, err := src.CreateProject(ctx, NewProject{Kind: ProjectHost, Name: "host", Root: "/h", Network: true})
	must(t, err)
	_, err = src.AddMember(ctx, Member{Project: p.ID, Account: alice.ID, Role: RoleOwner})
	must(t, err)
	_, err = src.AddMember(ctx, Member{Project: p.ID, Account: bob.ID, Trusted: true})
	must(t, err)
	must(t, src.SetEgressPolicy(ctx, p.ID, `{"mode":"proxy","allow":["example.com"]}`))
	must(t, src.SetExportRemotes(ctx, p.ID, []string{"github.com/org/*"}))
	_, err = src.PutPublication(ctx, Publication{Name: "docs", Project: p.ID, Port: 8080, Owner: alice.ID})
	must(t, err)
	live, err := src.CreateLease(ctx, NewLease{Account: alice.ID, Project: p.ID, Kind: "terminal", TTL: time.Minute,
		Journal: &JournalCommand{Account: alice.ID, Project: p.ID, LeaseKind: "terminal", Argv: []string{"sleep", "9"}}}, now)
	must(t, err)
	done, err := src.CreateLease(ctx, NewLease{Account: bob.ID, Project: h.ID, Kind: "files", TTL: time.Minute,
		Journal: &JournalCommand{Account: bob.ID, Project: h.ID, LeaseKind: "files", Argv: []string{"true"}}}, now)
	must(t, err)
	code := 0
	_, err = src.ReleaseAndFinish(ctx, done.ID, now, done.Journal, JournalEnd{Outcome: OutcomeExit, Code: &code, StdoutBytes: 3})
	must(t, err)
	_, err = src.RecordArtifact(ctx, p.ID, "/tmp/bundle", live.ID)
	must(t, err)
	_, err = src.AppendEgress(ctx, EgressEntry{Account: alice.ID, Project: p.ID, Protocol: "http", Name: "example.com",
		Port: 443, Verdict: "allowed", Rule: "example.com", StartedAt: now})
	must(t, err)

	url := pgtest.NewDatabase(t)
	d := &testDB{backend: SchemePostgres, url: url}
	dst := d.open(t, Options{Migrate: true, Now: c.Now})
	counts, err := Copy(ctx, dst, src)
	if err != nil {
		t.Fatal(err)
	}
	if len(counts) != len(copyTables) {
		t.Fatalf("counts %+v", counts)
	}

	// The same through the store, on both.
	same := func(what string, get func(Store) (any, error)) {
		t.Helper()
		a, err := get(src)
		must(t, err)
		b, err := get(dst)
		must(t, err)
		if !reflect.DeepEqual(a, b) {
			t.Errorf("%s differs:\nsqlite   %+v\npostgres %+v", what, a, b)
		}
	}
	same("accounts", func(s Store) (any, error) { return s.ListAccounts(ctx) })
	same("tokens", func(s Store) (any, error) { return s.ListTokens(ctx, 0) })
	same("projects", func(s Store) (any, error) { return s.ListProjects(ctx) })
	same("members", func(s Store) (any, error) { return s.ListMembers(ctx, p.ID) })
	same("tenancy", func(s Store) (any, error) { return s.CachedTenancy(ctx, p.ID, bob.ID) })
	same("host paths", func(s Store) (any, error) { return s.HostPaths(ctx, bob.ID) })
	same("export remotes", func(s Store) (any, error) { return s.ExportRemotes(ctx, p.ID) })
	same("sites", func(s Store) (any, error) { return s.ListPublications(ctx, p.ID) })
	same("leases", func(s Store) (any, error) { return s.ListLeases(ctx, LeaseFilter{}) })
	same("live leases", func(s Store) (any, error) { return s.ListLeases(ctx, LeaseFilter{State: LeaseLive}) })
	same("journal", func(s Store) (any, error) { return s.ListJournal(ctx, JournalFilter{}) })
	same("artifacts", func(s Store) (any, error) { return s.ListArtifacts(ctx, p.ID, true) })
	same("egress log", func(s Store) (any, error) { return s.EgressLog(ctx, p.ID, 0) })
	checkClockInvariant(t, d, dst, p.ID, h.ID)

	if a, err := dst.Authenticate(ctx, plain); err != nil || a.ID != alice.ID {
		t.Fatalf("alice's token on the copy: %+v, %v", a, err)
	}
	// The live lease goes on where it was, and ends with its entry.
	if _, err := dst.ReleaseAndFinish(ctx, live.ID, now, live.Journal, JournalEnd{Outcome: OutcomeExit, Code: &code}); err != nil {
		t.Fatal(err)
	}
	// IDs continue after the copied ones.
	carol, err := dst.CreateAccount(ctx, "carol")
	must(t, err)
	q, err := dst.CreateProject(ctx, NewProject{Kind: ProjectHost, Name: "q", Root: "/q"})
	must(t, err)
	j, err := dst.JournalStart(ctx, JournalCommand{Account: carol.ID, Project: q.ID, Lease: "x", LeaseKind: "files"})
	must(t, err)
	if carol.ID <= bob.ID || q.ID <= h.ID || j <= done.Journal {
		t.Fatalf("new IDs %d, %d, %d reuse copied ones (%d, %d, %d)", carol.ID, q.ID, j, bob.ID, h.ID, done.Journal)
	}

	// A second copy: refused, nothing written.
	before := d.queryInt(t, "SELECT count(*) FROM accounts")
	if _, err := Copy(ctx, dst, src); !errors.Is(err, ErrTargetNotEmpty) {
		t.Fatalf("copy into a non-empty store = %v; want ErrTargetNotEmpty", err)
	}
	if after := d.queryInt(t, "SELECT count(*) FROM accounts"); after != before {
		t.Fatalf("refused copy wrote: %d accounts, were %d", after, before)
	}

	// A target whose schema has a table Copy does not know (a later
	// migration's): refused, rather than copied in part.
	later := &testDB{backend: SchemePostgres, url: pgtest.NewDatabase(t)}
	dst2 := later.open(t, Options{Migrate: true})
	later.exec(t, "CREATE TABLE later_table (x integer)")
	if _, err := Copy(ctx, dst2, src); err == nil || !strings.Contains(err.Error(), "later_table") {
		t.Fatalf("copy into a schema with an unknown table = %v; want it refused, naming the table", err)
	}
	if n := later.queryInt(t, "SELECT count(*) FROM accounts"); n != 0 {
		t.Fatalf("refused copy wrote %d accounts", n)
	}
}
