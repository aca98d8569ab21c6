package main

import (
	"sync"
	"time"
)

// concRow is the throughput of one subject at one level of parallelism.
type concRow struct {
	subject  string
	level    int
	done     int
	failures int
	firstErr error
	perSec   float64
	p99      time.Duration
	skip     string
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
	row.done = len(lat)
	row.perSec = float64(row.done) / elapsed.Seconds()
	row.p99 = summarize(lat).p99
	return row
}
