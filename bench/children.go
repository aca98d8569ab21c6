package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/corral-sandbox/corral/core"
	"github.com/corral-sandbox/corral/lease"
	"github.com/corral-sandbox/corral/machine"
	"github.com/corral-sandbox/corral/sandbox"
	"github.com/corral-sandbox/corral/store"
)

// runChild re-executes the bench in a child mode and decodes the JSON it
// prints on stdout into out.
func runChild(out any, mode string, args ...string) error {
	self, err := os.Executable()
	if err != nil {
		return err
	}
	cmd := exec.Command(self, append([]string{mode}, args...)...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("%s: %w: %s", mode, err, bytesTrim(stderr.Bytes()))
	}
	if err := json.Unmarshal(stdout.Bytes(), out); err != nil {
		return fmt.Errorf("%s: %w (output %q)", mode, err, bytesTrim(stdout.Bytes()))
	}
	return nil
}

// vmHWM returns this process's peak resident set size in bytes.
func vmHWM() (int64, error) { return statusKB("VmHWM:") }

// vmRSS returns this process's resident set size in bytes.
func vmRSS() (int64, error) { return statusKB("VmRSS:") }

func statusKB(field string) (int64, error) {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0, err
	}
	for line := range strings.Lines(string(b)) {
		if rest, ok := strings.CutPrefix(line, field); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			return kb << 10, err
		}
	}
	return 0, fmt.Errorf("no %s in /proc/self/status", field)
}

// floodResult is what the flood child reports.
type floodResult struct {
	BaseRSS   int64          // bytes, after the core was built and the machine started
	PeakRSS   int64          // VmHWM after the flood, bytes
	FileRSS   int64          // RssFile after the flood (mapped executable and libraries), bytes
	PeakAnon  int64          // highest RssAnon seen (sampled every millisecond during the flood), bytes
	BaseAnon  int64          // RssAnon before the flood, bytes
	Kinds     map[string]int // outcome of each flooding command
	Captured  int64          // bytes of partial stdout returned, all commands
	ElapsedMs int64
}

// floodChild builds a core (its own store) on the worker's socket and
// runs -par commands in parallel in one managed project, each writing
// /dev/zero to stdout until its -limit stops it, then reports the
// process's peak RSS. Nothing else runs in the process.
func floodChild(args []string) error {
	fs := flag.NewFlagSet("__flood", flag.ContinueOnError)
	sock := fs.String("socket", "", "worker socket")
	ws := fs.String("workspace", "", "workspace under the worker's projects root")
	limit := fs.Int64("limit", 64<<20, "stdout limit of each command")
	par := fs.Int("par", 10, "parallel commands")
	prof := fs.String("memprofile", "", "write a heap profile (allocations) here after the flood")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *prof != "" {
		// Sample finely enough to see every command's allocations
		// (the default samples one per 512 KiB).
		runtime.MemProfileRate = 4 << 10
	}
	ctx := context.Background()
	dir, err := os.MkdirTemp("", "corral-bench-flood")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	c, err := core.Build(ctx, core.Options{
		StorePath: filepath.Join(dir, "corral.db"), Migrate: true,
		PrivilegedTransport: machine.SocketTransport{Path: *sock},
		Logger:              slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError})),
	})
	if err != nil {
		return err
	}
	defer c.Close()
	ctl, err := c.Sandbox()
	if err != nil {
		return err
	}
	st := c.Store()
	acct, err := st.CreateAccount(ctx, "flood")
	if err != nil {
		return err
	}
	p, err := st.CreateProject(ctx, store.NewProject{Kind: store.ProjectManaged, Name: "flood", Root: *ws})
	if err != nil {
		return err
	}
	if _, err := st.AddMember(ctx, store.Member{Project: p.ID, Account: acct.ID, Role: store.RoleOwner}); err != nil {
		return err
	}
	actor := sandbox.Actor{AccountUserID: acct.ID}
	if _, err := ctl.RunCommand(ctx, input(p, "true"), &actor, nil); err != nil {
		return fmt.Errorf("warm-up: %w", err)
	}
	res := floodResult{Kinds: map[string]int{}}
	if res.BaseRSS, err = vmRSS(); err != nil {
		return err
	}
	if res.BaseAnon, err = statusKB("RssAnon:"); err != nil {
		return err
	}
	// RssAnon is the core's own memory (heap, stacks), without the
	// executable's pages that VmHWM counts; the kernel keeps no peak of
	// it, so it is sampled.
	stopSampling := make(chan struct{})
	sampled := make(chan int64)
	go func() {
		peak := res.BaseAnon
		t := time.NewTicker(time.Millisecond)
		defer t.Stop()
		for {
			if v, err := statusKB("RssAnon:"); err == nil {
				peak = max(peak, v)
			}
			select {
			case <-stopSampling:
				sampled <- peak
				return
			case <-t.C:
			}
		}
	}()
	var mu sync.Mutex
	var wg sync.WaitGroup
	t0 := time.Now()
	for range *par {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r, err := ctl.RunCommand(ctx, input(p, "cat", "/dev/zero"), &actor, &sandbox.RunOptions{
				Timeout:     time.Minute,
				OutputLimit: sandbox.OutputLimit{Stdout: *limit},
			})
			kind, n := "completed", 0
			if err != nil {
				kind = string(sandbox.KindOf(err))
				if ce := (*sandbox.CommandError)(nil); errors.As(err, &ce) {
					n = len(ce.Stdout)
				}
			} else {
				n = len(r.Stdout)
			}
			mu.Lock()
			res.Kinds[kind]++
			res.Captured += int64(n)
			mu.Unlock()
		}()
	}
	wg.Wait()
	res.ElapsedMs = time.Since(t0).Milliseconds()
	close(stopSampling)
	res.PeakAnon = <-sampled
	if res.PeakRSS, err = vmHWM(); err != nil {
		return err
	}
	if res.FileRSS, err = statusKB("RssFile:"); err != nil {
		return err
	}
	if *prof != "" {
		runtime.GC() // the profile shows allocations as of the last cycle
		f, err := os.Create(*prof)
		if err != nil {
			return err
		}
		err = pprof.Lookup("allocs").WriteTo(f, 0)
		f.Close()
		if err != nil {
			return err
		}
	}
	return json.NewEncoder(os.Stdout).Encode(res)
}

