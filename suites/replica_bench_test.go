package suites

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/corral-sandbox/corral/client"
)

// BenchmarkReplicas measures managed `true` through the API (real
// daemons in processes of their own, a real worker) on each store:
// serially through one replica, and 64 at once through one replica and
// spread over three. On PostgreSQL it reports the store's transactions
// per command (pg_stat_database; each statement outside a transaction is
// one round trip), all replicas' included (their lease sweeps too).
//
//	go test -run '^$' -bench BenchmarkReplicas -benchtime 2000x ./suites
func BenchmarkReplicas(b *testing.B) {
	for _, be := range backends {
		b.Run(be.name, func(b *testing.B) {
			state := b.TempDir()
			url := be.url(b, state)
			rs := startReplicasWith(b, 3, url, state, true)
			cs := rs.clients(b, rs.admin)
			p, err := cs[0].CreateProject(context.Background(), client.ProjectRequest{Name: "bench"})
			must(b, err)
			run := func(c *client.Client) error {
				_, err := c.RunCommand(context.Background(), p.ID, client.CommandRequest{Command: argv("true")})
				return err
			}
			must(b, run(cs[0])) // the machine is warm
			measure := func(b *testing.B, parallel int, through []*client.Client) {
				var before int64
				if be.name == "postgres" {
					before = countStatements(b, url)
				}
				var next atomic.Int64
				var failed atomic.Int64
				var wg sync.WaitGroup
				b.ResetTimer()
				start := time.Now()
				for g := 0; g < parallel; g++ {
					wg.Add(1)
					go func() {
						defer wg.Done()
						for i := next.Add(1); i <= int64(b.N); i = next.Add(1) {
							if run(through[int(i)%len(through)]) != nil {
								failed.Add(1)
							}
						}
					}()
				}
				wg.Wait()
				elapsed := time.Since(start)
				b.StopTimer()
				b.ReportMetric(float64(b.N)/elapsed.Seconds(), "cmd/s")
				if f := failed.Load(); f != 0 {
					b.Errorf("%d of %d commands failed", f, b.N)
				}
				if be.name == "postgres" {
					b.ReportMetric(float64(countStatements(b, url)-before)/float64(b.N), "xacts/cmd")
				}
			}
			b.Run("serial", func(b *testing.B) { measure(b, 1, cs[:1]) })
			b.Run("64way-1replica", func(b *testing.B) { measure(b, 64, cs[:1]) })
			b.Run("64way-3replicas", func(b *testing.B) { measure(b, 64, cs) })
		})
	}
}
