package worker

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/corral-sandbox/corral/internal/idrange"
	"github.com/corral-sandbox/corral/internal/testenv"
	"github.com/corral-sandbox/corral/wire"
)

// machineOf returns the running machine of project id.
func (h *harness) machineOf(t testing.TB, id int64) MachineInfo {
	t.Helper()
	for _, m := range h.w.Machines() {
		if m.ProjectID == id {
			return m
		}
	}
	t.Fatalf("no machine for project %d", id)
	return MachineInfo{}
}

// sessionPids lists the host pids in the machine's cgroup that run as the
// guest user: not the init nor the pid namespace holders (guest root), nor
// a holder being spawned.
func sessionPids(t testing.TB, m MachineInfo) []int {
	t.Helper()
	var pids []int
	for _, pid := range machinePids(t, m) {
		if hostUID(pid) == int(m.HostUID)+GuestUID {
			pids = append(pids, pid)
		}
	}
	return pids
}

// hostUID returns the real uid of pid, or -1 if it is gone.
func hostUID(pid int) int {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return -1
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "Uid:"); ok {
			if f := strings.Fields(v); len(f) > 0 {
				uid, _ := strconv.Atoi(f[0])
				return uid
			}
		}
	}
	return -1
}

// holderPids lists the host pids of the machine's pid namespace holders.
func holderPids(t testing.TB, m MachineInfo) []int {
	t.Helper()
	var pids []int
	for _, pid := range machinePids(t, m) {
		if pid != m.InitPID && isHolder(pid) {
			pids = append(pids, pid)
		}
	}
	return pids
}

// machinePids lists the host pids in the machine's cgroup.
func machinePids(t testing.TB, m MachineInfo) []int {
	t.Helper()
	var pids []int
	for _, dir := range m.Cgroups {
		b, err := os.ReadFile(filepath.Join(dir, "cgroup.procs"))
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range strings.Fields(string(b)) {
			pid, _ := strconv.Atoi(f)
			if !slices.Contains(pids, pid) {
				pids = append(pids, pid)
			}
		}
	}
	return pids
}

// describe lists pids with their state, host uid and command line.
func describe(pids []int) string {
	var b strings.Builder
	for _, pid := range pids {
		st, _ := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
		var state, uid string
		for _, l := range strings.Split(string(st), "\n") {
			if v, ok := strings.CutPrefix(l, "State:"); ok {
				state = strings.TrimSpace(v)
			}
			if v, ok := strings.CutPrefix(l, "Uid:"); ok {
				uid = strings.Fields(v)[0]
			}
		}
		cmd, _ := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
		fmt.Fprintf(&b, "[%d %s uid %s %q]", pid, state, uid, cmd)
	}
	return b.String()
}

// isHolder reports whether pid is a pid namespace holder that has
// finished its exec and not exited.
// isHolder reports whether pid is PID 1 of a pid namespace nested in the
// host's (NSpid: ..., 1): in a machine's cgroup, the machine's init or a
// session namespace's holder.
func isHolder(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return false
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "NSpid:"); ok {
			f := strings.Fields(rest)
			return len(f) >= 3 && f[len(f)-1] == "1"
		}
	}
	return false
}

func alive(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	// A zombie has not been reaped yet but runs nothing.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i < 0 || i+2 >= len(s) || s[i+2] != 'Z'
}

func TestMachineIsolation(t *testing.T) {
	h := newHarness(t, nil)
	c := h.dial(t)
	p := h.project(t, 7)
	// The workspace belongs to an ordinary host user: inside it is the
	// guest user's, and what the guest writes is that user's on the host.
	const owner = 4242
	if err := os.Chown(p.Workspace, owner, owner); err != nil {
		t.Fatal(err)
	}

	t.Run("only stdio descriptors", func(t *testing.T) {
		// ls itself opens /proc/self/fd as descriptor 3.
		r := h.run(t, c, p, "ls", "-1", "/proc/self/fd")
		if r.code() != 0 || r.stdout != "0\n1\n2\n3\n" {
			t.Fatalf("descriptors in a session: %v", r)
		}
	})
	t.Run("unprivileged guest user", func(t *testing.T) {
		r := h.run(t, c, p, "sh", "-c", "id -u; id -g; grep CapEff /proc/self/status")
		if r.code() != 0 || !strings.HasPrefix(r.stdout, "1000\n1000\nCapEff:\t0000000000000000") {
			t.Fatalf("guest identity: %v", r)
		}
	})
	t.Run("host uid of the session is not root", func(t *testing.T) {
		run := h.start(t, c, p, "sleep", "100")
		m := h.machineOf(t, 7)
		var pids []int
		testenv.WaitFor(t, 10*time.Second, "sleep in the machine cgroup", func() bool {
			pids = sessionPids(t, m)
			if len(pids) != 1 {
				return false
			}
			comm, _ := os.ReadFile("/proc/" + strconv.Itoa(pids[0]) + "/comm")
			return string(comm) == "sleep\n" // exec'd, not a forked child between fork and exec
		})
		st, err := os.ReadFile("/proc/" + strconv.Itoa(pids[0]) + "/status")
		if err != nil {
			t.Fatal(err)
		}
		want := "Uid:\t" + strconv.Itoa(int(m.HostUID)+GuestUID)
		if !strings.Contains(string(st), want+"\t") {
			t.Errorf("host status of the session lacks %q:\n%s", want, st)
		}
		// Close-on-exec descriptors go late in execve, after comm changed:
		// wait for the exec to be complete (a real leak never goes away).
		var names []string
		deadline := time.Now().Add(2 * time.Second)
		for {
			fds, err := os.ReadDir("/proc/" + strconv.Itoa(pids[0]) + "/fd")
			if err != nil {
				t.Fatal(err)
			}
			names = names[:0]
			for _, e := range fds {
				names = append(names, e.Name())
			}
			if strings.Join(names, ",") == "0,1,2" || time.Now().After(deadline) {
				break
			}
			time.Sleep(time.Millisecond)
		}
		if strings.Join(names, ",") != "0,1,2" {
			t.Errorf("descriptors of the session seen from the host: %v", names)
		}
		if m.HostUID < idrange.Floor {
			t.Errorf("host uid base %d is privileged", m.HostUID)
		}
		if err := c.Send(&wire.ExecCancel{ID: run.id}); err != nil {
			t.Fatal(err)
		}
		if r := run.wait(t); r.exit.Signal != "SIGKILL" {
			t.Fatalf("cancelled sleep: %v", r)
		}
	})
	t.Run("root is guest root's, the host's /usr read-only", func(t *testing.T) {
		for path, want := range map[string]string{"/x": "Permission denied", "/etc/x": "Permission denied", "/usr/x": "Read-only file system"} {
			r := h.run(t, c, p, "touch", path)
			if r.code() == 0 || !strings.Contains(r.stderr, want) {
				t.Errorf("touch %s: %v", path, r)
			}
		}
	})
	t.Run("workspace is the project, writable, idmapped", func(t *testing.T) {
		if err := os.WriteFile(filepath.Join(p.Workspace, "from-host"), []byte("host"), 0o644); err != nil {
			t.Fatal(err)
		}
		r := h.run(t, c, p, "sh", "-c", "cat /workspace/from-host && echo guest > /workspace/from-guest && stat -c %u:%g /workspace && cd /home/corral && echo home > h && pwd")
		if r.code() != 0 || r.stdout != "host1000:1000\n/home/corral\n" {
			t.Fatalf("workspace: %v", r)
		}
		if !h.machineOf(t, 7).Idmapped {
			t.Error("workspace not idmapped on ext4")
		}
		var st unix.Stat_t
		if err := unix.Stat(filepath.Join(p.Workspace, "from-guest"), &st); err != nil {
			t.Fatal(err)
		}
		if st.Uid != owner || st.Gid != owner {
			t.Errorf("file written by the guest is owned by %d:%d on the host, want %d:%d", st.Uid, st.Gid, owner, owner)
		}
		b, _ := os.ReadFile(filepath.Join(p.Workspace, "from-guest"))
		if string(b) != "guest\n" {
			t.Errorf("host sees %q", b)
		}
	})
	t.Run("loopback only", func(t *testing.T) {
		r := h.run(t, c, p, "sh", "-c", "ls /sys/class/net; tail -n +3 /proc/net/dev | cut -d: -f1; cat /sys/class/net/lo/operstate /sys/class/net/lo/flags")
		fields := strings.Fields(r.stdout)
		if r.code() != 0 || len(fields) != 4 || fields[0] != "lo" || fields[1] != "lo" || fields[3] != "0x9" {
			t.Fatalf("network: %v", r)
		}
	})
	t.Run("hostname is the project's", func(t *testing.T) {
		r := h.run(t, c, p, "hostname")
		if r.stdout != "project-7\n" {
			t.Fatalf("hostname: %v", r)
		}
	})
	t.Run("fresh proc and minimal dev", func(t *testing.T) {
		// PID 1 of the session's /proc is its holder, not the machine's
		// init (see TestSessionProc).
		r := h.run(t, c, p, "sh", "-c", "ls /dev | tr '\\n' ' '; echo; cat /proc/1/cmdline | tr '\\0' ' '")
		if r.code() != 0 || !strings.HasPrefix(r.stdout, "fd full null ptmx pts random shm stderr stdin stdout tty urandom zero \n") ||
			strings.Contains(r.stdout, initArg) || !strings.Contains(r.stdout, "sleep infinity") {
			t.Fatalf("/dev and /proc: %v", r)
		}
	})
}

