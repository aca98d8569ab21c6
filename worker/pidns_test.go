package worker

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/corral-sandbox/corral/internal/testenv"
	"github.com/corral-sandbox/corral/wire"
)

// A session's main process is an ordinary process of its pid namespace
// (the holder is PID 1 there), so signals act on it as anywhere else.
func TestOrdinarySignalSemantics(t *testing.T) {
	for _, goHolders := range []bool{false, true} {
		t.Run(map[bool]string{false: "sleepHolders", true: "goHolders"}[goHolders], func(t *testing.T) {
			testOrdinarySignalSemantics(t, goHolders)
		})
	}
}

func testOrdinarySignalSemantics(t *testing.T, goHolders bool) {
	h := newHarness(t, func(c *Config) { c.GoHolders = goHolders })
	c := h.dial(t)
	p := h.project(t, 1)
	for _, tt := range []struct{ name, script, signal string }{
		{"SIGTERM to itself", "kill -TERM $$; sleep 5", "SIGTERM"},
		{"SIGKILL to itself", "kill -KILL $$; sleep 5", "SIGKILL"},
		{"SIGINT to itself", "kill -INT $$; sleep 5", "SIGINT"},
		{"abort", "exec python3 -c 'import os; os.abort()'", "SIGABRT"},
		{"from a child", "sh -c 'kill -TERM $PPID'; sleep 5", "SIGTERM"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			r := h.run(t, c, p, "sh", "-c", tt.script)
			if r.exit.Signal != tt.signal || r.exit.Code != nil {
				t.Fatalf("want death by %s and no code: %v", tt.signal, r)
			}
		})
	}
	t.Run("default dispositions", func(t *testing.T) {
		// Nothing ignored or blocked is inherited from the init.
		r := h.run(t, c, p, "grep", "-E", "^Sig(Blk|Ign)", "/proc/self/status")
		if r.stdout != "SigBlk:\t0000000000000000\nSigIgn:\t0000000000000000\n" {
			t.Fatalf("%v", r)
		}
	})
	t.Run("not PID 1", func(t *testing.T) {
		r := h.run(t, c, p, "sh", "-c", "echo $$; cat /proc/1/cmdline | tr '\\0' ' '")
		pid, _, _ := strings.Cut(r.stdout, "\n")
		if r.code() != 0 || pid == "1" {
			t.Fatalf("main process is PID 1 of its namespace: %v", r)
		}
	})
}

// Orphans are reparented to the holder, which leaves no zombie, even when
// the main process never waits.
func TestOrphansReaped(t *testing.T) {
	for _, goHolders := range []bool{false, true} {
		t.Run(map[bool]string{false: "sleepHolders", true: "goHolders"}[goHolders], func(t *testing.T) {
			testOrphansReaped(t, goHolders)
		})
	}
}

// testOrphansReaped runs with either kind of holder: env+sleep, or this
// binary (the fallback where env lacks --ignore-signal).
func testOrphansReaped(t *testing.T, goHolders bool) {
	h := newHarness(t, func(c *Config) { c.GoHolders = goHolders })
	c := h.dial(t)
	p := h.project(t, 1)
	run := h.start(t, c, p, "sh", "-c", "(sleep 0.1 &); exec sleep 100")
	if !run.started {
		t.Fatalf("%#v", run.first)
	}
	// The holders are of the kind asked for. (A holder being spawned still
	// runs the init's command line until its exec, and one being discarded
	// has none: only a lasting mismatch counts.)
	var wrong []string
	m := h.machineOf(t, 1)
	deadline := time.Now().Add(5 * time.Second)
	for {
		wrong = wrong[:0]
		for _, pid := range holderPids(t, m) {
			b, _ := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
			if isGo := strings.Contains(string(b), "__corral-ns-holder"); isGo != goHolders {
				wrong = append(wrong, fmt.Sprintf("%d runs %q", pid, strings.ReplaceAll(string(b), "\x00", " ")))
			}
		}
		if len(wrong) == 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if len(wrong) > 0 {
		t.Errorf("holders %v, want Go holders: %v", wrong, goHolders)
	}
	// Seen from the host: a session's /proc shows its own namespace only.
	testenv.WaitFor(t, 10*time.Second, "the orphan to exit", func() bool {
		return !strings.Contains(describe(machinePids(t, m)), `"sleep\x000.1\x00"`)
	})
	// A process shows as a zombie for an instant while it exits, even
	// when its parent ignores SIGCHLD: only a lasting one counts.
	testenv.WaitFor(t, 10*time.Second, "no zombie in the machine", func() bool { return len(zombies(t, m)) == 0 })
	if err := c.Send(&wire.ExecCancel{ID: run.id}); err != nil {
		t.Fatal(err)
	}
	if r := run.wait(t); r.exit.Signal != "SIGKILL" {
		t.Fatalf("cancelled: %v", r)
	}
}

// The holder runs as guest root: the session's user cannot signal it, so
// cannot end its own namespace early (nor see any other holder).
func TestHolderNotSignallable(t *testing.T) {
	h := newHarness(t, nil)
	c := h.dial(t)
	p := h.project(t, 1)
	r := h.run(t, c, p, "sh", "-c", "for s in TERM INT HUP KILL STOP; do kill -$s 1 || echo refused; done; sleep 0.1; echo alive; grep ^Uid /proc/1/status")
	if r.code() != 0 || !strings.HasPrefix(r.stdout, "refused\nrefused\nrefused\nrefused\nrefused\nalive\nUid:\t0\t") ||
		!strings.Contains(r.stderr, "Operation not permitted") {
		t.Fatalf("%v", r)
	}
}

// holderStatus returns fields of /proc/pid/status.
func holderStatus(t *testing.T, pid int, keys ...string) map[string]string {
	t.Helper()
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		t.Fatal(err)
	}
	out := make(map[string]string)
	for _, l := range strings.Split(string(b), "\n") {
		k, v, ok := strings.Cut(l, ":")
		if ok && slices.Contains(keys, k) {
			out[k] = strings.Join(strings.Fields(v), " ")
		}
	}
	return out
}

