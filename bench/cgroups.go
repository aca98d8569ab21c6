package main

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// CPU accounting by cgroup: the bench's own process (the core, the
// clients of the floors, and bare commands it forks), the worker and the
// floors' relays, and the machines (the worker's machine groups, the
// floors' agents with everything they fork) are each counted in a group of
// their own below one parent the bench creates and removes:
//
//	<parent>/core    the bench (moved there at start, moved back at the end)
//	<parent>/worker  the worker process; its machine groups are created
//	                 below it (v1, and delegated v2), or named in machines
//	<parent>/relay   the floors' relays
//	<parent>/agent   the floors' agents
//
// A child is placed by moving the bench into the group while it forks
// (children inherit the group at fork) and back to core afterwards. On
// cgroup v1 the groups are made in the cpuacct hierarchy (cpuacct.usage,
// nanoseconds), which on this host is mounted apart from cpu, so that no
// scheduling weight changes; on v2 (cpu.stat usage_usec, kept without any
// controller enabled) in the unified hierarchy.
type cpuAcct struct {
	v2     bool
	root   string // mount of the hierarchy
	parent string // the bench's parent group
	orig   string // the bench's own group before the move

	mu       sync.Mutex
	machines []string // extra machine group directories (v2, outside worker)
}

// Accounting group names.
const (
	groupCore   = "core"
	groupWorker = "worker"
	groupRelay  = "relay"
	groupAgent  = "agent"
)

// cpuSample is one reading of every group.
type cpuSample struct {
	core, worker, machine, relay, agent time.Duration
}

func (a cpuSample) sub(b cpuSample) cpuSample {
	return cpuSample{a.core - b.core, a.worker - b.worker, a.machine - b.machine, a.relay - b.relay, a.agent - b.agent}
}

func (a cpuSample) add(b cpuSample) cpuSample {
	return cpuSample{a.core + b.core, a.worker + b.worker, a.machine + b.machine, a.relay + b.relay, a.agent + b.agent}
}

// newCPUAcct sets up the groups on this host's layout: v2 when
// /sys/fs/cgroup is a cgroup2 mount (where the worker makes its machine
// groups), otherwise v1 cpuacct. It moves the bench into core.
func newCPUAcct() (*cpuAcct, error) {
	var st unix.Statfs_t
	if err := unix.Statfs("/sys/fs/cgroup", &st); err == nil && st.Type == unix.CGROUP2_SUPER_MAGIC {
		return newCPUAcctAt("/sys/fs/cgroup", true)
	}
	mnt, err := v1Mount("cpuacct")
	if err != nil {
		return nil, err
	}
	return newCPUAcctAt(mnt, false)
}

// v1Mount finds the mount point of the v1 hierarchy holding controller.
func v1Mount(controller string) (string, error) {
	f, err := os.Open("/proc/self/mounts")
	if err != nil {
		return "", err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fs := strings.Fields(sc.Text())
		if len(fs) < 4 || fs[2] != "cgroup" {
			continue
		}
		for _, o := range strings.Split(fs[3], ",") {
			if o == controller {
				return fs[1], nil
			}
		}
	}
	return "", fmt.Errorf("no cgroup v1 %s hierarchy mounted", controller)
}

// ownGroup is this process's group in the hierarchy at root (v2: the
// "0::" line; v1: the line naming controller).
func ownGroup(v2 bool, controller string) (string, error) {
	b, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return "", err
	}
	for line := range strings.Lines(string(b)) {
		f := strings.SplitN(strings.TrimSpace(line), ":", 3)
		if len(f) != 3 {
			continue
		}
		if v2 && f[0] == "0" && f[1] == "" {
			return f[2], nil
		}
		if !v2 {
			for _, c := range strings.Split(f[1], ",") {
				if c == controller {
					return f[2], nil
				}
			}
		}
	}
	return "", fmt.Errorf("no %s line in /proc/self/cgroup", map[bool]string{true: "cgroup v2", false: controller}[v2])
}

// newCPUAcctAt makes the groups in the hierarchy mounted at root (v2 says
// whether it is cgroup2) and moves the bench into core. On v2 the parent
// is made at the hierarchy's root (no controller is enabled, so the "no
// internal processes" rule does not apply); on v1 below the bench's own
// group.
func newCPUAcctAt(root string, v2 bool) (*cpuAcct, error) {
	own, err := ownGroup(v2, "cpuacct")
	if err != nil {
		return nil, err
	}
	a := &cpuAcct{v2: v2, root: root, orig: filepath.Join(root, own)}
	base := a.orig
	if v2 {
		base = root
	}
	a.parent = filepath.Join(base, fmt.Sprintf("corral-bench-cpu-%d", os.Getpid()))
	for _, g := range []string{"", groupCore, groupWorker, groupRelay, groupAgent} {
		if err := os.Mkdir(filepath.Join(a.parent, g), 0o755); err != nil && !os.IsExist(err) {
			a.close()
			return nil, err
		}
	}
	if _, err := a.read(groupCore); err != nil {
		a.close()
		return nil, fmt.Errorf("cpu usage not readable: %w", err)
	}
	if err := a.move(groupCore); err != nil {
		a.close()
		return nil, err
	}
	return a, nil
}

