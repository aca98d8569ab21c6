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
// cannot be read.
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

// concRow is the throughput of one subject at one level of parallelism.
type concRow struct {
	subject  string
	level    int
	done     int
	failures int
	firstErr error
	perSec   float64
	p99      time.Duration
	// cpuPerCmd is the whole host's busy CPU time (/proc/stat) divided
	// by the commands completed: every process's share, the worker's and
	// the machine's included.
	cpuPerCmd time.Duration
	skip      string
}

// measureConcurrency runs level goroutines, each calling run in a loop,
// for d; throughput counts the calls that completed until the last one
// returned.
func measureConcurrency(name string, level int, d time.Duration, run func() error) concRow {
	row := concRow{subject: name, level: level}
	var (
		mu  sync.Mutex
		lat []time.Duration
		wg  sync.WaitGroup
	)
	busy0 := hostBusy()
	start := time.Now()
	deadline := start.Add(d)
	for range level {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var own []time.Duration
			var fails int
			var first error
			for time.Now().Before(deadline) {
				t0 := time.Now()
				if err := run(); err != nil {
					fails++
					if first == nil {
						first = err
					}
					continue
				}
				own = append(own, time.Since(t0))
			}
			mu.Lock()
			lat = append(lat, own...)
			row.failures += fails
			if row.firstErr == nil {
				row.firstErr = first
			}
			mu.Unlock()
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	busy := hostBusy() - busy0
	row.done = len(lat)
	if row.done > 0 && busy > 0 {
		row.cpuPerCmd = busy / time.Duration(row.done)
	}
	row.perSec = float64(row.done) / elapsed.Seconds()
	row.p99 = summarize(lat).p99
	return row
}
