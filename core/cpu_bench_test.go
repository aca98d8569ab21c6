package core_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/corral-sandbox/corral/internal/testworker"
)

// BenchmarkRunCommandManagedCPU is RunCommand(managed, true) through a real
// worker in this process, warm machine, sequential and 64 at a time. Beside
// wall time per command it reports this process's CPU time per command
// (core and worker, getrusage): what 64 parallel commands on two cores are
// bound by, and less disturbed by other tenants than wall time is.
func BenchmarkRunCommandManagedCPU(b *testing.B) {
	w := testworker.Start(b, testworker.Options{})
	e := buildB(b, w)
	ctl, _ := e.core.Sandbox()
	ctx := context.Background()
	in := e.input(e.managed, "true")
	run := func() {
		if _, err := ctl.RunCommand(ctx, in, &e.actor, nil); err != nil {
			b.Error(err)
		}
	}
	for _, par := range []int{1, 64} {
		name := "sequential"
		if par > 1 {
			name = "parallel-64"
		}
		b.Run(name, func(b *testing.B) {
			for range par {
				run()
			}
			var ru0 unix.Rusage
			_ = unix.Getrusage(unix.RUSAGE_SELF, &ru0)
			b.ResetTimer()
			t0 := time.Now()
			var wg sync.WaitGroup
			var mu sync.Mutex
			left := b.N
			for range par {
				wg.Go(func() {
					for {
						mu.Lock()
						if left == 0 {
							mu.Unlock()
							return
						}
						left--
						mu.Unlock()
						run()
					}
				})
			}
			wg.Wait()
			wall := time.Since(t0)
			b.StopTimer()
			var ru1 unix.Rusage
			_ = unix.Getrusage(unix.RUSAGE_SELF, &ru1)
			cpu := time.Duration(ru1.Utime.Nano() + ru1.Stime.Nano() - ru0.Utime.Nano() - ru0.Stime.Nano())
			b.ReportMetric(float64(cpu.Microseconds())/float64(b.N), "cpu-µs/op")
			b.ReportMetric(float64(b.N)/wall.Seconds(), "cmd/s")
		})
	}
}