func TestExitReporting(t *testing.T) {
	h := newHarness(t, nil)
	c := h.dial(t)
	p := h.project(t, 1)
	t.Run("code", func(t *testing.T) {
		r := h.run(t, c, p, "sh", "-c", "echo out; echo err >&2; exit 3")
		if r.code() != 3 || r.exit.Signal != "" || r.exit.NotStarted || r.stdout != "out\n" || r.stderr != "err\n" {
			t.Fatalf("%v", r)
		}
	})
	t.Run("stdin", func(t *testing.T) {
		run := h.start(t, c, p, "cat")
		if _, err := run.stdinW.WriteString("through\n"); err != nil {
			t.Fatal(err)
		}
		if r := run.wait(t); r.stdout != "through\n" || r.code() != 0 {
			t.Fatalf("%v", r)
		}
	})
	t.Run("stdio is blocking", func(t *testing.T) {
		// The harness's pipes come from os.Pipe, which Go makes non-blocking.
		r := h.run(t, c, p, "python3", "-c", "import os; print([os.get_blocking(i) for i in range(3)])")
		if r.stdout != "[True, True, True]\n" {
			t.Fatalf("%v", r)
		}
	})
	t.Run("missing program is not started", func(t *testing.T) {
		r := h.run(t, c, p, "no-such-program-anywhere")
		if r.started || !r.exit.NotStarted || r.exit.Code != nil || !strings.Contains(r.exit.Message, "not found") {
			t.Fatalf("%v", r)
		}
	})
	t.Run("not executable is not started", func(t *testing.T) {
		if err := os.WriteFile(filepath.Join(p.Workspace, "script"), []byte("#!/bin/sh\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		r := h.run(t, c, p, "/workspace/script")
		if r.started || !r.exit.NotStarted || r.exit.Code != nil || !strings.Contains(r.exit.Message, "permission denied") {
			t.Fatalf("%v", r)
		}
	})
	t.Run("missing cwd is not started", func(t *testing.T) {
		id := newID()
		if err := c.Send(&wire.ExecStart{ID: id, Project: p, Argv: []string{"true"}, Cwd: "/workspace/nope"}); err != nil {
			t.Fatal(err)
		}
		if _, ok := recv(t, c).(*wire.ExecAccepted); !ok {
			t.Fatal("not accepted")
		}
		null, _ := os.Open(os.DevNull)
		defer null.Close()
		if err := c.Send(&wire.ExecAttach{ID: id}, null, null, null); err != nil {
			t.Fatal(err)
		}
		exit, ok := recv(t, c).(*wire.ExecExit)
		if !ok || !exit.NotStarted || !strings.Contains(exit.Message, "/workspace/nope") {
			t.Fatalf("%#v", exit)
		}
	})
}

func TestCancelKillsWholeTree(t *testing.T) {
	h := newHarness(t, nil)
	c := h.dial(t)
	p := h.project(t, 1)
	run := h.start(t, c, p, "sh", "-c", "sleep 100 & sleep 100 & (sleep 100 &) ; sleep 100")
	if !run.started {
		t.Fatalf("not started: %#v", run.first)
	}
	m := h.machineOf(t, 1)
	var pids []int
	testenv.WaitFor(t, 10*time.Second, "sh and four sleeps", func() bool { pids = sessionPids(t, m); return len(pids) == 5 })
	if err := c.Send(&wire.ExecCancel{ID: run.id}); err != nil {
		t.Fatal(err)
	}
	// Idempotent: a second cancel changes nothing and sends nothing more.
	if err := c.Send(&wire.ExecCancel{ID: run.id}); err != nil {
		t.Fatal(err)
	}
	r := run.wait(t)
	if r.exit.Signal != "SIGKILL" || r.exit.Code != nil {
		t.Fatalf("cancelled: %v", r)
	}
	for _, pid := range pids {
		if alive(pid) {
			t.Errorf("pid %d survived the cancel", pid)
		}
	}
	if left := sessionPids(t, m); len(left) != 0 {
		t.Errorf("left in the machine cgroup: %s", describe(left))
	}
	// The connection is still usable: a cancel of an ended session is ignored.
	if err := c.Send(&wire.Ping{ID: "after"}); err != nil {
		t.Fatal(err)
	}
	if pong, ok := recv(t, c).(*wire.Pong); !ok || pong.ID != "after" {
		t.Fatalf("want pong, got %#v", pong)
	}
}

func TestSessionEndKillsLeftovers(t *testing.T) {
	h := newHarness(t, nil)
	c := h.dial(t)
	p := h.project(t, 1)
	r := h.run(t, c, p, "sh", "-c", "setsid sleep 100 & nohup sleep 100 >/dev/null 2>&1 & exit 0")
	if r.code() != 0 {
		t.Fatalf("%v", r)
	}
	m := h.machineOf(t, 1)
	if left := sessionPids(t, m); len(left) != 0 {
		t.Errorf("processes left behind after the session ended: %s", describe(left))
	}
}

func TestClosedConnectionCancelsSessions(t *testing.T) {
	h := newHarness(t, nil)
	c := h.dial(t)
	p := h.project(t, 1)
	run := h.start(t, c, p, "sleep", "100")
	pending := &wire.ExecStart{ID: "pending", Project: p, Argv: []string{"true"}}
	if err := c.Send(pending); err != nil {
		t.Fatal(err)
	}
	if _, ok := recv(t, c).(*wire.ExecAccepted); !ok {
		t.Fatal("not accepted")
	}
	m := h.machineOf(t, 1)
	testenv.WaitFor(t, 10*time.Second, "sleep running", func() bool { return len(sessionPids(t, m)) == 1 })
	pid := sessionPids(t, m)[0]
	c.Close()
	testenv.WaitFor(t, 10*time.Second, "sleep killed", func() bool { return !alive(pid) })
	testenv.WaitFor(t, 10*time.Second, "sessions released", func() bool { return h.machineOf(t, 1).Sessions == 0 })
	run.stdinW.Close()
	<-run.out
	<-run.errOut
}

func TestForkBombStaysBounded(t *testing.T) {
	const pidsMax = 64
	h := newHarness(t, func(c *Config) { c.Limits.Pids = pidsMax })
	c := h.dial(t)
	p := h.project(t, 1)
	// Every loop iteration leaves a process behind, until forks fail; the
	// session then lives on without forking.
	run := h.start(t, c, p, "sh", "-c", "(while :; do sleep 100 & done); exec sleep 100")
	m := h.machineOf(t, 1)
	pidsDir := ""
	for _, d := range m.Cgroups {
		if _, err := os.Stat(filepath.Join(d, "pids.max")); err == nil {
			pidsDir = d
		}
	}
	if pidsDir == "" {
		t.Fatal("no pids cgroup")
	}
	limit, _ := os.ReadFile(filepath.Join(pidsDir, "pids.max"))
	if strings.TrimSpace(string(limit)) != strconv.Itoa(pidsMax) {
		t.Fatalf("pids.max = %q", limit)
	}
	peak := 0
	deadline := time.Now().Add(time.Second)
	for time.Now().Before(deadline) {
		b, _ := os.ReadFile(filepath.Join(pidsDir, "pids.current"))
		n, _ := strconv.Atoi(strings.TrimSpace(string(b)))
		peak = max(peak, n)
		time.Sleep(20 * time.Millisecond)
	}
	if peak > pidsMax {
		t.Errorf("machine reached %d tasks, limit %d", peak, pidsMax)
	}
	if peak < pidsMax/2 {
		t.Errorf("fork bomb only reached %d tasks; did it run?", peak)
	}
	// The host can still fork.
	if err := exec.Command("true").Run(); err != nil {
		t.Errorf("host fork during the bomb: %v", err)
	}
	// The worker still answers, the machine still runs commands.
	if err := c.Send(&wire.Ping{ID: "p"}); err != nil {
		t.Fatal(err)
	}
	if msg := recv(t, c); msg.Type() != wire.TypePong {
		t.Fatalf("no pong during the fork bomb: %#v", msg)
	}
	if err := c.Send(&wire.ExecCancel{ID: run.id}); err != nil {
		t.Fatal(err)
	}
	if r := run.wait(t); r.exit.Signal != "SIGKILL" || !strings.Contains(r.stderr, "Cannot fork") {
		t.Fatalf("bomb: %v", r)
	}
	if left := sessionPids(t, m); len(left) != 0 {
		t.Errorf("bomb left %d processes: %s", len(left), describe(left))
	}
	if r := h.run(t, c, p, "echo", "alive"); r.stdout != "alive\n" {
		t.Fatalf("after the bomb: %v", r)
	}
}

func TestMemoryHogKilledBySignal(t *testing.T) {
	h := newHarness(t, func(c *Config) { c.Limits.Memory = 96 << 20 })
	c := h.dial(t)
	p := h.project(t, 1)
	h.run(t, c, p, "true")
	init := h.machineOf(t, 1).InitPID
	r := h.run(t, c, p, "python3", "-c", "b = bytearray(2 << 30); print('survived')")
	if r.exit.Signal != "SIGKILL" || r.exit.Code != nil || strings.Contains(r.stdout, "survived") || !r.exit.OOMKilled {
		t.Fatalf("memory hog: %v", r)
	}
	// A SIGKILL that is not the OOM killer's says nothing of it.
	if r := h.run(t, c, p, "sh", "-c", "kill -9 $$"); r.exit.Signal != "SIGKILL" || r.exit.OOMKilled {
		t.Fatalf("kill -9: %v", r)
	}
	if r := h.run(t, c, p, "echo", "alive"); r.stdout != "alive\n" {
		t.Fatalf("after the hog: %v", r)
	}
	if h.machineOf(t, 1).InitPID != init {
		t.Fatal("the OOM kill took the machine's init")
	}
}

func TestMachineReusedThenStoppedWhenIdle(t *testing.T) {
	h := newHarness(t, func(c *Config) { c.IdleGrace = 300 * time.Millisecond })
	c := h.dial(t)
	p := h.project(t, 3)
	r1 := h.run(t, c, p, "sh", "-c", "echo $PPID")
	first := h.machineOf(t, 3)
	r2 := h.run(t, c, p, "sh", "-c", "echo $PPID")
	second := h.machineOf(t, 3)
	if first.InitPID != second.InitPID {
		t.Fatalf("machine not reused: init %d then %d", first.InitPID, second.InitPID)
	}
	// Seen from inside, the parent of a session is a process of the same
	// machine's pid namespace (the init).
	if r1.stdout != "0\n" || r2.stdout != "0\n" {
		t.Logf("PPID inside: %q %q", r1.stdout, r2.stdout)
	}
	testenv.WaitFor(t, 10*time.Second, "idle stop", func() bool { return len(h.w.Machines()) == 0 })
	testenv.WaitFor(t, 10*time.Second, "init gone", func() bool { return !alive(first.InitPID) })
	for _, d := range first.Cgroups {
		testenv.WaitFor(t, 10*time.Second, "cgroup removed", func() bool { _, err := os.Stat(d); return errors.Is(err, os.ErrNotExist) })
	}
	// A new command starts a new machine.
	h.run(t, c, p, "true")
	if third := h.machineOf(t, 3); third.InitPID == first.InitPID {
		t.Fatal("stopped machine reused")
	}
}

func TestShutdownStopsMachines(t *testing.T) {
	h := newHarness(t, nil)
	c := h.dial(t)
	h.run(t, c, h.project(t, 1), "true")
	h.run(t, c, h.project(t, 2), "true")
	ms := h.w.Machines()
	if len(ms) != 2 || ms[0].HostUID == ms[1].HostUID {
		t.Fatalf("machines: %+v", ms)
	}
	if ms[1].HostUID-ms[0].HostUID < RangeSize && ms[0].HostUID-ms[1].HostUID < RangeSize {
		t.Fatalf("overlapping id ranges: %+v", ms)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := h.w.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	for _, m := range ms {
		if alive(m.InitPID) {
			t.Errorf("init %d alive after Shutdown", m.InitPID)
		}
		for _, d := range m.Cgroups {
			if _, err := os.Stat(d); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("cgroup %s left: %v", d, err)
			}
		}
	}
	if len(h.w.Machines()) != 0 {
		t.Error("machines listed after Shutdown")
	}
}

func TestNetDial(t *testing.T) {
	h := newHarness(t, nil)
	c := h.dial(t)
	p := h.project(t, 1)
	// No machine, nothing listening: a dial starts none.
	if err := c.Send(&wire.NetDial{ID: "early", Project: p, Port: 8000}); err != nil {
		t.Fatal(err)
	}
	if e, ok := recv(t, c).(*wire.Error); !ok || e.Code != wire.CodeDialFailed {
		t.Fatalf("dial without a machine: %#v", e)
	}
	if n := len(h.w.Machines()); n != 0 {
		t.Fatalf("net-dial started %d machines", n)
	}
	srv := h.start(t, c, p, "python3", "-m", "http.server", "--bind", "127.0.0.1", "8000")
	if !srv.started {
		t.Fatalf("server not started: %#v", srv.first)
	}
	// The port is the machine's: the host's loopback does not have it.
	if conn, err := net.Dial("tcp", "127.0.0.1:8000"); err == nil {
		conn.Close()
		t.Log("something listens on the host's 127.0.0.1:8000 too; skipping that check")
	}
	var sock *os.File
	testenv.WaitFor(t, 10*time.Second, "net-dial to the server", func() bool {
		if err := c.Send(&wire.NetDial{ID: "d", Project: p, Port: 8000}); err != nil {
			t.Fatal(err)
		}
		_ = c.UnixConn().SetReadDeadline(time.Now().Add(10 * time.Second))
		m, files, err := c.Recv()
		if err != nil {
			t.Fatal(err)
		}
		switch m := m.(type) {
		case *wire.NetDialed:
			sock = files[0]
			return true
		case *wire.Error:
			if m.Code != wire.CodeDialFailed || m.ID != "d" {
				t.Fatalf("net-dial: %#v", m)
			}
			return false
		default:
			t.Fatalf("net-dial: %#v", m)
		}
		return false
	})
	defer sock.Close()
	if _, err := sock.WriteString("GET / HTTP/1.0\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(sock).ReadString('\n')
	if err != nil || !strings.HasPrefix(line, "HTTP/1.0 200") {
		t.Fatalf("response %q, %v", line, err)
	}
	// A closed port fails cleanly.
	if err := c.Send(&wire.NetDial{ID: "closed", Project: p, Port: 8001}); err != nil {
		t.Fatal(err)
	}
	if e, ok := recv(t, c).(*wire.Error); !ok || e.Code != wire.CodeDialFailed || e.ID != "closed" {
		t.Fatalf("dial to a closed port: %#v", e)
	}
	if err := c.Send(&wire.ExecCancel{ID: srv.id}); err != nil {
		t.Fatal(err)
	}
	srv.wait(t)
}

func TestPing(t *testing.T) {
	h := newHarness(t, nil)
	c := h.dial(t)
	if err := c.Send(&wire.Ping{ID: "42"}); err != nil {
		t.Fatal(err)
	}
	if m, ok := recv(t, c).(*wire.Pong); !ok || m.ID != "42" {
		t.Fatalf("got %#v", m)
	}
}

func TestRejections(t *testing.T) {
	h := newHarness(t, func(c *Config) { c.MaxSessions = 2 })
	c := h.dial(t)
	p := h.project(t, 1)
	outside := t.TempDir()
	link := filepath.Join(h.root, "escape")
	if err := os.Symlink(outside, link); err != nil {
		t.Fatal(err)
	}
	start := func(id string, p wire.Project, argv []string, cwd string, env map[string]string) wire.Message {
		t.Helper()
		if err := c.Send(&wire.ExecStart{ID: id, Project: p, Argv: argv, Cwd: cwd, Env: env}); err != nil {
			t.Fatal(err)
		}
		return recv(t, c)
	}
	tests := []struct {
		name string
		p    wire.Project
		argv []string
		cwd  string
		env  map[string]string
		code string
	}{
		{"workspace outside the root", wire.Project{ID: 9, Workspace: outside}, []string{"true"}, "/workspace", nil, wire.CodeBadWorkspace},
		{"workspace relative", wire.Project{ID: 9, Workspace: "p1"}, []string{"true"}, "/workspace", nil, wire.CodeBadWorkspace},
		{"workspace escaping through a symlink", wire.Project{ID: 9, Workspace: link}, []string{"true"}, "/workspace", nil, wire.CodeBadWorkspace},
		{"workspace with dot-dot", wire.Project{ID: 9, Workspace: p.Workspace + "/../.."}, []string{"true"}, "/workspace", nil, wire.CodeBadWorkspace},
		{"workspace is the root", wire.Project{ID: 9, Workspace: h.root}, []string{"true"}, "/workspace", nil, wire.CodeBadWorkspace},
		{"workspace missing", wire.Project{ID: 9, Workspace: h.root + "/nope"}, []string{"true"}, "/workspace", nil, wire.CodeBadWorkspace},
		{"cwd relative", p, []string{"true"}, "workspace", nil, wire.CodeBadCwd},
		{"cwd escaping", p, []string{"true"}, "/workspace/../etc", nil, wire.CodeBadCwd},
		{"cwd elsewhere", p, []string{"true"}, "/etc", nil, wire.CodeBadCwd},
		{"cwd not clean", p, []string{"true"}, "/workspace/", nil, wire.CodeBadCwd},
		{"cwd prefix only", p, []string{"true"}, "/workspacex", nil, wire.CodeBadCwd},
		{"empty argv", p, nil, "/workspace", nil, wire.CodeBadArgv},
		{"empty program", p, []string{""}, "/workspace", nil, wire.CodeBadArgv},
		{"NUL in argv", p, []string{"echo", "a\x00b"}, "/workspace", nil, wire.CodeBadArgv},
		{"env name with =", p, []string{"true"}, "/workspace", map[string]string{"A=B": "c"}, wire.CodeBadEnv},
		{"empty env name", p, []string{"true"}, "/workspace", map[string]string{"": "c"}, wire.CodeBadEnv},
		{"NUL in env", p, []string{"true"}, "/workspace", map[string]string{"A": "\x00"}, wire.CodeBadEnv},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := start("r", tt.p, tt.argv, tt.cwd, tt.env)
			rej, ok := m.(*wire.ExecRejected)
			if !ok || rej.Code != tt.code || rej.ID != "r" {
				t.Fatalf("want exec-rejected %s, got %#v", tt.code, m)
			}
		})
	}
	if n := len(h.w.Machines()); n != 0 {
		t.Errorf("rejected requests started %d machines", n)
	}
	t.Run("duplicate id and too many sessions", func(t *testing.T) {
		if _, ok := start("a", p, []string{"true"}, "", nil).(*wire.ExecAccepted); !ok {
			t.Fatal("a not accepted")
		}
		if m, ok := start("a", p, []string{"true"}, "", nil).(*wire.ExecRejected); !ok || m.Code != wire.CodeDuplicateID {
			t.Fatalf("duplicate: %#v", m)
		}
		if _, ok := start("b", p, []string{"true"}, "", nil).(*wire.ExecAccepted); !ok {
			t.Fatal("b not accepted")
		}
		if m, ok := start("c", p, []string{"true"}, "", nil).(*wire.ExecRejected); !ok || m.Code != wire.CodeTooManySessions {
			t.Fatalf("third session: %#v", m)
		}
		// Cancelling a session that was never attached ends it without
		// running anything, and frees its slot.
		if err := c.Send(&wire.ExecCancel{ID: "a"}); err != nil {
			t.Fatal(err)
		}
		if m, ok := recv(t, c).(*wire.ExecExit); !ok || !m.NotStarted || m.ID != "a" {
			t.Fatalf("cancel before attach: %#v", m)
		}
		if _, ok := start("c", p, []string{"true"}, "", nil).(*wire.ExecAccepted); !ok {
			t.Fatal("c not accepted after a freed its slot")
		}
	})
	t.Run("attach to an unknown session", func(t *testing.T) {
		r, w, err := os.Pipe()
		if err != nil {
			t.Fatal(err)
		}
		defer r.Close()
		if err := c.Send(&wire.ExecAttach{ID: "nope"}, w, w, w); err != nil {
			t.Fatal(err)
		}
		w.Close()
		if m, ok := recv(t, c).(*wire.Error); !ok || m.Code != wire.CodeUnknownSession || m.ID != "nope" {
			t.Fatalf("%#v", m)
		}
		// The worker kept no copy of the descriptors.
		if n, err := r.Read(make([]byte, 1)); n != 0 || err != io.EOF {
			t.Fatalf("pipe still open in the worker: %d, %v", n, err)
		}
	})
}

// rawConn is a client that can send anything.
func rawConn(t *testing.T, h *harness, hello bool) *net.UnixConn {
	t.Helper()
	nc, err := net.Dial("unixpacket", h.sock)
	if err != nil {
		t.Fatal(err)
	}
	uc := nc.(*net.UnixConn)
	if hello {
		if _, err := uc.Write([]byte(`{"type":"hello","protocol":2}`)); err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(readPacket(t, uc), `"hello"`) {
			t.Fatal("no hello")
		}
	}
	return uc
}

func readPacket(t *testing.T, uc *net.UnixConn) string {
	t.Helper()
	_ = uc.SetReadDeadline(time.Now().Add(10 * time.Second))
	b := make([]byte, 1<<17)
	n, err := uc.Read(b)
	if err != nil {
		return "ERR:" + err.Error()
	}
	return string(b[:n])
}

func openFDs(t *testing.T) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	return len(ents)
}