func TestHolderPool(t *testing.T) {
	h := newHarness(t, nil)
	c := h.dial(t)
	p := h.project(t, 1)
	h.run(t, c, p, "true")
	m := h.machineOf(t, 1)
	// At least two ready holders (a holder spawned on the spot for a
	// session that came before the pool filled is kept too), and no spawn
	// still under way.
	var pool []int
	testenv.WaitFor(t, 10*time.Second, "two ready holders", func() bool {
		pool = holderPids(t, m)
		slices.Sort(pool)
		time.Sleep(50 * time.Millisecond)
		again := holderPids(t, m)
		slices.Sort(again)
		return len(pool) >= 2 && slices.Equal(pool, again)
	})
	t.Run("holders hold nothing", func(t *testing.T) {
		for _, pid := range pool {
			// The Go runtime opens a file or two while it starts.
			var fds []os.DirEntry
			deadline := time.Now().Add(2 * time.Second)
			for {
				var err error
				if fds, err = os.ReadDir("/proc/" + strconv.Itoa(pid) + "/fd"); err != nil {
					t.Fatal(err)
				}
				if len(fds) == 3 || time.Now().After(deadline) {
					break
				}
				time.Sleep(5 * time.Millisecond)
			}
			if len(fds) != 3 {
				t.Errorf("holder %d has %d descriptors", pid, len(fds))
			}
			for _, fd := range fds {
				if l, _ := os.Readlink("/proc/" + strconv.Itoa(pid) + "/fd/" + fd.Name()); l != os.DevNull {
					t.Errorf("holder %d descriptor %s is %s", pid, fd.Name(), l)
				}
			}
			st := holderStatus(t, pid, "Uid", "VmRSS", "RssAnon", "Threads")
			if want := strconv.Itoa(int(m.HostUID)); !strings.HasPrefix(st["Uid"], want+" ") {
				t.Errorf("holder %d runs as host uid %s, want guest root %s", pid, st["Uid"], want)
			}
			t.Logf("holder %d: VmRSS %s, RssAnon %s, threads %s", pid, st["VmRSS"], st["RssAnon"], st["Threads"])
		}
	})
	t.Run("reused after a clean session", func(t *testing.T) {
		for range 5 {
			if r := h.run(t, c, p, "sh", "-c", "true & wait"); r.code() != 0 {
				t.Fatalf("%v", r)
			}
		}
		got := holderPids(t, m)
		slices.Sort(got)
		if !slices.Equal(got, pool) {
			t.Fatalf("holders %v, then %v: not reused", pool, got)
		}
	})
	refilled := func(t *testing.T, what string) {
		t.Helper()
		testenv.WaitFor(t, 10*time.Second, "pool refilled after "+what, func() bool {
			got := holderPids(t, m)
			used := 0
			for _, pid := range pool {
				if !slices.Contains(got, pid) {
					used++
				}
			}
			// The used holder is gone and the pool holds at least its
			// ahead-of-need size again.
			if len(got) >= 2 && used == 1 {
				pool = got
				slices.Sort(pool)
				return true
			}
			return false
		})
	}
	t.Run("replaced after a session with leftovers", func(t *testing.T) {
		if r := h.run(t, c, p, "sh", "-c", "setsid sleep 100 & exit 0"); r.code() != 0 {
			t.Fatalf("%v", r)
		}
		if left := sessionPids(t, m); len(left) != 0 {
			t.Fatalf("left behind: %s", describe(left))
		}
		refilled(t, "leftovers")
	})
	t.Run("replaced after a cancel", func(t *testing.T) {
		run := h.start(t, c, p, "sleep", "100")
		if err := c.Send(&wire.ExecCancel{ID: run.id}); err != nil {
			t.Fatal(err)
		}
		if r := run.wait(t); r.exit.Signal != "SIGKILL" {
			t.Fatalf("%v", r)
		}
		refilled(t, "cancel")
	})
	t.Run("dead holders in the pool are skipped", func(t *testing.T) {
		// Killed from outside (as the OOM killer would), the ready
		// holders' namespaces take no process: the next session must
		// find a live holder all the same.
		dead := holderPids(t, m)
		for _, pid := range dead {
			if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
		}
		testenv.WaitFor(t, 10*time.Second, "killed holders gone", func() bool {
			for _, pid := range dead {
				b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
				if err == nil && !strings.Contains(string(b), ") Z ") {
					return false
				}
			}
			return true
		})
		for range 3 {
			if r := h.run(t, c, p, "true"); r.code() != 0 {
				t.Fatalf("%v", r)
			}
		}
		testenv.WaitFor(t, 10*time.Second, "pool refilled after the kill", func() bool {
			got := holderPids(t, m)
			for _, pid := range dead {
				if slices.Contains(got, pid) {
					return false
				}
			}
			if len(got) >= 2 {
				pool = got
				return true
			}
			return false
		})
	})
	t.Run("concurrent sessions", func(t *testing.T) {
		// More sessions than ready holders: the others are spawned on
		// the spot; each session has a namespace of its own.
		var runs []*running
		for range 4 {
			runs = append(runs, h.start(t, c, p, "sh", "-c", "readlink /proc/self/ns/pid; cat"))
		}
		for _, r := range runs {
			if !r.started {
				t.Fatalf("%#v", r.first)
			}
		}
		if n := len(holderPids(t, m)); n < 4 {
			t.Errorf("%d holders for 4 sessions", n)
		}
		var namespaces []string
		for _, run := range runs {
			r := run.wait(t)
			if r.code() != 0 || !strings.HasPrefix(r.stdout, "pid:[") || slices.Contains(namespaces, r.stdout) {
				t.Fatalf("%v; namespaces before: %q", r, namespaces)
			}
			namespaces = append(namespaces, r.stdout)
		}
		// Their holders come back to the pool (as many are kept as the
		// machine admits sessions, and a few): the next burst reuses them.
		testenv.WaitFor(t, 10*time.Second, "holders back in the pool", func() bool { n := len(holderPids(t, m)); return n >= 4 && n <= 64 })
		again := h.start(t, c, p, "true")
		if r := again.wait(t); r.code() != 0 {
			t.Fatalf("%v", r)
		}
		if n := len(holderPids(t, m)); n < 4 || n > 64 {
			t.Errorf("%d holders after a reuse", n)
		}
	})
}

