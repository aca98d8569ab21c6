package store

import (
	"context"
	"database/sql"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"golang.org/x/sys/unix"
)

func benchLeases(b *testing.B, n int) (*sqliteStore, []string) {
	b.Helper()
	ctx := context.Background()
	s, err := openSQLite(ctx, filepath.Join(b.TempDir(), "corral.db"), Options{Migrate: true})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { s.Close() })
	p, err := s.CreateProject(ctx, NewProject{Kind: ProjectHost, Name: "p", Root: "/p"})
	if err != nil {
		b.Fatal(err)
	}
	ids := make([]string, n)
	for i := range ids {
		l, err := s.CreateLease(ctx, NewLease{Account: 1, Project: p.ID, Kind: "terminal", TTL: time.Hour}, time.Now())
		if err != nil {
			b.Fatal(err)
		}
		ids[i] = l.ID
	}
	return s, ids
}

// BenchmarkHeartbeatLease: one lease per transaction.
func BenchmarkHeartbeatLease(b *testing.B) {
	s, ids := benchLeases(b, 10000)
	ctx := context.Background()
	b.ResetTimer()
	for i := range b.N {
		if err := s.HeartbeatLease(ctx, ids[i%len(ids)], time.Now()); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkHeartbeatLeases: batches of 100 leases per transaction; ns/op is
// per lease.
func BenchmarkHeartbeatLeases(b *testing.B) {
	for _, size := range []int{10, 100, 500, 2000} {
		b.Run(itoa(size), func(b *testing.B) {
			s, ids := benchLeases(b, 10000)
			ctx := context.Background()
			b.ResetTimer()
			for i := 0; i < b.N; i += size {
				start := i % len(ids)
				end := min(start+size, len(ids))
				errs, err := s.HeartbeatLeases(ctx, ids[start:end], time.Now())
				if err != nil {
					b.Fatal(err)
				}
				for _, err := range errs {
					if err != nil {
						b.Fatal(err)
					}
				}
			}
		})
	}
}

func itoa(n int) string { return time.Duration(n).String()[:len(time.Duration(n).String())-2] }

// BenchmarkCreateRelease is the store's share of one command's lease: a
// lease created and released, each in its own write, beside a history of
// 10,000 ended leases and 100 live ones (the indexes then span many pages,
// as in a store that has run for a while).
func BenchmarkCreateRelease(b *testing.B) {
	s, ids := benchLeases(b, 10100)
	ctx := context.Background()
	for _, id := range ids[:10000] {
		if _, err := s.ReleaseLease(ctx, id, time.Now()); err != nil {
			b.Fatal(err)
		}
	}
	p, err := s.ProjectByName(ctx, "p")
	if err != nil {
		b.Fatal(err)
	}
	var lat []time.Duration
	b.ReportAllocs()
	for b.Loop() {
		start := time.Now()
		l, err := s.CreateLease(ctx, NewLease{Account: 1, Project: p.ID, Kind: "terminal", TTL: time.Hour}, start)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := s.ReleaseLease(ctx, l.ID, time.Now()); err != nil {
			b.Fatal(err)
		}
		lat = append(lat, time.Since(start))
	}
	reportPercentiles(b, lat)
}

// reportPercentiles reports the median and 99th percentile of lat.
func reportPercentiles(b *testing.B, lat []time.Duration) {
	if len(lat) < 100 {
		return
	}
	slices.Sort(lat)
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "p50-µs")
	b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "p99-µs")
}

// BenchmarkJournal is the journal's share of one command: an entry started
// and finished.
func BenchmarkJournal(b *testing.B) {
	s, _ := benchLeases(b, 0)
	ctx := context.Background()
	code := 0
	b.ReportAllocs()
	var start time.Duration
	for b.Loop() {
		c0 := cpuTime(b)
		id, err := s.JournalStart(ctx, JournalCommand{Account: 1, Project: 1, Lease: "l", LeaseKind: "terminal", Argv: []string{"true"}})
		if err != nil {
			b.Fatal(err)
		}
		start += cpuTime(b) - c0
		if err := s.JournalFinish(ctx, id, JournalEnd{Outcome: OutcomeExit, Code: &code}); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(start.Microseconds())/float64(b.N), "start-cpu-µs/op")
}