func TestProtocolViolations(t *testing.T) {
	h := newHarness(t, nil)
	t.Run("protocol 1 refused", func(t *testing.T) {
		c, err := wire.Dial(context.Background(), h.sock)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if err := c.Send(&wire.Hello{Protocol: 1}); err != nil {
			t.Fatal(err)
		}
		if m, ok := recv(t, c).(*wire.Error); !ok || m.Code != wire.CodeUnsupportedProtocol {
			t.Fatalf("%#v", m)
		}
		if _, _, err := c.Recv(); !errors.Is(err, io.EOF) {
			t.Fatalf("connection not closed: %v", err)
		}
	})
	tests := []struct {
		name   string
		packet []byte
		fds    int // pipe write ends sent along
		code   string
	}{
		{"not json", []byte("hello there"), 0, wire.CodeBadFrame},
		{"not an object", []byte(`[1,2]`), 0, wire.CodeBadFrame},
		{"unknown type", []byte(`{"type":"launch-missiles"}`), 0, wire.CodeUnknownType},
		{"oversized", append(append([]byte(`{"type":"ping","id":"`), make([]byte, wire.MaxFrame+100)...), '"', '}'), 0, wire.CodeTooLarge},
		{"too few fds", []byte(`{"type":"exec-attach","id":"x","fds":3}`), 2, wire.CodeFDMismatch},
		{"undeclared fds", []byte(`{"type":"ping","id":"x"}`), 1, wire.CodeFDMismatch},
		{"fds on a type without", []byte(`{"type":"exec-cancel","id":"x","fds":1}`), 1, wire.CodeFDMismatch},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := openFDs(t)
			uc := rawConn(t, h, true)
			var readEnds, writeEnds []*os.File
			var oob []byte
			if tt.fds > 0 {
				var fds []int
				for range tt.fds {
					r, w, err := os.Pipe()
					if err != nil {
						t.Fatal(err)
					}
					readEnds = append(readEnds, r)
					writeEnds = append(writeEnds, w)
					fds = append(fds, int(w.Fd()))
				}
				oob = unix.UnixRights(fds...)
			}
			_, _, err := uc.WriteMsgUnix(tt.packet, oob, nil)
			for _, w := range writeEnds {
				w.Close()
			}
			if err != nil {
				t.Fatal(err)
			}
			got := readPacket(t, uc)
			if !strings.Contains(got, `"type":"error"`) || !strings.Contains(got, `"code":"`+tt.code+`"`) {
				t.Fatalf("want error %s, got %s", tt.code, got)
			}
			if got := readPacket(t, uc); !strings.HasPrefix(got, "ERR:EOF") && got != "" {
				t.Fatalf("connection not closed after the error: %q", got)
			}
			uc.Close()
			// Our copies are closed; the worker must have closed its own:
			// every read end sees EOF.
			for _, r := range readEnds {
				_ = r.SetReadDeadline(time.Now().Add(5 * time.Second))
				if n, err := r.Read(make([]byte, 1)); n != 0 || err != io.EOF {
					t.Errorf("a descriptor sent with the bad frame is still open in the worker: %d, %v", n, err)
				}
				r.Close()
			}
			// And the worker process holds no more descriptors than before.
			testenv.WaitFor(t, 10*time.Second, "descriptor count back to baseline", func() bool { return openFDs(t) <= before })
		})
	}
	t.Run("frames a client does not send", func(t *testing.T) {
		uc := rawConn(t, h, true)
		defer uc.Close()
		if _, err := uc.Write([]byte(`{"type":"exec-exit","id":"x","code":0}`)); err != nil {
			t.Fatal(err)
		}
		if got := readPacket(t, uc); !strings.Contains(got, `"type":"error"`) {
			t.Fatalf("got %s", got)
		}
	})
	t.Run("no hello first", func(t *testing.T) {
		uc := rawConn(t, h, false)
		defer uc.Close()
		if _, err := uc.Write([]byte(`{"type":"ping"}`)); err != nil {
			t.Fatal(err)
		}
		if got := readPacket(t, uc); !strings.Contains(got, `"type":"error"`) {
			t.Fatalf("got %s", got)
		}
	})
}