// move moves the bench (every thread) into group.
func (a *cpuAcct) move(group string) error {
	return a.place(os.Getpid(), filepath.Join(a.parent, group))
}

func (a *cpuAcct) place(pid int, dir string) error {
	return os.WriteFile(filepath.Join(dir, "cgroup.procs"), []byte(strconv.Itoa(pid)), 0o644)
}

// in runs start (which forks a child) with the bench in group, so that
// the child starts there. A nil accounting runs start alone.
func (a *cpuAcct) in(group string, start func() error) error {
	if a == nil {
		return start()
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if err := a.move(group); err != nil {
		return err
	}
	err := start()
	return errors.Join(err, a.move(groupCore))
}

// addMachines names a worker's machine group parent (one path element),
// wherever the worker made it: below the worker group, or at the root.
func (a *cpuAcct) addMachines(parent string) {
	if a == nil {
		return
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	a.machines = append(a.machines, parent)
}

// read returns the CPU time used by the group directory dir (relative to
// the parent, or absolute), its descendants included.
func (a *cpuAcct) read(dir string) (time.Duration, error) {
	if !filepath.IsAbs(dir) {
		dir = filepath.Join(a.parent, dir)
	}
	if !a.v2 {
		b, err := os.ReadFile(filepath.Join(dir, "cpuacct.usage"))
		if err != nil {
			return 0, err
		}
		n, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
		return time.Duration(n), err
	}
	b, err := os.ReadFile(filepath.Join(dir, "cpu.stat"))
	if err != nil {
		return 0, err
	}
	for line := range strings.Lines(string(b)) {
		if v, ok := strings.CutPrefix(line, "usage_usec "); ok {
			n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
			return time.Duration(n) * time.Microsecond, err
		}
	}
	return 0, errors.New("no usage_usec in cpu.stat")
}

// sample reads every group. Machine groups below the worker group are
// counted as machine, not worker. A nil accounting reads zero.
func (a *cpuAcct) sample() cpuSample {
	if a == nil {
		return cpuSample{}
	}
	var s cpuSample
	s.core, _ = a.read(groupCore)
	s.worker, _ = a.read(groupWorker)
	s.relay, _ = a.read(groupRelay)
	s.agent, _ = a.read(groupAgent)
	a.mu.Lock()
	machines := append([]string(nil), a.machines...)
	a.mu.Unlock()
	for _, m := range machines {
		if d, err := a.read(filepath.Join(groupWorker, m)); err == nil {
			s.machine += d
			s.worker -= d
		} else if d, err := a.read(filepath.Join(a.root, m)); err == nil {
			s.machine += d
		}
	}
	return s
}

// close moves the bench back to its own group, moves any process still
// in a group of the parent there too (only the bench's own children were
// placed in them: one still exiting, a thread created during a move), and
// removes the groups bottom-up, waiting up to a second for exiting tasks
// to leave.
func (a *cpuAcct) close() {
	if a == nil {
		return
	}
	_ = a.place(os.Getpid(), a.orig)
	var all []string
	_ = filepath.WalkDir(a.parent, func(p string, e os.DirEntry, err error) error {
		if err == nil && e.IsDir() {
			all = append(all, p)
		}
		return nil
	})
	deadline := time.Now().Add(time.Second)
	for i := len(all) - 1; i >= 0; i-- {
		for {
			if b, err := os.ReadFile(filepath.Join(all[i], "cgroup.procs")); err == nil {
				for _, f := range strings.Fields(string(b)) {
					if pid, err := strconv.Atoi(f); err == nil {
						_ = a.place(pid, a.orig)
					}
				}
			}
			err := syscall.Rmdir(all[i])
			if err == nil || os.IsNotExist(err) || err != syscall.EBUSY || time.Now().After(deadline) {
				break
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
}

// describe names the layout for the report.
func (a *cpuAcct) describe() string {
	if a.v2 {
		return "cgroup v2 cpu.stat usage_usec under " + a.parent
	}
	return "cgroup v1 cpuacct.usage under " + a.parent
}
