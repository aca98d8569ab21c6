package store

import (
	"context"
	"path/filepath"
	"testing"
	"time"
)

func benchLeases(b *testing.B, n int) (*Store, []string) {
	b.Helper()
	ctx := context.Background()
	s, err := Open(ctx, filepath.Join(b.TempDir(), "corral.db"), Options{Migrate: true})
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