// A process made with clone(CLONE_PARENT) by the main process is a child
// of the init, outside the holder's subtree, but in its namespace: it dies
// with the session.
func TestCloneParentKilledAtEnd(t *testing.T) {
	if runtime.GOARCH != "amd64" {
		t.Skip("the script calls clone by its amd64 number")
	}
	h := newHarness(t, nil)
	c := h.dial(t)
	p := h.project(t, 1)
	const script = `
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
pid = libc.syscall(56, 0x8000 | 17, 0, 0, 0, 0)  # clone(CLONE_PARENT|SIGCHLD)
if pid == 0:
    os.execv("/bin/sleep", ["sleep", "100"])
print(pid)
`
	r := h.run(t, c, p, "python3", "-c", script)
	if r.code() != 0 || r.stdout == "" || r.stdout == "-1\n" {
		t.Fatalf("%v", r)
	}
	m := h.machineOf(t, 1)
	if left := sessionPids(t, m); len(left) != 0 {
		t.Errorf("left behind: %s", describe(left))
	}
	// The machine serves on, and the next session is not in the stray's
	// company (its /proc shows its own namespace).
	if r := h.run(t, c, p, "sh", "-c", "ps -eo args= | grep -c '^sleep 100'"); r.stdout != "0\n" {
		t.Errorf("%v", r)
	}
}

// zombies lists the machine's processes, and their children (a zombie may
// have left its cgroup), that have exited and not been reaped.
func zombies(t testing.TB, m MachineInfo) []int {
	t.Helper()
	var z []int
	for _, pid := range machinePids(t, m) {
		kids, _ := filepath.Glob("/proc/" + strconv.Itoa(pid) + "/task/*/children")
		pids := []int{pid}
		for _, k := range kids {
			b, _ := os.ReadFile(k)
			for _, f := range strings.Fields(string(b)) {
				if c, err := strconv.Atoi(f); err == nil {
					pids = append(pids, c)
				}
			}
		}
		for _, p := range pids {
			if _, err := os.Stat("/proc/" + strconv.Itoa(p)); err == nil && !alive(p) && !slices.Contains(z, p) {
				z = append(z, p)
			}
		}
	}
	return z
}