// leasesResult is what the leases child reports.
type leasesResult struct {
	Leases     int
	AcquireMs  int64
	WindowMs   int64   // measured wall time
	CPUMs      int64   // process CPU (user+system) over the window
	Beats      int64   // heartbeats written
	Errors     int64   // failed heartbeats
	PercentCPU float64 // CPUMs / WindowMs * 100
}

// cpuTime is the CPU time (user + system) this process has used.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// leasesChild holds -n live leases on a fresh store with the lease
// package's defaults (15 s TTL, 3 s sweeps, 250 ms heartbeat window) and
// keeps each alive every 5 s through the manager's keep-alive loop, as
// RunCommand does, registered at random phases. After one round that
// registers every lease, it measures the process's CPU time
// over -rounds rounds.
func leasesChild(args []string) error {
	fs := flag.NewFlagSet("__leases", flag.ContinueOnError)
	n := fs.Int("n", 10000, "live leases")
	rounds := fs.Int("rounds", 2, "5 s heartbeat rounds")
	prof := fs.String("cpuprofile", "", "write a CPU profile of the heartbeat window here")
	if err := fs.Parse(args); err != nil {
		return err
	}
	const interval = sandbox.DefaultHeartbeatInterval
	ctx := context.Background()
	dir, err := os.MkdirTemp("", "corral-bench-leases")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	st, err := store.Open(ctx, filepath.Join(dir, "corral.db"), store.Options{Migrate: true})
	if err != nil {
		return err
	}
	defer st.Close()
	acct, err := st.CreateAccount(ctx, "leases")
	if err != nil {
		return err
	}
	p, err := st.CreateProject(ctx, store.NewProject{Kind: store.ProjectHost, Name: "p", Root: dir})
	if err != nil {
		return err
	}
	m := lease.NewManager(st, lease.Options{Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))})
	res := leasesResult{Leases: *n}
	t0 := time.Now()
	leases := make([]*lease.Lease, *n)
	for i := range leases {
		if leases[i], err = m.Acquire(ctx, lease.AcquireRequest{Account: acct.ID, Project: p.ID, Kind: sandbox.LeaseTerminal}); err != nil {
			return err
		}
	}
	res.AcquireMs = time.Since(t0).Milliseconds()

	rctx, stopRun := context.WithCancel(ctx)
	runDone := make(chan struct{})
	go func() { defer close(runDone); _ = m.Run(rctx) }()
	defer func() { stopRun(); <-runDone }()
	// One round to start every holder at its phase, then the measured
	// rounds: the steady state.
	hctx, stop := context.WithTimeout(ctx, time.Duration(*rounds+1)*interval+interval/2)
	defer stop()
	// Every lease is kept alive the way RunCommand keeps its lease alive:
	// through the manager's keep-alive loop (lease.KeepAlive), registered
	// at a random phase as commands start at random times.
	var beats, errs atomic.Int64
	var stops sync.Map
	for i, l := range leases {
		time.AfterFunc(rand.N(interval), func() {
			if hctx.Err() != nil {
				return
			}
			stops.Store(i, l.KeepAlive(interval, func(error) { errs.Add(1) }))
		})
	}
	defer stops.Range(func(_, v any) bool { v.(func())(); return true })
	time.Sleep(interval)
	if *prof != "" {
		f, err := os.Create(*prof)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
	}
	before := make([]time.Time, len(leases))
	for i, l := range leases {
		before[i] = l.Deadline()
	}
	cpu0, start := cpuTime(), time.Now()
	time.Sleep(time.Duration(*rounds) * interval)
	cpu, wall := cpuTime()-cpu0, time.Since(start)
	for i, l := range leases {
		beats.Add(int64(l.Deadline().Sub(before[i]) / interval))
	}
	if *prof != "" {
		pprof.StopCPUProfile()
	}
	stop()
	res.WindowMs, res.CPUMs = wall.Milliseconds(), cpu.Milliseconds()
	res.Beats, res.Errors = beats.Load(), errs.Load()
	res.PercentCPU = 100 * cpu.Seconds() / wall.Seconds()
	if live, err := m.LiveCount(ctx); err != nil || live != *n {
		return fmt.Errorf("%d of %d leases live after the run (%v)", live, *n, err)
	}
	return json.NewEncoder(os.Stdout).Encode(res)
}