// BenchmarkTenancy is the reads of one command's preparation: its project
// and the actor's membership, after a write (as every command follows the
// previous one's writes).
func BenchmarkTenancy(b *testing.B) {
	s, ids := benchLeases(b, 1)
	ctx := context.Background()
	p, err := s.ProjectByName(ctx, "p")
	if err != nil {
		b.Fatal(err)
	}
	a, err := s.CreateAccount(ctx, "a")
	if err != nil {
		b.Fatal(err)
	}
	if _, err := s.AddMember(ctx, Member{Project: p.ID, Account: a.ID}); err != nil {
		b.Fatal(err)
	}
	for _, bc := range []struct {
		name string
		read func() error
	}{
		{"two-reads", func() error {
			if _, err := s.GetProject(ctx, p.ID); err != nil {
				return err
			}
			_, err := s.GetMember(ctx, p.ID, a.ID)
			return err
		}},
		{"one-read", func() error {
			_, _, err := s.GetProjectMember(ctx, p.ID, a.ID)
			return err
		}},
		{"cached", func() error {
			_, err := s.CachedTenancy(ctx, p.ID, a.ID)
			return err
		}},
	} {
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				b.StopTimer()
				if err := s.HeartbeatLease(ctx, ids[0], time.Now()); err != nil {
					b.Fatal(err)
				}
				b.StartTimer()
				if err := bc.read(); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkCommandLargeHistory is every store write of one command (lease
// created, journal started and finished, lease released) in a store that
// has run 500,000 commands: its indexes no longer fit SQLite's page cache.
// "random-ids" gives leases version 4 UUIDs, as the store did before its
// time-ordered ones ("store-ids").
func BenchmarkCommandLargeHistory(b *testing.B) {
	ctx := context.Background()
	s, _ := benchLeases(b, 0)
	p, err := s.ProjectByName(ctx, "p")
	if err != nil {
		b.Fatal(err)
	}
	const history = 500000
	for _, q := range []string{
		`INSERT INTO leases (id, account, project, kind, domain, holder, state, ttl_ms, created_at, heartbeat_at, expires_at, released_at)
			SELECT lower(hex(randomblob(16))), 1, ?1, 'terminal', '', 'pid 1 on host', 'released', 15000, x, x, x, x FROM c`,
		`INSERT INTO journal (account, project, domain, lease, lease_kind, argv, limits, started_at, ended_at, outcome, code)
			SELECT 1, ?1, '', lower(hex(randomblob(16))), 'terminal', '["true"]', '{}', x, x, 'exit', 0 FROM c`,
	} {
		q = "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x+1 FROM c LIMIT " + strconv.Itoa(history) + ") " + q
		if _, err := s.w.ExecContext(ctx, q, p.ID); err != nil {
			b.Fatal(err)
		}
	}
	if _, err := s.w.ExecContext(ctx, "PRAGMA wal_checkpoint(TRUNCATE)"); err != nil {
		b.Fatal(err)
	}
	for _, random := range []bool{true, false} {
		name := "store-ids"
		if random {
			name = "random-ids"
		}
		b.Run(name, func(b *testing.B) {
			code := 0
			b.ReportAllocs()
			for b.Loop() {
				var id string
				if random {
					id = uuid.NewString()
				}
				l, err := s.CreateLease(ctx, NewLease{ID: id, Account: 1, Project: p.ID, Kind: "terminal", TTL: time.Hour}, time.Now())
				if err != nil {
					b.Fatal(err)
				}
				j, err := s.JournalStart(ctx, JournalCommand{Account: 1, Project: p.ID, Lease: l.ID, LeaseKind: "terminal", Argv: []string{"true"}})
				if err != nil {
					b.Fatal(err)
				}
				if err := s.JournalFinish(ctx, j, JournalEnd{Outcome: OutcomeExit, Code: &code}); err != nil {
					b.Fatal(err)
				}
				if _, err := s.ReleaseLease(ctx, l.ID, time.Now()); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkCommandParallel is every store write of one command (lease
// created, journal started and finished, lease released) run by N
// goroutines at once, as the daemon runs N commands in parallel. ns/op is
// wall time per command; cpu-µs/op is the process's CPU time (user and
// system, getrusage) per command, which is what N parallel commands on a
// few cores are bound by.
func BenchmarkCommandParallel(b *testing.B) {
	for _, n := range []int{1, 8, 64} {
		b.Run("N="+strconv.Itoa(n), func(b *testing.B) {
			ctx := context.Background()
			s, _ := benchLeases(b, 100)
			p, err := s.ProjectByName(ctx, "p")
			if err != nil {
				b.Fatal(err)
			}
			var next atomic.Int64
			var wg sync.WaitGroup
			b.ReportAllocs()
			b.ResetTimer()
			cpu0 := cpuTime(b)
			for range n {
				wg.Go(func() {
					code := 0
					for next.Add(1) <= int64(b.N) {
						l, err := s.CreateLease(ctx, NewLease{Account: 1, Project: p.ID, Kind: "terminal", TTL: time.Hour}, time.Now())
						if err != nil {
							b.Error(err)
							return
						}
						j, err := s.JournalStart(ctx, JournalCommand{Account: 1, Project: p.ID, Lease: l.ID, LeaseKind: "terminal", Argv: []string{"true"}})
						if err != nil {
							b.Error(err)
							return
						}
						if err := s.JournalFinish(ctx, j, JournalEnd{Outcome: OutcomeExit, Code: &code}); err != nil {
							b.Error(err)
							return
						}
						if err := s.ReleaseHeldLease(ctx, l.ID, time.Now()); err != nil {
							b.Error(err)
							return
						}
					}
				})
			}
			wg.Wait()
			cpu := cpuTime(b) - cpu0
			b.StopTimer()
			b.ReportMetric(float64(cpu.Microseconds())/float64(b.N), "cpu-µs/op")
		})
	}
}

// cpuTime returns the process's user and system CPU time so far.
func cpuTime(b *testing.B) time.Duration {
	var ru unix.Rusage
	if err := unix.Getrusage(unix.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkCommandContext is every store write of one command with the
// contexts callers pass: none ("background"), a 5 s deadline as the
// journal and HTTP requests have ("deadline"), and the same deadline
// handed to the driver with each statement, as exec did before hot
// ("driver-deadline": the driver's watcher goroutine per statement).
// Rounds alternate; cpu-µs/op is the process's CPU time per command.
func BenchmarkCommandContext(b *testing.B) {
	s, _ := benchLeases(b, 10)
	bg := context.Background()
	p, err := s.ProjectByName(bg, "p")
	if err != nil {
		b.Fatal(err)
	}
	stmt := func(q string) *sql.Stmt {
		st, err := s.writeStmt(bg, q)
		if err != nil {
			b.Fatal(err)
		}
		return st
	}
	ins, start, rel, fin := stmt(sqlInsertLease), stmt(sqlJournalStart), stmt(sqlRelease), stmt(sqlJournalFinish)
	code := 0
	viaStore := func(ctx context.Context) error {
		l, err := s.CreateLease(ctx, NewLease{Account: 1, Project: p.ID, Kind: "terminal", TTL: time.Hour}, time.Now())
		if err != nil {
			return err
		}
		j, err := s.JournalStart(ctx, JournalCommand{Account: 1, Project: p.ID, Lease: l.ID, LeaseKind: "terminal", Argv: []string{"true"}})
		if err != nil {
			return err
		}
		if err := s.ReleaseHeldLease(ctx, l.ID, time.Now()); err != nil {
			return err
		}
		return s.JournalFinish(ctx, j, JournalEnd{Outcome: OutcomeExit, Code: &code})
	}
	viaDriver := func(ctx context.Context) error {
		id := uuid.Must(uuid.NewV7()).String()
		now := ms(time.Now())
		if _, err := ins.ExecContext(ctx, id, 1, p.ID, "terminal", "", "", 3600000, now, now, now+3600000); err != nil {
			return err
		}
		r, err := start.ExecContext(ctx, 1, p.ID, "", id, "terminal", `["true"]`, `{}`, now)
		if err != nil {
			return err
		}
		j, _ := r.LastInsertId()
		if _, err := rel.ExecContext(ctx, id, ms(time.Now())); err != nil {
			return err
		}
		_, err = fin.ExecContext(ctx, ms(time.Now()), "exit", 0, "", false, "", 0, 0, "", j)
		return err
	}
	for range 3 {
		for _, v := range []struct {
			name     string
			deadline bool
			run      func(context.Context) error
		}{{"background", false, viaStore}, {"deadline", true, viaStore}, {"driver-deadline", true, viaDriver}} {
			b.Run(v.name, func(b *testing.B) {
				cpu0 := cpuTime(b)
				for b.Loop() {
					ctx, cancel := bg, context.CancelFunc(func() {})
					if v.deadline {
						ctx, cancel = context.WithTimeout(bg, 5*time.Second)
					}
					err := v.run(ctx)
					cancel()
					if err != nil {
						b.Fatal(err)
					}
				}
				b.ReportMetric(float64((cpuTime(b)-cpu0).Microseconds())/float64(b.N), "cpu-µs/op")
			})
		}
	}
}

// BenchmarkEgressPolicy is the policy read of every managed command's
// preparation (package egress reads it as each session starts), with the
// request's deadline on its context as core passes it, after a write.
func BenchmarkEgressPolicy(b *testing.B) {
	s, ids := benchLeases(b, 1)
	ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
	defer cancel()
	p, err := s.ProjectByName(ctx, "p")
	if err != nil {
		b.Fatal(err)
	}
	for _, bc := range []struct {
		name   string
		policy string
	}{{"none", ""}, {"set", `{"mode":"proxy","allow":["example.com"]}`}} {
		b.Run(bc.name, func(b *testing.B) {
			if bc.policy != "" {
				if err := s.SetEgressPolicy(ctx, p.ID, bc.policy); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportAllocs()
			var cpu time.Duration
			for b.Loop() {
				b.StopTimer()
				if err := s.HeartbeatLease(ctx, ids[0], time.Now()); err != nil {
					b.Fatal(err)
				}
				b.StartTimer()
				c0 := cpuTime(b)
				got, err := s.EgressPolicy(ctx, p.ID)
				if err != nil || got != bc.policy {
					b.Fatal(got, err)
				}
				cpu += cpuTime(b) - c0
			}
			b.ReportMetric(float64(cpu.Microseconds())/float64(b.N), "cpu-µs/op")
		})
	}
}

// BenchmarkBatchTx is a batch of two (a command's lease released and its
// journal entry finished) four ways: two commits of their own, one
// database/sql transaction (how runBatch ran a batch until schema 10),
// runBatch (one transaction on the driver's connection), and one statement
// (ReleaseAndFinish, schema 13). cpu-µs/op is the process's CPU time of
// the two writes.
func BenchmarkBatchTx(b *testing.B) {
	for _, mode := range []string{"two-commits", "sql-tx", "runBatch", "one-statement", "two-commits", "one-statement"} {
		b.Run(mode, func(b *testing.B) {
			s, _ := benchLeases(b, 0)
			ctx := context.Background()
			p, err := s.ProjectByName(ctx, "p")
			if err != nil {
				b.Fatal(err)
			}
			code := 0
			var cpu time.Duration
			for b.Loop() {
				l, err := s.CreateLease(ctx, NewLease{Account: 1, Project: p.ID, Kind: "terminal", TTL: time.Hour}, time.Now())
				if err != nil {
					b.Fatal(err)
				}
				id, err := s.JournalStart(ctx, JournalCommand{Account: 1, Project: p.ID, Lease: l.ID, LeaseKind: "terminal", Argv: []string{"true"}})
				if err != nil {
					b.Fatal(err)
				}
				c0 := cpuTime(b)
				now := ms(time.Now())
				finish := []any{now, "exit", int64(0), "", false, "", int64(0), int64(0), "", id}
				switch mode {
				case "two-commits":
					if err := s.ReleaseHeldLease(ctx, l.ID, fromMS(now)); err != nil {
						b.Fatal(err)
					}
					if err := s.JournalFinish(ctx, id, JournalEnd{Outcome: OutcomeExit, Code: &code}); err != nil {
						b.Fatal(err)
					}
				case "sql-tx":
					tx, err := s.w.BeginTx(ctx, nil)
					if err != nil {
						b.Fatal(err)
					}
					rel, _ := s.writeStmt(ctx, sqlRelease)
					fin, _ := s.writeStmt(ctx, sqlJournalFinish)
					if _, err := tx.StmtContext(ctx, rel).ExecContext(ctx, l.ID, now); err != nil {
						b.Fatal(err)
					}
					if _, err := tx.StmtContext(ctx, fin).ExecContext(ctx, finish...); err != nil {
						b.Fatal(err)
					}
					if err := tx.Commit(); err != nil {
						b.Fatal(err)
					}
				case "one-statement":
					if ok, err := s.ReleaseAndFinish(ctx, l.ID, fromMS(now), id, JournalEnd{Outcome: OutcomeExit, Code: &code}); !ok || err != nil {
						b.Fatal(ok, err)
					}
				case "runBatch":
					batch := []*writeReq{
						{ctx: ctx, q: sqlRelease, args: []any{l.ID, now}, wake: make(chan struct{}, 1)},
						{ctx: ctx, q: sqlJournalFinish, args: finish, wake: make(chan struct{}, 1)},
					}
					s.runBatch(batch)
					for _, r := range batch {
						if r.res.err != nil || r.res.rows != 1 {
							b.Fatal(r.res)
						}
					}
				}
				cpu += cpuTime(b) - c0
			}
			b.ReportMetric(float64(cpu.Microseconds())/float64(b.N), "cpu-µs/op")
		})
	}
}

// BenchmarkTenancyLease is a command's tenancy check and lease insert two
// ways: the read followed by the insert ("read-insert", before schema 11),
// and the cached read with the version checked by the insert
// ("cached-checked"). Rounds alternate; cpu-µs/op is the process's CPU
// time of the read and the insert (the lease's release is not counted).
func BenchmarkTenancyLease(b *testing.B) {
	s, _ := benchLeases(b, 0)
	ctx := context.Background()
	p, err := s.ProjectByName(ctx, "p")
	if err != nil {
		b.Fatal(err)
	}
	a, err := s.CreateAccount(ctx, "a")
	if err != nil {
		b.Fatal(err)
	}
	if _, err := s.AddMember(ctx, Member{Project: p.ID, Account: a.ID}); err != nil {
		b.Fatal(err)
	}
	for range 3 {
		for _, cached := range []bool{false, true} {
			name := "read-insert"
			if cached {
				name = "cached-checked"
			}
			b.Run(name, func(b *testing.B) {
				var cpu time.Duration
				for b.Loop() {
					c0 := cpuTime(b)
					var version int64
					if cached {
						t, err := s.CachedTenancy(ctx, p.ID, a.ID)
						if err != nil {
							b.Fatal(err)
						}
						version = t.Version
					} else if _, _, err := s.GetProjectMember(ctx, p.ID, a.ID); err != nil {
						b.Fatal(err)
					}
					l, err := s.CreateLease(ctx, NewLease{Account: a.ID, Project: p.ID, Kind: "terminal", TTL: time.Hour, TenancyVersion: version}, time.Now())
					if err != nil {
						b.Fatal(err)
					}
					cpu += cpuTime(b) - c0
					if err := s.ReleaseHeldLease(ctx, l.ID, time.Now()); err != nil {
						b.Fatal(err)
					}
				}
				b.ReportMetric(float64(cpu.Microseconds())/float64(b.N), "cpu-µs/op")
			})
		}
	}
}

// BenchmarkCommandStart is a command's start two ways: the lease created
// and then its journal entry ("two-writes", before schema 14), and both by
// one statement ("one-statement", CreateLease with NewLease.Journal).
// Rounds alternate; cpu-µs/op is the process's CPU time of the start (the
// command's end, one ReleaseAndFinish, is not counted).
func BenchmarkCommandStart(b *testing.B) {
	s, _ := benchLeases(b, 100)
	ctx := context.Background()
	p, err := s.ProjectByName(ctx, "p")
	if err != nil {
		b.Fatal(err)
	}
	code := 0
	for range 3 {
		for _, one := range []bool{false, true} {
			name := "two-writes"
			if one {
				name = "one-statement"
			}
			b.Run(name, func(b *testing.B) {
				var cpu time.Duration
				for b.Loop() {
					c0 := cpuTime(b)
					cmd := JournalCommand{Account: 1, Project: p.ID, LeaseKind: "terminal", Argv: []string{"true"}}
					n := NewLease{Account: 1, Project: p.ID, Kind: "terminal", TTL: time.Hour}
					if one {
						n.Journal = &cmd
					}
					l, err := s.CreateLease(ctx, n, time.Now())
					if err != nil {
						b.Fatal(err)
					}
					if !one {
						cmd.Lease = l.ID
						if l.Journal, err = s.JournalStart(ctx, cmd); err != nil {
							b.Fatal(err)
						}
					}
					cpu += cpuTime(b) - c0
					if ok, err := s.ReleaseAndFinish(ctx, l.ID, time.Now(), l.Journal, JournalEnd{Outcome: OutcomeExit, Code: &code}); !ok || err != nil {
						b.Fatal(ok, err)
					}
				}
				b.ReportMetric(float64(cpu.Microseconds())/float64(b.N), "cpu-µs/op")
			})
		}
	}
}
