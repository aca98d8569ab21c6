package worker

import (
	"os"
	"os/exec"
	"slices"
	"testing"
	"time"

	"github.com/corral-sandbox/corral/wire"
)

// BenchmarkWarmExec measures one `true` in a running machine over the
// socket: exec-start, exec-accepted, exec-attach (three descriptors),
// exec-started, exec-exit. The client passes /dev/null three times so that
// only the protocol and the machine are measured.
func BenchmarkWarmExec(b *testing.B) {
	b.Run("sequential", func(b *testing.B) { benchWarmExec(b, false, "") })
	// The worker handles a connection's frames in order, so a client may
	// send exec-attach right behind exec-start without waiting for
	// exec-accepted, saving a round trip.
	b.Run("pipelined", func(b *testing.B) { benchWarmExec(b, true, "") })
	// exec-run (wire.FeatureExecRun): the start and its descriptors in one
	// frame, exec-started with no exec-accepted.
	b.Run("exec-run", benchWarmExecRun)
	// A named user costs a lookup round trip to the init before
	// exec-accepted; root's forks run on the init's other forking thread.
	b.Run("sequential-root", func(b *testing.B) { benchWarmExec(b, false, "root") })
}

func benchWarmExec(b *testing.B, pipelined bool, user string) {
	h := newHarness(b, nil)
	c := h.dial(b)
	p := h.project(b, 1)
	null, err := os.OpenFile(os.DevNull, os.O_RDWR, 0)
	if err != nil {
		b.Fatal(err)
	}
	defer null.Close()
	argv := []string{"true"}
	once := func(id string) {
		if err := c.Send(&wire.ExecStart{ID: id, Project: p, Argv: argv, Cwd: "/workspace", User: user}); err != nil {
			b.Fatal(err)
		}
		if !pipelined {
			if m, ok := recv(b, c).(*wire.ExecAccepted); !ok {
				b.Fatalf("got %#v", m)
			}
		}
		if err := c.Send(&wire.ExecAttach{ID: id}, null, null, null); err != nil {
			b.Fatal(err)
		}
		if pipelined {
			if m, ok := recv(b, c).(*wire.ExecAccepted); !ok {
				b.Fatalf("got %#v", m)
			}
		}
		if m, ok := recv(b, c).(*wire.ExecStarted); !ok {
			b.Fatalf("got %#v", m)
		}
		m, ok := recv(b, c).(*wire.ExecExit)
		if !ok || m.Code == nil || *m.Code != 0 {
			b.Fatalf("got %#v", m)
		}
	}
	once("warmup")
	var lat []time.Duration
	for b.Loop() {
		t0 := time.Now()
		once("b")
		lat = append(lat, time.Since(t0))
	}
	reportPercentiles(b, lat)
}

func benchWarmExecRun(b *testing.B) {
	h := newHarness(b, nil)
	c := h.dial(b)
	p := h.project(b, 1)
	null, err := os.OpenFile(os.DevNull, os.O_RDWR, 0)
	if err != nil {
		b.Fatal(err)
	}
	defer null.Close()
	once := func(id string) {
		run := &wire.ExecRun{ID: id, Project: p, Argv: []string{"true"}, Cwd: "/workspace"}
		if err := c.Send(run, null, null, null); err != nil {
			b.Fatal(err)
		}
		if m, ok := recv(b, c).(*wire.ExecStarted); !ok {
			b.Fatalf("got %#v", m)
		}
		m, ok := recv(b, c).(*wire.ExecExit)
		if !ok || m.Code == nil || *m.Code != 0 {
			b.Fatalf("got %#v", m)
		}
	}
	once("warmup")
	var lat []time.Duration
	for b.Loop() {
		t0 := time.Now()
		once("b")
		lat = append(lat, time.Since(t0))
	}
	reportPercentiles(b, lat)
}

func reportPercentiles(b *testing.B, lat []time.Duration) {
	slices.Sort(lat)
	if len(lat) > 0 {
		b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "p50-µs")
		b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "p99-µs")
	}
}

// BenchmarkColdExec measures `true` in a machine that has to start first:
// every machine stops as soon as it is idle.
func BenchmarkColdExec(b *testing.B) {
	h := newHarness(b, func(c *Config) { c.IdleGrace = time.Nanosecond })
	c := h.dial(b)
	var lat []time.Duration
	for i := 0; b.Loop(); i++ {
		p := h.project(b, int64(i+1))
		t0 := time.Now()
		if r := h.run(b, c, p, "true"); r.code() != 0 {
			b.Fatal(r)
		}
		lat = append(lat, time.Since(t0))
	}
	reportPercentiles(b, lat)
}

// BenchmarkBareExec is the baseline: exec.Command("true").Run().
func BenchmarkBareExec(b *testing.B) {
	var lat []time.Duration
	for b.Loop() {
		t0 := time.Now()
		if err := exec.Command("true").Run(); err != nil {
			b.Fatal(err)
		}
		lat = append(lat, time.Since(t0))
	}
	reportPercentiles(b, lat)
}

// BenchmarkColdExecDisk is BenchmarkColdExec with a 256 MiB disk per
// project: "new" makes each project's disk (mkfs) at its first start,
// "existing" restarts projects whose disks exist (e2fsck -p and mount),
// round-robin over 16 so that each one's previous machine has stopped;
// "none" is the same round-robin without disks.
func BenchmarkColdExecDisk(b *testing.B) {
	for _, mode := range []string{"none", "new", "existing"} {
		b.Run(mode, func(b *testing.B) {
			h := newHarness(b, func(c *Config) {
				c.IdleGrace = time.Nanosecond
				if mode != "none" {
					c.Limits.Disk = 256 << 20
				}
			})
			c := h.dial(b)
			const n = 16
			if mode != "new" {
				for i := range n {
					if r := h.run(b, c, h.project(b, int64(i+1)), "true"); r.code() != 0 {
						b.Fatal(r)
					}
				}
			}
			var lat []time.Duration
			for i := 0; b.Loop(); i++ {
				id := int64(i%n + 1)
				if mode == "new" {
					id = int64(i + 1)
				}
				p := h.project(b, id)
				t0 := time.Now()
				if r := h.run(b, c, p, "true"); r.code() != 0 {
					b.Fatal(r)
				}
				lat = append(lat, time.Since(t0))
			}
			reportPercentiles(b, lat)
		})
	}
}