func TestPipelinedAttach(t *testing.T) {
	h := newHarness(t, nil)
	c := h.dial(t)
	p := h.project(t, 1)
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	null, err := os.Open(os.DevNull)
	if err != nil {
		t.Fatal(err)
	}
	defer null.Close()
	// Accepted: start and attach sent back to back.
	if err := c.Send(&wire.ExecStart{ID: "ok", Project: p, Argv: []string{"echo", "piped"}}); err != nil {
		t.Fatal(err)
	}
	if err := c.Send(&wire.ExecAttach{ID: "ok"}, null, w, w); err != nil {
		t.Fatal(err)
	}
	w.Close()
	for _, want := range []string{wire.TypeExecAccepted, wire.TypeExecStarted, wire.TypeExecExit} {
		if m := recv(t, c); m.Type() != want {
			t.Fatalf("want %s, got %#v", want, m)
		}
	}
	if out, _ := io.ReadAll(r); string(out) != "piped\n" {
		t.Fatalf("stdout %q", out)
	}
	// Rejected: the attach that follows is refused and its descriptors
	// closed.
	if err := c.Send(&wire.ExecStart{ID: "bad", Project: p, Argv: []string{"true"}, Cwd: "/etc"}); err != nil {
		t.Fatal(err)
	}
	if err := c.Send(&wire.ExecAttach{ID: "bad"}, null, null, null); err != nil {
		t.Fatal(err)
	}
	if m, ok := recv(t, c).(*wire.ExecRejected); !ok || m.Code != wire.CodeBadCwd {
		t.Fatalf("%#v", m)
	}
	if m, ok := recv(t, c).(*wire.Error); !ok || m.Code != wire.CodeUnknownSession || m.ID != "bad" {
		t.Fatalf("%#v", m)
	}
}

