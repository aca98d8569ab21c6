package confine_test

import (
	"os"
	"os/exec"
	"syscall"
	"testing"
	"time"

	"github.com/corral-sandbox/corral/confine"
	"golang.org/x/sys/unix"
)

// BenchmarkConfine compares the ways to start `true`: bare, confined by the
// re-exec'd helper (with its exec-status pipe, as core does), and confined
// by Start on a restricted thread.
func BenchmarkConfine(b *testing.B) {
	requireLandlock(b)
	root := b.TempDir()
	b.Run("bare", func(b *testing.B) {
		for b.Loop() {
			if err := exec.Command("true").Run(); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("helper", func(b *testing.B) {
		self, err := os.Executable()
		if err != nil {
			b.Fatal(err)
		}
		path, args := confine.Command(self, confine.Policy{Writable: []string{root}}, []string{"true"})
		for b.Loop() {
			r, w, err := os.Pipe()
			if err != nil {
				b.Fatal(err)
			}
			cmd := &exec.Cmd{Path: path, Args: args, Env: []string{"PATH=/usr/bin:/bin"}, ExtraFiles: []*os.File{w}}
			err = cmd.Start()
			w.Close()
			if err != nil {
				b.Fatal(err)
			}
			var buf [1]byte
			if n, _ := r.Read(buf[:]); n != 0 {
				b.Fatal("helper reported a failure")
			}
			r.Close()
			if err := cmd.Wait(); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("thread", func(b *testing.B) {
		for b.Loop() {
			cmd := exec.Command("true")
			if _, err := confine.Start(cmd, confine.Policy{Writable: []string{root}}); err != nil {
				b.Fatal(err)
			}
			if err := cmd.Wait(); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// BenchmarkConfineUser is Start as an unprivileged user (root only): the
// pid namespace with corral's init, the offline network, the uid switch;
// the tree is killed and awaited as RunCommand does.
func BenchmarkConfineUser(b *testing.B) {
	requireLandlock(b)
	if os.Geteuid() != 0 {
		b.Skip("needs root")
	}
	self, err := os.Executable()
	if err != nil {
		b.Fatal(err)
	}
	root := b.TempDir()
	for _, network := range []bool{false, true} {
		name := "offline"
		if network {
			name = "network"
		}
		b.Run(name, func(b *testing.B) {
			p := confine.Policy{Writable: []string{root}, Network: network, User: &confine.User{UID: 1<<24 + 4243, GID: 1<<24 + 4243}, Init: self}
			for b.Loop() {
				cmd := exec.Command("/bin/true")
				tree, err := confine.Start(cmd, p)
				if err != nil {
					b.Fatal(err)
				}
				if err := cmd.Wait(); err != nil {
					b.Fatal(err)
				}
				tree.Kill()
				<-tree.Done()
			}
		})
	}
}

// rusage returns the CPU time (user and system) of who (RUSAGE_SELF or
// RUSAGE_CHILDREN: the reaped children).
func rusage(tb testing.TB, who int) time.Duration {
	var ru unix.Rusage
	if err := unix.Getrusage(who, &ru); err != nil {
		tb.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkStartUserCPU is Start of /bin/true as an unprivileged user as
// RunCommand does it (minimal init, offline network, process group, the
// tree killed and awaited), beside the bare start of the same command as
// that user: CPU per command of this process (self-µs) and of its
// children (children-µs: the command, and the namespace's init).
func BenchmarkStartUserCPU(b *testing.B) {
	requireLandlock(b)
	if os.Geteuid() != 0 {
		b.Skip("needs root")
	}
	root := b.TempDir()
	u := &confine.User{UID: 1<<24 + 4243, GID: 1<<24 + 4243}
	measure := func(b *testing.B, run func()) {
		self0, child0 := rusage(b, unix.RUSAGE_SELF), rusage(b, unix.RUSAGE_CHILDREN)
		for b.Loop() {
			run()
		}
		n := float64(b.N) * float64(time.Microsecond)
		b.ReportMetric(float64(rusage(b, unix.RUSAGE_SELF)-self0)/n, "self-µs/op")
		b.ReportMetric(float64(rusage(b, unix.RUSAGE_CHILDREN)-child0)/n, "children-µs/op")
	}
	b.Run("bare", func(b *testing.B) {
		measure(b, func() {
			cmd := exec.Command("/bin/true")
			cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Credential: &syscall.Credential{Uid: u.UID, Gid: u.GID, Groups: []uint32{}}}
			if err := cmd.Run(); err != nil {
				b.Fatal(err)
			}
		})
	})
	b.Run("confined", func(b *testing.B) {
		p := confine.Policy{Writable: []string{root}, User: u}
		measure(b, func() {
			cmd := exec.Command("/bin/true")
			cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
			tree, err := confine.Start(cmd, p)
			if err != nil {
				b.Fatal(err)
			}
			if err := cmd.Wait(); err != nil {
				b.Fatal(err)
			}
			tree.Kill()
			<-tree.Done()
		})
	})
}
