package machine_test

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/corral-sandbox/corral/internal/testworker"
	"github.com/corral-sandbox/corral/machine"
	"github.com/corral-sandbox/corral/worker"
)

// BenchmarkGatewayExec measures `true` through the gateway and the real
// worker (Exec, Wait, Close), one at a time and 64 at a time, next to
// os/exec doing the same. Besides latency percentiles it reports the host
// CPU time per command: this process (gateway and worker), the machine's
// init and every process either reaped (the commands, holders).
//
// The process variants run the worker in a process of its own, as in
// production, and report its CPU time apart from this process's (the
// gateway's).
func BenchmarkGatewayExec(b *testing.B) {
	b.Run("sequential", func(b *testing.B) { benchGateway(b, 1) })
	b.Run("parallel-64", func(b *testing.B) { benchGateway(b, 64) })
	b.Run("process-sequential", func(b *testing.B) { benchGatewayProcess(b, 1) })
	b.Run("process-parallel-64", func(b *testing.B) { benchGatewayProcess(b, 64) })
	b.Run("bare-sequential", func(b *testing.B) { benchBare(b, 1) })
	b.Run("bare-parallel-64", func(b *testing.B) { benchBare(b, 64) })
}

func benchGateway(b *testing.B, par int) {
	// Room for 64 sessions and their holders under the pids limit.
	in, rw := newIntegrationWith(b, func(c *worker.Config) { c.Limits.Pids = worker.DefaultPids })
	once, failed := execTrue(b, in.g, in.req("true"))
	once()
	if failed.Load() {
		b.FailNow()
	}
	ms := rw.w.Machines()
	if len(ms) != 1 {
		b.Fatalf("machines %+v", ms)
	}
	init := ms[0].InitPID
	// Warm the holder pool up to the concurrency.
	runN(par, par, once)
	self0, init0, reaped0 := selfCPU(), procCPU(b, init, false), procCPU(b, init, true)
	b.ResetTimer()
	lat := runN(b.N, par, once)
	b.StopTimer()
	self, inits, reaped := selfCPU()-self0, procCPU(b, init, false)-init0, procCPU(b, init, true)-reaped0
	report(b, lat, self+inits+reaped)
	per := func(d time.Duration) float64 { return float64(d.Microseconds()) / float64(b.N) }
	b.ReportMetric(per(self), "worker-cpu-µs/op")
	b.ReportMetric(per(inits), "init-cpu-µs/op")
	b.ReportMetric(per(reaped), "reaped-cpu-µs/op")
}