func TestMachineDeathEndsSessions(t *testing.T) {
	h := newHarness(t, nil)
	c := h.dial(t)
	p := h.project(t, 1)
	run := h.start(t, c, p, "sleep", "100")
	m := h.machineOf(t, 1)
	if err := syscall.Kill(m.InitPID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	// The exit was not observed: an error frame ends the session, no
	// invented exec-exit.
	if e, ok := recv(t, c).(*wire.Error); !ok || e.Code != wire.CodeMachineFailed || e.ID != run.id {
		t.Fatalf("%#v", e)
	}
	run.stdinW.Close()
	<-run.out
	<-run.errOut
	for _, d := range m.Cgroups {
		testenv.WaitFor(t, 10*time.Second, "dead machine's cgroup removed", func() bool { _, err := os.Stat(d); return errors.Is(err, os.ErrNotExist) })
	}
	if r := h.run(t, c, p, "echo", "again"); r.stdout != "again\n" {
		t.Fatalf("after the machine died: %v", r)
	}
	if h.machineOf(t, 1).InitPID == m.InitPID {
		t.Fatal("dead machine reused")
	}
}

func TestMachineStartFailure(t *testing.T) {
	h := newHarness(t, func(c *Config) { c.SelfExe = "/bin/false" })
	c := h.dial(t)
	p := h.project(t, 1)
	if err := c.Send(&wire.ExecStart{ID: "x", Project: p, Argv: []string{"true"}}); err != nil {
		t.Fatal(err)
	}
	if m, ok := recv(t, c).(*wire.ExecRejected); !ok || m.Code != wire.CodeMachineFailed {
		t.Fatalf("%#v", m)
	}
	if n := len(h.w.Machines()); n != 0 {
		t.Fatalf("%d machines after a failed start", n)
	}
	// Nothing is left in the cgroup parent.
	own, err := ownCgroup("pids")
	if err != nil {
		t.Skip(err)
	}
	ents, _ := os.ReadDir(filepath.Join("/sys/fs/cgroup/pids", own, h.w.cfg.CgroupParent))
	for _, e := range ents {
		if e.IsDir() {
			t.Errorf("cgroup %s left after a failed start", e.Name())
		}
	}
}

func TestTooManyProjects(t *testing.T) {
	h := newHarness(t, func(c *Config) { c.MaxProjects = 8; c.IdleGrace = time.Millisecond })
	c := h.dial(t)
	for id := int64(1); id <= 8; id++ {
		if r := h.run(t, c, h.project(t, id), "true"); r.code() != 0 {
			t.Fatalf("project %d: %v", id, r)
		}
	}
	if err := c.Send(&wire.ExecStart{ID: "x", Project: h.project(t, 9), Argv: []string{"true"}}); err != nil {
		t.Fatal(err)
	}
	if m, ok := recv(t, c).(*wire.ExecRejected); !ok || m.Code != wire.CodeMachineFailed || !strings.Contains(m.Message, "too-many-projects") {
		t.Fatalf("ninth project: %#v", m)
	}
	// Discarding a project frees its slot for the ninth.
	if err := h.w.ForgetProject(3); err != nil {
		t.Fatal(err)
	}
	if r := h.run(t, c, h.project(t, 9), "true"); r.code() != 0 {
		t.Fatalf("ninth project after a discard: %v", r)
	}
	if _, err := New(Config{ProjectsRoot: h.root, StateDir: t.TempDir(), UIDBase: 1000}); err == nil {
		t.Fatal("UIDBase 1000 accepted")
	}
}

func TestOtherProjectsHidden(t *testing.T) {
	requireRoot(t)
	// A projects root on the host's root filesystem (not under /tmp, which
	// machines never see anyway).
	root, err := os.MkdirTemp("/var/tmp", "corral-projects-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(root)
	if err := os.Chmod(root, 0o755); err != nil {
		t.Fatal(err)
	}
	h := newHarness(t, func(c *Config) { c.ProjectsRoot = root })
	c := h.dial(t)
	h.root = root
	p1, p2 := h.project(t, 1), h.project(t, 2)
	if err := os.WriteFile(filepath.Join(p2.Workspace, "secret"), []byte("p2"), 0o644); err != nil {
		t.Fatal(err)
	}
	r := h.run(t, c, p1, "sh", "-c", "ls -A "+root+"; cat "+p2.Workspace+"/secret; ls -A "+h.w.cfg.HomesRoot)
	if r.stdout != "" || !strings.Contains(r.stderr, "No such file") {
		t.Fatalf("another project is visible: %v", r)
	}
}

func TestNoSetIDFilesInWorkspace(t *testing.T) {
	h := newHarness(t, nil)
	c := h.dial(t)
	p := h.project(t, 1)
	const owner = 4242 // idmapped: what the guest writes is this user's
	if err := os.Chown(p.Workspace, owner, owner); err != nil {
		t.Fatal(err)
	}
	r := h.run(t, c, p, "sh", "-c", `
		cd /workspace && echo x > f && chmod 755 f && echo chmod-ok
		chmod u+s f 2>/dev/null || echo suid-refused
		chmod g+s f 2>/dev/null || echo sgid-refused
		python3 -c 'import os; os.open("g", os.O_CREAT|os.O_WRONLY, 0o4755)' 2>/dev/null || echo open-refused
		python3 -c 'import os; os.mknod("n", 0o104755)' 2>/dev/null || echo mknod-refused
		mkdir d && echo mkdir-ok`)
	want := "chmod-ok\nsuid-refused\nsgid-refused\nopen-refused\nmknod-refused\nmkdir-ok\n"
	if r.stdout != want {
		t.Fatalf("%v", r)
	}
	var st unix.Stat_t
	if err := unix.Stat(filepath.Join(p.Workspace, "f"), &st); err != nil {
		t.Fatal(err)
	}
	if st.Mode&(unix.S_ISUID|unix.S_ISGID) != 0 || st.Uid != owner {
		t.Fatalf("host sees mode %o owner %d", st.Mode, st.Uid)
	}
	if _, err := os.Stat(filepath.Join(p.Workspace, "g")); err == nil {
		t.Fatal("set-uid open created a file")
	}
}

// TestWorkspaceOwnership: no guest id writes as host root. A root-owned
// workspace is bound as is (the guest's files belong to the guest user's
// host id, root's show as the overflow id); with OwnWorkspaces it is first
// given to the guest user's host id; the home is the guest user's host
// id's.
func TestWorkspaceOwnership(t *testing.T) {
	for _, own := range []bool{false, true} {
		t.Run(map[bool]string{false: "root-owned", true: "owned by the worker"}[own], func(t *testing.T) {
			h := newHarness(t, func(c *Config) { c.OwnWorkspaces = own })
			c := h.dial(t)
			p := h.project(t, 1)
			if err := os.Chmod(p.Workspace, 0o777); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(p.Workspace, "root-file"), []byte("x"), 0o644); err != nil {
				t.Fatal(err)
			}
			r := h.run(t, c, p, "sh", "-c", "echo g > /workspace/guest-file && echo h > /home/corral/h && stat -c %u /workspace/root-file")
			m := h.machineOf(t, 1)
			wantInside := "65534\n"
			if own {
				wantInside = "1000\n"
			}
			if r.code() != 0 || r.stdout != wantInside {
				t.Fatalf("%v", r)
			}
			if m.Idmapped {
				t.Error("a root-owned workspace was idmapped")
			}
			guest := m.HostUID + GuestUID
			for _, f := range []string{filepath.Join(p.Workspace, "guest-file"), filepath.Join(h.w.cfg.HomesRoot, "1", "h"), filepath.Join(h.w.cfg.HomesRoot, "1")} {
				var st unix.Stat_t
				if err := unix.Lstat(f, &st); err != nil {
					t.Fatal(err)
				}
				if st.Uid != guest || st.Gid != guest {
					t.Errorf("%s owned by %d:%d on the host, want the guest user's host id %d", f, st.Uid, st.Gid, guest)
				}
			}
			var st unix.Stat_t
			if err := unix.Lstat(filepath.Join(p.Workspace, "root-file"), &st); err != nil {
				t.Fatal(err)
			}
			if own != (st.Uid == guest) {
				t.Errorf("the workspace's root file is owned by %d with OwnWorkspaces=%v", st.Uid, own)
			}
		})
	}
}

func TestWorkerDeathStopsMachines(t *testing.T) {
	requireRoot(t)
	root, err := filepath.EvalSymlinks(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(t.TempDir(), "w.sock")
	parent := fmt.Sprintf("corral-test-%d-killed", os.Getpid())
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "CORRAL_TEST_WORKER_SOCKET="+sock, "CORRAL_TEST_PROJECTS="+root,
		"CORRAL_TEST_STATE="+t.TempDir(), "CORRAL_TEST_CGROUP="+parent)
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	h := &harness{sock: sock, root: root}
	testenv.WaitFor(t, 10*time.Second, "worker listening", func() bool {
		// The socket exists once bound, a moment before it listens.
		nc, err := net.Dial("unixpacket", sock)
		if err == nil {
			nc.Close()
		}
		return err == nil
	})
	c := h.dial(t)
	p := h.project(t, 1)
	run := h.start(t, c, p, "sh", "-c", "sleep 100 & sleep 100")
	if !run.started {
		t.Fatalf("%#v", run.first)
	}
	own, err := ownCgroup("pids")
	if err != nil {
		t.Fatal(err)
	}
	parentDir := filepath.Join("/sys/fs/cgroup/pids", own, parent)
	var procs []string
	testenv.WaitFor(t, 10*time.Second, "init, sh, two sleeps and the holders", func() bool {
		b, _ := os.ReadFile(filepath.Join(parentDir, "machine-1.1", "cgroup.procs"))
		procs = strings.Fields(string(b))
		holders := 0
		for _, p := range procs {
			if n, _ := strconv.Atoi(p); isHolder(n) {
				holders++
			}
		}
		return len(procs)-holders == 4 && holders >= 2
	})
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	// The client sees the connection end.
	_ = c.UnixConn().SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, _, err := c.Recv(); err == nil {
		t.Fatal("connection alive after the worker died")
	}
	// The init saw its control channel close and exited: the kernel killed
	// the whole machine.
	for _, pid := range procs {
		n, _ := strconv.Atoi(pid)
		testenv.WaitFor(t, 10*time.Second, "machine process "+pid+" gone", func() bool { return !alive(n) })
	}
	run.stdinW.Close()
	<-run.out
	<-run.errOut
	// A new worker sweeps the dead one's cgroups.
	l := filepath.Join(parentDir, "machine-1.1")
	w, err := New(Config{ProjectsRoot: root, StateDir: t.TempDir(), CgroupParent: parent})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		_ = w.Shutdown(context.Background())
		for _, c := range []string{"memory", "pids"} {
			own, _ := ownCgroup(c)
			_ = os.Remove(filepath.Join("/sys/fs/cgroup", c, own, parent))
		}
	}()
	if _, err := os.Stat(l); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("stale machine cgroup left: %v", err)
	}
}

