package main

import (
	"os"
	"strconv"
	"strings"
	"sync"
	"time"
)

// hostBusy returns the CPU time all CPUs of the host spent busy (user,
// nice, system, irq, softirq, steal) since boot, from /proc/stat; 0 if it
// cannot be read. It is the fallback where no cgroup accounting could be
// set up, and the check of it: the difference is other tenants' load.
func hostBusy() time.Duration {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line)
	if len(f) < 9 || f[0] != "cpu" {
		return 0
	}
	var ticks int64
	for _, i := range []int{1, 2, 3, 6, 7, 8} {
		v, _ := strconv.ParseInt(f[i], 10, 64)
		ticks += v
	}
	// USER_HZ is 100 on every Linux ABI Go supports.
	return time.Duration(ticks) * 10 * time.Millisecond
}

// concSubject is one way of running `true` under concurrency.
type concSubject struct {
	name string
	run  func() error
	skip string
}

// concRow is the throughput of one subject at one level of parallelism.
type concRow struct {
	subject  string
	level    int
	done     int
	failures int
	firstErr error
	elapsed  time.Duration
	perSec   float64
	p99      time.Duration
	// cpu is the cgroup accounting's CPU time over the subject's slices,
	// per group; host is the whole host's busy time (/proc/stat) over them.
	cpu  cpuSample
	host time.Duration
	skip string
}

// perCmd divides d by the commands completed.
func (r *concRow) perCmd(d time.Duration) time.Duration {
	if r.done == 0 {
		return 0
	}
	return d / time.Duration(r.done)
}

// concSlices is how many slices each level's time is cut into; the
// subjects alternate slice by slice, so that drift hits all alike.
const concSlices = 6

// measureConcurrency runs every subject at level for d each, in
// concSlices slices of d/concSlices that alternate between the subjects. In a slice,
// level goroutines call run in a loop until the slice's deadline;
// throughput counts the calls completed over the time until the last one
// returned.
func measureConcurrency(subjects []concSubject, level int, d time.Duration, acct *cpuAcct) []concRow {
	rows := make([]concRow, len(subjects))
	lat := make([][]time.Duration, len(subjects))
	for i, s := range subjects {
		rows[i] = concRow{subject: s.name, level: level, skip: s.skip}
	}
	slice := d / concSlices
	for range concSlices {
		for i, s := range subjects {
			if rows[i].skip != "" {
				continue
			}
			r := &rows[i]
			var (
				mu sync.Mutex
				wg sync.WaitGroup
			)
			cpu0, busy0 := acct.sample(), hostBusy()
			start := time.Now()
			deadline := start.Add(slice)
			for range level {
				wg.Add(1)
				go func() {
					defer wg.Done()
					var own []time.Duration
					var fails int
					var first error
					for time.Now().Before(deadline) {
						t0 := time.Now()
						if err := s.run(); err != nil {
							fails++
							if first == nil {
								first = err
							}
							continue
						}
						own = append(own, time.Since(t0))
					}
					mu.Lock()
					lat[i] = append(lat[i], own...)
					r.failures += fails
					if r.firstErr == nil {
						r.firstErr = first
					}
					mu.Unlock()
				}()
			}
			wg.Wait()
			r.elapsed += time.Since(start)
			r.cpu = r.cpu.add(acct.sample().sub(cpu0))
			r.host += hostBusy() - busy0
		}
	}
	for i := range rows {
		r := &rows[i]
		r.done = len(lat[i])
		if r.elapsed > 0 {
			r.perSec = float64(r.done) / r.elapsed.Seconds()
		}
		r.p99 = summarize(lat[i]).p99
	}
	return rows
}