func benchGatewayProcess(b *testing.B, par int) {
	root, ws := projectsRoot(b)
	sock := filepath.Join(b.TempDir(), "worker.sock")
	cgParent := fmt.Sprintf("corral-machine-bench-%d-%d", os.Getpid(), time.Now().UnixNano())
	b.Cleanup(func() { testworker.RemoveCgroups(cgParent) }) // after the worker's kill
	cmd := startChildWorker(b, root, sock, cgParent, os.Stderr, childWorkerEnv+"_PIDS="+strconv.Itoa(worker.DefaultPids))
	g := machine.New(machine.SocketTransport{Path: sock}, machine.Options{MinBackoff: 10 * time.Millisecond})
	b.Cleanup(func() { g.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for g.Ping(ctx) != nil {
		if ctx.Err() != nil {
			b.Fatal("the worker did not start")
		}
		time.Sleep(10 * time.Millisecond)
	}
	req := machine.ExecRequest{Project: machine.Project{ID: 1, Workspace: ws}, Argv: []string{"true"},
		Cwd: "/workspace", Env: map[string]string{"PATH": worker.DefaultPath}}
	once, failed := execTrue(b, g, req)
	once()
	if failed.Load() {
		b.FailNow()
	}
	initPID := childOf(b, cmd.Process.Pid)
	runN(par, par, once)
	wpid := cmd.Process.Pid
	self0, w0, init0, reaped0 := selfCPU(), procCPU(b, wpid, false), procCPU(b, initPID, false), procCPU(b, initPID, true)
	b.ResetTimer()
	lat := runN(b.N, par, once)
	b.StopTimer()
	self, wk := selfCPU()-self0, procCPU(b, wpid, false)-w0
	inits, reaped := procCPU(b, initPID, false)-init0, procCPU(b, initPID, true)-reaped0
	report(b, lat, self+wk+inits+reaped)
	per := func(d time.Duration) float64 { return float64(d.Microseconds()) / float64(b.N) }
	b.ReportMetric(per(self), "gateway-cpu-µs/op")
	b.ReportMetric(per(wk), "worker-cpu-µs/op")
	b.ReportMetric(per(inits), "init-cpu-µs/op")
	b.ReportMetric(per(reaped), "reaped-cpu-µs/op")
}

// childOf returns the one child process of pid (the worker's machine init).
func childOf(b *testing.B, pid int) int {
	tasks, err := filepath.Glob("/proc/" + strconv.Itoa(pid) + "/task/*/children")
	if err != nil {
		b.Fatal(err)
	}
	var kids []string
	for _, t := range tasks {
		raw, _ := os.ReadFile(t)
		kids = append(kids, strings.Fields(string(raw))...)
	}
	if len(kids) != 1 {
		b.Fatalf("worker %d has children %v, want one init", pid, kids)
	}
	n, err := strconv.Atoi(kids[0])
	if err != nil {
		b.Fatal(err)
	}
	return n
}

// execTrue returns a function that runs req through g and checks that it
// exited 0; failures are reported (once) and set failed.
func execTrue(b *testing.B, g *machine.Gateway, req machine.ExecRequest) (once func(), failed *atomic.Bool) {
	ctx := context.Background()
	failed = new(atomic.Bool)
	once = func() {
		if failed.Load() {
			return
		}
		s, err := g.Exec(ctx, req)
		if err != nil {
			if !failed.Swap(true) {
				b.Error(err)
			}
			return
		}
		exit, err := s.Wait()
		s.Close()
		if err != nil || exit.Code == nil || *exit.Code != 0 {
			if !failed.Swap(true) {
				b.Errorf("Wait = %+v, %v", exit, err)
			}
		}
	}
	return once, failed
}

func benchBare(b *testing.B, par int) {
	once := func() {
		if err := exec.Command("true").Run(); err != nil {
			b.Error(err)
		}
	}
	cpu0 := selfCPU()
	b.ResetTimer()
	lat := runN(b.N, par, once)
	b.StopTimer()
	report(b, lat, selfCPU()-cpu0)
}

// runN runs fn n times from par goroutines and returns each call's latency.
func runN(n, par int, fn func()) []time.Duration {
	lat := make([]time.Duration, n)
	var next atomic.Int64
	var wg sync.WaitGroup
	for range par {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := next.Add(1) - 1
				if i >= int64(n) {
					return
				}
				t0 := time.Now()
				fn()
				lat[i] = time.Since(t0)
			}
		}()
	}
	wg.Wait()
	return lat
}

func report(b *testing.B, lat []time.Duration, cpu time.Duration) {
	slices.Sort(lat)
	if len(lat) > 0 {
		b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "p50-µs")
		b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "p99-µs")
		b.ReportMetric(float64(cpu.Microseconds())/float64(len(lat)), "cpu-µs/op")
	}
}

// selfCPU is the CPU time of this process and of its reaped children.
func selfCPU() time.Duration {
	var total time.Duration
	for _, who := range []int{unix.RUSAGE_SELF, unix.RUSAGE_CHILDREN} {
		var ru unix.Rusage
		if unix.Getrusage(who, &ru) == nil {
			total += time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
		}
	}
	return total
}