func TestWorkspaceWithoutIdmapping(t *testing.T) {
	h := newHarness(t, nil)
	c := h.dial(t)
	p := h.project(t, 1)
	// ramfs supports no idmapped mounts; the projects root is private (0700
	// t.TempDir), which the fallback must not need to traverse.
	if err := unix.Mount("ramfs", p.Workspace, "ramfs", 0, "mode=0777"); err != nil {
		t.Skip("cannot mount ramfs:", err)
	}
	defer unix.Unmount(p.Workspace, unix.MNT_DETACH)
	r := h.run(t, c, p, "sh", "-c", "echo x > /workspace/f && echo y > /home/corral/g && stat -c %u /workspace/f /home/corral/g")
	if r.code() != 0 || r.stdout != "1000\n1000\n" {
		t.Fatalf("%v", r)
	}
	m := h.machineOf(t, 1)
	if m.Idmapped {
		t.Fatal("ramfs reported idmapped")
	}
	var st unix.Stat_t
	if err := unix.Stat(filepath.Join(p.Workspace, "f"), &st); err != nil {
		t.Fatal(err)
	}
	if st.Uid != m.HostUID+GuestUID {
		t.Fatalf("file owned by %d on the host, want the guest user's host id %d", st.Uid, m.HostUID+GuestUID)
	}
}

