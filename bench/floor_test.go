package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/corral-sandbox/corral/confine"
	"github.com/corral-sandbox/corral/worker"
)

// TestMain lets the test binary serve as the Go agent and the relay, as
// the bench binary does.
func TestMain(m *testing.M) {
	// The re-exec entry points main has: the process rows' worker starts
	// machine inits, and confined host commands, from this binary.
	worker.MaybeRunInit()
	confine.MaybeRun()
	if len(os.Args) > 1 {
		if child, ok := children[os.Args[1]]; ok {
			if err := child(os.Args[2:]); err != nil {
				os.Stderr.WriteString(err.Error() + "\n")
				os.Exit(1)
			}
			os.Exit(0)
		}
	}
	os.Exit(m.Run())
}

func needRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: the agents run in a user namespace mapped to host ids")
	}
}

// The floors run commands as the guest uid in the held pid namespace,
// report exit statuses as they are, and refuse what they cannot start.
func TestFloors(t *testing.T) {
	needRoot(t)
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	type agent struct {
		name string
		exe  string
		args []string
	}
	agents := []agent{{"go", self, []string{"__agent"}}}
	if _, err := exec.LookPath("gcc"); err == nil {
		bin, err := buildAgentC(t.TempDir())
		if err != nil {
			t.Fatal(err)
		}
		agents = append(agents, agent{"c", bin, nil})
	} else {
		t.Log("gcc not installed: the C agent is not tested")
	}
	for _, a := range agents {
		for _, relay := range []bool{false, true} {
			name := a.name
			if relay {
				name += "+relay"
			}
			t.Run(name, func(t *testing.T) {
				fc, err := startFloor(a.exe, a.args, relay, nil)
				if err != nil {
					t.Fatal(err)
				}
				defer fc.stop()
				if err := fc.run([]string{"false"}); err == nil || !strings.Contains(err.Error(), "wait status 0x100") {
					t.Errorf("false: %v, want exit status 1", err)
				}
				if err := fc.run([]string{"no-such-command-anywhere"}); err == nil || !strings.Contains(err.Error(), "not started") {
					t.Errorf("missing command: %v, want not started", err)
				}
				// id -u is the guest's; sh's $$ is not 1 (the holder is PID 1
				// of the session's pid namespace), and stays small.
				if err := fc.run([]string{"sh", "-c", `test "$(id -u)" = 1000 && test $$ -gt 1 && test $$ -lt 100000`}); err != nil {
					t.Errorf("guest checks: %v", err)
				}
				done := make(chan error, 16)
				for range 16 {
					go func() { done <- fc.run([]string{"true"}) }()
				}
				for range 16 {
					if err := <-done; err != nil {
						t.Errorf("concurrent true: %v", err)
					}
				}
			})
		}
	}
}

// CPU accounting counts a child placed in a group, on each cgroup layout
// this host has (v1 cpuacct, the v2 hierarchy at /sys/fs/cgroup or, on a
// hybrid host, /sys/fs/cgroup/unified).
func TestCPUAcct(t *testing.T) {
	needRoot(t)
	type layout struct {
		root string
		v2   bool
	}
	var layouts []layout
	if mnt, err := v1Mount("cpuacct"); err == nil {
		layouts = append(layouts, layout{mnt, false})
	}
	for _, root := range []string{"/sys/fs/cgroup", "/sys/fs/cgroup/unified"} {
		var st unix.Statfs_t
		if unix.Statfs(root, &st) == nil && st.Type == unix.CGROUP2_SUPER_MAGIC {
			layouts = append(layouts, layout{root, true})
		}
	}
	if len(layouts) == 0 {
		t.Skip("no cgroup hierarchy with CPU accounting")
	}
	for _, l := range layouts {
		t.Run(filepath.Base(l.root), func(t *testing.T) {
			a, err := newCPUAcctAt(l.root, l.v2)
			if err != nil {
				t.Fatal(err)
			}
			defer func() {
				a.close()
				if _, err := os.Stat(a.parent); !os.IsNotExist(err) {
					t.Errorf("parent %s left behind: %v", a.parent, err)
				}
			}()
			// The child burns CPU only after it was placed (it waits
			// for a line on stdin).
			cmd := exec.Command("sh", "-c", "read x; i=0; while [ $i -lt 100000 ]; do i=$((i+1)); done")
			stdin, err := cmd.StdinPipe()
			if err != nil {
				t.Fatal(err)
			}
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			before := a.sample()
			if err := a.place(cmd.Process.Pid, filepath.Join(a.parent, groupAgent)); err != nil {
				t.Fatal(err)
			}
			stdin.Write([]byte("go\n"))
			if err := cmd.Wait(); err != nil {
				t.Fatal(err)
			}
			d := a.sample().sub(before)
			if d.agent <= 0 {
				t.Errorf("agent group counted %v for a busy child", d.agent)
			}
			if d.relay != 0 || d.worker != 0 {
				t.Errorf("idle groups counted CPU: %+v", d)
			}
			// The bench process itself was moved into core.
			b, _ := os.ReadFile("/proc/self/cgroup")
			if !strings.Contains(string(b), filepath.Base(a.parent)+"/"+groupCore) {
				t.Errorf("test process not in core: %s", b)
			}
		})
	}
}