// procCPU is the CPU time of process pid or, with children set, of its
// reaped children, from /proc/pid/stat (utime and stime, or cutime and
// cstime).
func procCPU(b *testing.B, pid int, children bool) time.Duration {
	raw, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		b.Fatal(err)
	}
	s := string(raw)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+2:])
	var ticks int64
	fields := []int{11, 12} // fields 14 and 15, counted from state (3)
	if children {
		fields = []int{13, 14}
	}
	for _, i := range fields {
		v, err := strconv.ParseInt(f[i], 10, 64)
		if err != nil {
			b.Fatal(err)
		}
		ticks += v
	}
	return time.Duration(ticks) * time.Second / 100 // USER_HZ
}

// BenchmarkGatewayCapture measures the throughput of a command's stdout
// from a warm machine (dd of 64 MiB in 64 KiB writes, read to io.Discard
// through a 64 KiB buffer) beside the same dd on the host writing into a
// socketpair read the same way: the producer and the socket path, without
// corral's capture. A third path is the host dd in a session of its own
// (setsid), which puts it in a scheduling group of its own when the
// kernel groups tasks by session (sched_autogroup_enabled), as a
// machine's cgroup does: it separates the cost of the producer and the
// consumer being in different scheduling groups from the machine's. The
// paths alternate, one run each per iteration, and each reports its own
// MB/s (10^6 bytes per second of its own time).
//
// The sub-benchmarks run the machine with the worker's default CPU limit
// and with none.
func BenchmarkGatewayCapture(b *testing.B) {
	b.Run("cpu-limit", func(b *testing.B) { benchGatewayCapture(b, nil) })
	b.Run("no-cpu-limit", func(b *testing.B) {
		benchGatewayCapture(b, func(c *worker.Config) { c.Limits.CPUMillis = -1 })
	})
}

func benchGatewayCapture(b *testing.B, mod func(*worker.Config)) {
	const size = 64 << 20
	argv := []string{"dd", "if=/dev/zero", "bs=65536", "count=" + strconv.Itoa(size/65536), "status=none"}
	in, _ := newIntegrationWith(b, mod)
	ctx := context.Background()
	buf := make([]byte, 64<<10)
	managed := func() {
		s, err := in.g.Exec(ctx, in.req(argv...))
		if err != nil {
			b.Fatal(err)
		}
		defer s.Close()
		n, err := io.CopyBuffer(io.Discard, s.Stdout, buf)
		exit, werr := s.Wait()
		if err != nil || werr != nil || n != size || exit.Code == nil || *exit.Code != 0 {
			b.Fatalf("copied %d, %v; Wait = %+v, %v", n, err, exit, werr)
		}
	}
	bare := func(setsid bool) {
		fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			b.Fatal(err)
		}
		near, far := os.NewFile(uintptr(fds[0]), "near"), os.NewFile(uintptr(fds[1]), "far")
		cmd := exec.Command(argv[0], argv[1:]...)
		cmd.Stdout = far
		cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: setsid}
		err = cmd.Start()
		far.Close()
		if err != nil {
			b.Fatal(err)
		}
		n, err := io.CopyBuffer(io.Discard, near, buf)
		near.Close()
		if werr := cmd.Wait(); err != nil || werr != nil || n != size {
			b.Fatalf("copied %d, %v, %v", n, err, werr)
		}
	}
	managed()
	var dm, db, ds time.Duration
	b.ResetTimer()
	for range b.N {
		t0 := time.Now()
		managed()
		t1 := time.Now()
		bare(false)
		t2 := time.Now()
		bare(true)
		dm, db, ds = dm+t1.Sub(t0), db+t2.Sub(t1), ds+time.Since(t2)
	}
	b.StopTimer()
	mbps := func(d time.Duration) float64 { return float64(size) * float64(b.N) / d.Seconds() / 1e6 }
	b.ReportMetric(mbps(dm), "managed-MB/s")
	b.ReportMetric(mbps(db), "bare-MB/s")
	b.ReportMetric(mbps(ds), "bare-setsid-MB/s")
	b.ReportMetric(float64(dm)/float64(db), "managed/bare")
}