func TestLargeCommandLine(t *testing.T) {
	h := newHarness(t, nil)
	p := h.project(t, 1)
	uc := rawConn(t, h, true)
	defer uc.Close()
	// Raw '<' characters, which Go's JSON would escape six times larger.
	arg := strings.Repeat("<", 60000)
	frame := fmt.Sprintf(`{"type":"exec-start","id":"big","project":{"id":1,"workspace":%q},"argv":["printf","%%s",%q]}`, p.Workspace, arg)
	if _, err := uc.Write([]byte(frame)); err != nil {
		t.Fatal(err)
	}
	if got := readPacket(t, uc); !strings.Contains(got, "exec-accepted") {
		t.Fatalf("got %s", got)
	}
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	null, _ := os.Open(os.DevNull)
	defer null.Close()
	_, _, err = uc.WriteMsgUnix([]byte(`{"type":"exec-attach","id":"big","fds":3}`), unix.UnixRights(int(null.Fd()), int(w.Fd()), int(w.Fd())), nil)
	w.Close()
	if err != nil {
		t.Fatal(err)
	}
	out, _ := io.ReadAll(r)
	if string(out) != arg {
		t.Fatalf("got %d bytes of output, want %d", len(out), len(arg))
	}
	for _, want := range []string{"exec-started", `"code":0`} {
		if got := readPacket(t, uc); !strings.Contains(got, want) {
			t.Fatalf("want %s, got %s", want, got)
		}
	}
}

