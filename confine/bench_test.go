package confine_test

import (
	"os"
	"os/exec"
	"testing"

	"github.com/corral-sandbox/corral/confine"
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
