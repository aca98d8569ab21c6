package provider

import (
	"context"
	"io"
	"os"
	"os/exec"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// cpuTime is the CPU time (user and system) this process and its reaped
// children have used so far.
func cpuTime(tb testing.TB) time.Duration {
	var total time.Duration
	for _, who := range []int{unix.RUSAGE_SELF, unix.RUSAGE_CHILDREN} {
		var ru unix.Rusage
		if err := unix.Getrusage(who, &ru); err != nil {
			tb.Fatal(err)
		}
		total += time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	return total
}

// reportCPU reports the CPU time per iteration since start (cpu-µs/op):
// the machine may be loaded by others, which wall time counts and this
// does not.
func reportCPU(b *testing.B, start time.Duration) {
	b.ReportMetric(float64(cpuTime(b)-start)/float64(time.Microsecond)/float64(b.N), "cpu-µs/op")
}

// BenchmarkRunCommandHost measures RunCommand(host, `true`) end to end:
// preparation (store lookups, cwd resolution, lease acquisition in SQLite),
// the start (on a confined thread, or directly), capture, and the lease
// release, in wall and CPU time per command (this process and its
// children: the command, and a confined command's pid namespace init).
// Compare with BenchmarkBareExec.
func BenchmarkRunCommandHost(b *testing.B) {
	for _, bc := range []struct {
		name    string
		trusted bool
	}{{"confined", false}, {"direct", true}} {
		b.Run(bc.name, func(b *testing.B) {
			if !bc.trusted {
				requireLandlock(b)
			}
			f := newFixture(b, fixtureOpts{trusted: bc.trusted})
			ctx := context.Background()
			in := f.input("", "true")
			a := f.actor
			b.ReportAllocs()
			cpu0 := cpuTime(b)
			for b.Loop() {
				res, err := f.ctrl.RunCommand(ctx, in, &a, nil)
				if err != nil || *res.Code != 0 {
					b.Fatalf("%+v, %v", res, err)
				}
			}
			reportCPU(b, cpu0)
		})
	}
}

// BenchmarkBareExec is the floor: exec.Command("true").Run(), bare and
// with both streams on pipes read to EOF (the capture RunCommand does).
func BenchmarkBareExec(b *testing.B) {
	b.Run("bare", func(b *testing.B) {
		b.ReportAllocs()
		cpu0 := cpuTime(b)
		for b.Loop() {
			if err := exec.Command("true").Run(); err != nil {
				b.Fatal(err)
			}
		}
		reportCPU(b, cpu0)
	})
	b.Run("capture", func(b *testing.B) {
		b.ReportAllocs()
		cpu0 := cpuTime(b)
		for b.Loop() {
			outR, outW, err := os.Pipe()
			if err != nil {
				b.Fatal(err)
			}
			errR, errW, err := os.Pipe()
			if err != nil {
				b.Fatal(err)
			}
			cmd := exec.Command("true")
			cmd.Stdout, cmd.Stderr = outW, errW
			err = cmd.Start()
			outW.Close()
			errW.Close()
			if err != nil {
				b.Fatal(err)
			}
			done := make(chan struct{})
			go func() { _, _ = io.Copy(io.Discard, errR); close(done) }()
			_, _ = io.Copy(io.Discard, outR)
			<-done
			outR.Close()
			errR.Close()
			if err := cmd.Wait(); err != nil {
				b.Fatal(err)
			}
		}
		reportCPU(b, cpu0)
	})
}
