package store

import (
	"context"
	"net"
	"runtime"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/corral-sandbox/corral/internal/pgtest"
	"github.com/jackc/pgx/v5/pgxpool"
)

// countingConn counts the writes of a connection to PostgreSQL: pgx
// writes each round trip's messages (Bind, Execute, Sync) at once, so
// writes are round trips.
type countingConn struct {
	net.Conn
	n *atomic.Int64
}

func (c countingConn) Write(b []byte) (int, error) {
	c.n.Add(1)
	return c.Conn.Write(b)
}

// countRoundTrips makes the PostgreSQL stores opened while t runs count
// their round trips into the returned counter.
func countRoundTrips(t testing.TB) *atomic.Int64 {
	var n atomic.Int64
	testHookPoolConfig = func(cfg *pgxpool.Config) {
		dial := cfg.ConnConfig.DialFunc
		cfg.ConnConfig.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
			c, err := dial(ctx, network, addr)
			if err != nil {
				return nil, err
			}
			return countingConn{Conn: c, n: &n}, nil
		}
	}
	t.Cleanup(func() { testHookPoolConfig = nil })
	return &n
}

// TestCommandRoundTrips: on PostgreSQL a command pays the round trips
// the contract needs and no more: one for its start (its lease, checked
// against its tenancy read, with its journal entry) and one for its end
// (the lease released with the entry finished). The tenancy read comes
// from memory (CachedTenancy).
func TestCommandRoundTrips(t *testing.T) {
	d := &testDB{backend: SchemePostgres, url: pgtest.NewDatabase(t)}
	trips := countRoundTrips(t)
	s := d.open(t, Options{Migrate: true})
	ctx := context.Background()
	a, err := s.CreateAccount(ctx, "a")
	must(t, err)
	p, err := s.CreateProject(ctx, NewProject{Kind: ProjectHost, Name: "p", Root: "/p"})
	must(t, err)
	_, err = s.AddMember(ctx, Member{Project: p.ID, Account: a.ID})
	must(t, err)
	command := func() {
		ten, err := s.CachedTenancy(ctx, p.ID, a.ID)
		must(t, err)
		l, err := s.CreateLease(ctx, NewLease{Account: 1, Project: p.ID, Kind: "terminal", TTL: time.Minute, TenancyVersion: ten.Version,
			Journal: &JournalCommand{Account: 1, Project: p.ID, LeaseKind: "terminal", Argv: []string{"true"}}}, time.Now())
		must(t, err)
		code := 0
		if ok, err := s.ReleaseAndFinish(ctx, l.ID, time.Now(), l.Journal, JournalEnd{Outcome: OutcomeExit, Code: &code}); !ok || err != nil {
			t.Fatal(ok, err)
		}
	}
	command() // the statements prepared on the connection, the tenancy cached
	const n = 20
	before := trips.Load()
	for range n {
		command()
	}
	if got := trips.Load() - before; got != 2*n {
		t.Fatalf("%d commands made %d round trips; want %d (2 each)", n, got, 2*n)
	}
}

// BenchmarkCommandWrites is a command's two writes, its start (lease,
// tenancy check and journal entry: CreateLease with NewLease.Journal) and
// its end (ReleaseAndFinish), on each backend: one at a time ("serial")
// and from 64 goroutines at once ("parallel64", commands in 64 projects).
// cpu-µs/op is this process's CPU time per command; on PostgreSQL
// (pgtest's server on this host, over its Unix socket) server-cpu-µs/op is
// the server's processes', and round-trips/op counts the client's writes
// to the server.
func BenchmarkCommandWrites(b *testing.B) {
	for _, backend := range []string{SchemeSQLite, SchemePostgres} {
		b.Run(backend, func(b *testing.B) {
			d := &testDB{backend: backend, url: DefaultURL(b.TempDir())}
			if backend == SchemePostgres {
				d.url = pgtest.NewDatabase(b)
			}
			trips := countRoundTrips(b)
			s := d.open(b, Options{Migrate: true, MaxConns: 64})
			ctx := context.Background()
			const projects = 64
			var ids []int64
			for i := range projects {
				p, err := s.CreateProject(ctx, NewProject{Kind: ProjectHost, Name: "p" + strconv.Itoa(i), Root: "/p"})
				if err != nil {
					b.Fatal(err)
				}
				ids = append(ids, p.ID)
			}
			command := func(project int64) {
				l, err := s.CreateLease(ctx, NewLease{Account: 1, Project: project, Kind: "terminal", TTL: time.Minute,
					Journal: &JournalCommand{Account: 1, Project: project, LeaseKind: "terminal", Argv: []string{"true"}}}, time.Now())
				if err != nil {
					b.Fatal(err)
				}
				code := 0
				if ok, err := s.ReleaseAndFinish(ctx, l.ID, time.Now(), l.Journal, JournalEnd{Outcome: OutcomeExit, Code: &code}); !ok || err != nil {
					b.Fatal(ok, err)
				}
			}
			serverCPU := func(b *testing.B) time.Duration {
				if backend != SchemePostgres {
					return 0
				}
				srv, err := pgtest.Shared()
				if err != nil {
					b.Fatal(err)
				}
				t, err := srv.CPUTime()
				if err != nil {
					b.Fatal(err)
				}
				return t
			}
			// measure returns report, which reports the metrics of the
			// commands run since measure.
			measure := func(b *testing.B) (report func()) {
				trips0, cpu0, srv0 := trips.Load(), cpuTime(b), serverCPU(b)
				return func() {
					n := float64(b.N)
					b.ReportMetric(float64((cpuTime(b)-cpu0).Microseconds())/n, "cpu-µs/op")
					if backend == SchemePostgres {
						b.ReportMetric(float64((serverCPU(b)-srv0).Microseconds())/n, "server-cpu-µs/op")
						b.ReportMetric(float64(trips.Load()-trips0)/n, "round-trips/op")
					}
				}
			}
			b.Run("serial", func(b *testing.B) {
				command(ids[0])
				report := measure(b)
				for b.Loop() {
					command(ids[0])
				}
				report()
			})
			b.Run("parallel64", func(b *testing.B) {
				var next atomic.Int64
				report := measure(b)
				b.SetParallelism(64 / max(1, runtime.GOMAXPROCS(0)))
				b.RunParallel(func(pb *testing.PB) {
					project := ids[next.Add(1)%projects]
					for pb.Next() {
						command(project)
					}
				})
				report()
			})
		})
	}
}