func TestNoLeaksAcrossExecs(t *testing.T) {
	h := newHarness(t, nil)
	c := h.dial(t)
	p := h.project(t, 1)
	h.run(t, c, p, "true")
	initFDs := func() int {
		ents, err := os.ReadDir("/proc/" + strconv.Itoa(h.machineOf(t, 1).InitPID) + "/fd")
		if err != nil {
			t.Fatal(err)
		}
		return len(ents)
	}
	// The init holds descriptors for each ready pid namespace holder.
	testenv.WaitFor(t, 10*time.Second, "the holder pool full", func() bool { return len(holderPids(t, h.machineOf(t, 1))) >= 2 })
	time.Sleep(50 * time.Millisecond) // let an ordered holder land
	holders := len(holderPids(t, h.machineOf(t, 1)))
	workerFDs, inInit, goroutines := openFDs(t), initFDs(), runtime.NumGoroutine()
	for i := range 200 {
		r := h.run(t, c, p, "sh", "-c", "exit "+strconv.Itoa(i%3))
		if r.code() != i%3 {
			t.Fatalf("exec %d: %v", i, r)
		}
	}
	// Cancelled, never-started and leftover-leaving sessions too (their
	// holders are killed and replaced).
	for range 20 {
		if r := h.run(t, c, p, "sh", "-c", "sleep 100 & exit 0"); r.code() != 0 {
			t.Fatalf("%v", r)
		}
		run := h.start(t, c, p, "sleep", "100")
		if err := c.Send(&wire.ExecCancel{ID: run.id}); err != nil {
			t.Fatal(err)
		}
		run.wait(t)
		h.run(t, c, p, "no-such-program")
	}
	testenv.WaitFor(t, 10*time.Second, "descriptors and goroutines back to their level", func() bool {
		return openFDs(t) <= workerFDs && initFDs() <= inInit && runtime.NumGoroutine() <= goroutines &&
			len(holderPids(t, h.machineOf(t, 1))) <= holders
	})
}

// TestClientNotReadingIsDisconnected: a client that stops reading while the
// worker has frames for it is disconnected after Config.SendTimeout (its
// sessions cancelled), and other clients are served meanwhile.
func TestClientNotReadingIsDisconnected(t *testing.T) {
	h := newHarness(t, func(c *Config) { c.SendTimeout = 200 * time.Millisecond })
	stuck := h.dial(t)
	p := h.project(t, 1)
	run := h.start(t, stuck, p, "sleep", "100")
	m := h.machineOf(t, 1)
	testenv.WaitFor(t, 10*time.Second, "sleep running", func() bool { return len(sessionPids(t, m)) == 1 })
	pid := sessionPids(t, m)[0]

	// Pings whose pongs are never read fill the socket; the worker, blocked
	// sending a pong, stops reading, so the pings block too until the
	// worker closes the connection.
	flooded := make(chan error, 1)
	go func() {
		for i := 0; ; i++ {
			if err := stuck.Send(&wire.Ping{ID: strconv.Itoa(i)}); err != nil {
				flooded <- err
				return
			}
		}
	}()
	testenv.WaitFor(t, 10*time.Second, "the stuck client's sleep killed", func() bool { return !alive(pid) })
	select {
	case <-flooded:
	case <-time.After(10 * time.Second):
		t.Fatal("the stuck client's connection was not closed")
	}

	other := h.dial(t)
	if r := h.run(t, other, p, "echo", "served"); r.stdout != "served\n" || r.code() != 0 {
		t.Fatalf("another client after the disconnect: %+v", r)
	}
	run.stdinW.Close()
	<-run.out
	<-run.errOut
}
