// Package cgroup manages the worker's machine cgroups with plain file
// writes, on both layouts: cgroup v2 when /sys/fs/cgroup is a cgroup2 mount,
// otherwise the v1 memory, pids and cpu hierarchies (mounted at
// /sys/fs/cgroup/<controller>; cpu and cpuacct are used when mounted).
//
// A Layout owns one parent directory per hierarchy: only the worker that
// detected it creates or removes groups there, so that two workers never
// touch each other's machines. A parent removed from outside is recreated
// by the next New.
package cgroup

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

// Root is where cgroup filesystems are mounted.
const Root = "/sys/fs/cgroup"

// MachinePrefix starts the name of every group a Layout creates with New
// (see RemoveStale).
const MachinePrefix = "machine-"

// v1Required are the v1 hierarchies a group must span; v1Optional are
// used when mounted (cpu for the CPU limit, cpuacct for usage).
var (
	v1Required = []string{"memory", "pids"}
	v1Optional = []string{"cpu", "cpuacct"}
)

// v2Controllers are enabled in the parent's subtree_control.
const v2Controllers = "+memory +pids +cpu"

// DefaultCPUPeriod is the CFS period with which a CPU limit is enforced.
const DefaultCPUPeriod = 100_000 // µs

// Limits are the resource limits of a group. Zero means unlimited.
type Limits struct {
	Memory int64 // bytes, swap included where the kernel accounts it
	Pids   int64 // tasks (threads count)
	// CPUMillis is the CPU bandwidth in thousandths of a CPU (1000 is one
	// CPU), enforced as a CFS quota per DefaultCPUPeriod.
	CPUMillis int64
}

// Group is one cgroup, spanning every hierarchy in use.
type Group struct {
	v2    bool
	ctrls []string // v1: the controller of each path
	paths []string // v2: one directory; v1: one per controller

	// oom is the memory controller's OOM count file, held open from the
	// first OOMKills to Destroy: re-reading it is one pread, where
	// opening it each time (every session start) cost the worker a
	// quarter of its CPU per command. Guarded by oomMu.
	oomMu sync.Mutex
	oom   *os.File
}

// Layout describes where groups are created.
type Layout struct {
	v2 bool
	// root is the v2 mount (v2 only).
	root string
	// ctrls names the hierarchy of each parent (v1 only).
	ctrls []string
	// parents are absolute directories under which groups are created (one
	// on v2, one per controller on v1).
	parents []string
	// Delegated reports a v2 layout inside the worker's own (delegated)
	// cgroup.
	delegated bool
}

// Detect returns the host's layout with groups created under parent (one
// path element, or a relative path).
//
// On v1 the parent is relative to this process's own cgroup in each
// hierarchy, keeping the worker's accounting nested. On v2, when this
// process's own cgroup is a delegated subtree (systemd's Delegate=yes marks
// it with the trusted.delegate or user.delegate xattr), the worker first
// moves itself into a "worker" child (a cgroup with children holds no
// process) and creates the parent below its own cgroup; otherwise the
// parent is relative to the root, as its own cgroup cannot both hold it
// and have controllers.
func Detect(parent string) (*Layout, error) {
	return detect(Root, parent)
}

// DetectAt is Detect for the cgroup filesystem (or the directory holding
// the v1 hierarchies) mounted at root: for example the v2 hierarchy of a
// hybrid host, /sys/fs/cgroup/unified.
func DetectAt(root, parent string) (*Layout, error) {
	return detect(root, parent)
}

func detect(root, parent string) (*Layout, error) {
	if parent == "" || filepath.IsAbs(parent) || filepath.Clean(parent) != parent || strings.HasPrefix(parent, "..") {
		return nil, fmt.Errorf("cgroup: parent %q must be a clean relative path", parent)
	}
	var st unix.Statfs_t
	if err := unix.Statfs(root, &st); err != nil {
		return nil, fmt.Errorf("cgroup: statfs %s: %w", root, err)
	}
	if st.Type == unix.CGROUP2_SUPER_MAGIC {
		l := &Layout{v2: true, root: root}
		base := root
		if own, ok := delegatedSelf(root); ok {
			if err := leaveToLeaf(own); err != nil {
				return nil, err
			}
			base, l.delegated = own, true
		}
		l.parents = []string{filepath.Join(base, parent)}
		if err := l.ensureParents(); err != nil {
			return nil, err
		}
		return l, nil
	}
	own, err := ownV1Paths()
	if err != nil {
		return nil, err
	}
	l := &Layout{}
	add := func(c string, required bool) error {
		mnt := filepath.Join(root, c)
		if err := unix.Statfs(mnt, &st); err != nil || st.Type != unix.CGROUP_SUPER_MAGIC {
			if required {
				return fmt.Errorf("cgroup: no cgroup v2 at %s and no v1 %s hierarchy at %s", root, c, mnt)
			}
			return nil
		}
		l.ctrls = append(l.ctrls, c)
		l.parents = append(l.parents, filepath.Join(mnt, own[c], parent))
		return nil
	}
	for _, c := range v1Required {
		if err := add(c, true); err != nil {
			return nil, err
		}
	}
	for _, c := range v1Optional {
		if err := add(c, false); err != nil {
			return nil, err
		}
	}
	if err := l.ensureParents(); err != nil {
		return nil, err
	}
	return l, nil
}

// ensureParents creates the parents if missing (another process may have
// removed them) and, on v2, enables the controllers down to them.
func (l *Layout) ensureParents() error {
	for _, p := range l.parents {
		if err := os.MkdirAll(p, 0o755); err != nil {
			return fmt.Errorf("cgroup: %w", err)
		}
	}
	if l.v2 {
		// Enable the controllers on the way down. The root's (or the
		// delegated group's) subtree_control is usually set already;
		// errors surface when the limits are written.
		top := l.root
		if l.delegated {
			top = filepath.Dir(l.parents[0])
		}
		rel, err := filepath.Rel(top, l.parents[0])
		if err != nil {
			return fmt.Errorf("cgroup: %w", err)
		}
		dir := top
		_ = os.WriteFile(filepath.Join(dir, "cgroup.subtree_control"), []byte(v2Controllers), 0)
		for _, e := range strings.Split(rel, "/") {
			dir = filepath.Join(dir, e)
			_ = os.WriteFile(filepath.Join(dir, "cgroup.subtree_control"), []byte(v2Controllers), 0)
		}
	}
	return nil
}

// delegatedSelf returns this process's own v2 cgroup directory if it is a
// delegated subtree.
func delegatedSelf(root string) (string, bool) {
	b, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return "", false
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rel, ok := strings.CutPrefix(line, "0::"); ok && rel != "/" && rel != "" {
			dir := filepath.Join(root, rel)
			// A worker already moved into its "worker" leaf by a previous
			// Detect in this process.
			if filepath.Base(dir) == "worker" && isDelegated(filepath.Dir(dir)) {
				return filepath.Dir(dir), true
			}
			return dir, isDelegated(dir)
		}
	}
	return "", false
}

func isDelegated(dir string) bool {
	buf := make([]byte, 8)
	for _, attr := range []string{"trusted.delegate", "user.delegate"} {
		if n, err := unix.Getxattr(dir, attr, buf); err == nil && strings.TrimSpace(string(buf[:n])) == "1" {
			return true
		}
	}
	return false
}

// leaveToLeaf moves every process of own into own/worker, so that own may
// have controllers enabled for its children (no internal processes).
func leaveToLeaf(own string) error {
	leaf := filepath.Join(own, "worker")
	if err := os.Mkdir(leaf, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
		return fmt.Errorf("cgroup: %w", err)
	}
	b, err := os.ReadFile(filepath.Join(own, "cgroup.procs"))
	if err != nil {
		return fmt.Errorf("cgroup: %w", err)
	}
	for _, f := range strings.Fields(string(b)) {
		if err := os.WriteFile(filepath.Join(leaf, "cgroup.procs"), []byte(f), 0); err != nil && !errors.Is(err, syscall.ESRCH) {
			return fmt.Errorf("cgroup: move %s to %s: %w", f, leaf, err)
		}
	}
	return nil
}

// V2 reports whether the layout is the unified hierarchy.
func (l *Layout) V2() bool { return l.v2 }

// Delegated reports whether the layout lives inside the worker's own
// delegated v2 cgroup.
func (l *Layout) Delegated() bool { return l.delegated }

// Parents returns the layout's parent directories.
func (l *Layout) Parents() []string { return l.parents }

func ownV1Paths() (map[string]string, error) {
	f, err := os.Open("/proc/self/cgroup")
	if err != nil {
		return nil, fmt.Errorf("cgroup: %w", err)
	}
	defer f.Close()
	own := make(map[string]string)
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		parts := strings.SplitN(sc.Text(), ":", 3)
		if len(parts) != 3 {
			continue
		}
		for _, c := range strings.Split(parts[1], ",") {
			own[c] = parts[2]
		}
	}
	return own, sc.Err()
}

func (l *Layout) group(name string) *Group {
	g := &Group{v2: l.v2, ctrls: l.ctrls}
	for _, p := range l.parents {
		g.paths = append(g.paths, filepath.Join(p, name))
	}
	return g
}

// RemoveStale kills the processes of, and removes, every group named
// MachinePrefix* under the layout's parents: what a previous run of the
// same worker (the only user of the parent) left behind. Other entries are
// left alone.
func (l *Layout) RemoveStale() error {
	var errs []error
	seen := make(map[string]bool)
	for _, p := range l.parents {
		ents, err := os.ReadDir(p)
		if err != nil {
			if errors.Is(err, os.ErrNotExist) {
				continue
			}
			errs = append(errs, fmt.Errorf("cgroup: %w", err))
			continue
		}
		for _, e := range ents {
			if !e.IsDir() || !strings.HasPrefix(e.Name(), MachinePrefix) || seen[e.Name()] {
				continue
			}
			seen[e.Name()] = true
			errs = append(errs, l.group(e.Name()).Destroy())
		}
	}
	return errors.Join(errs...)
}

// RemoveParents removes the layout's parent directories if they are empty
// (a worker that shut down leaves nothing behind); a parent still holding
// groups is kept.
func (l *Layout) RemoveParents() {
	for _, p := range l.parents {
		_ = unix.Rmdir(p)
	}
}

// New creates (or, if a stale one exists, empties and recreates) the group
// MachinePrefix+name under the layout's parents, recreating the parents if
// they are gone, and applies lim.
func (l *Layout) New(name string, lim Limits) (*Group, error) {
	g := l.group(MachinePrefix + name)
	if _, err := os.Stat(g.paths[0]); err == nil {
		if err := g.Destroy(); err != nil {
			return nil, fmt.Errorf("cgroup: remove stale %s: %w", name, err)
		}
	}
	ok := false
	defer func() {
		if !ok {
			_ = g.Destroy()
		}
	}()
	for _, p := range g.paths {
		err := os.Mkdir(p, 0o755)
		if errors.Is(err, os.ErrNotExist) {
			// The parent was removed from outside: make it again.
			if err = l.ensureParents(); err == nil {
				err = os.Mkdir(p, 0o755)
			}
		}
		if err != nil && !errors.Is(err, os.ErrExist) {
			return nil, fmt.Errorf("cgroup: %w", err)
		}
	}
	if err := g.SetLimits(lim); err != nil {
		return nil, err
	}
	ok = true
	return g, nil
}

// SetLimits applies lim to the group; it may be called while the group's
// processes run (a lower memory limit than the usage makes the kernel
// reclaim, and fail with EBUSY on v1 when it cannot).
func (g *Group) SetLimits(lim Limits) error {
	if g.v2 {
		dir := g.paths[0]
		if err := writeLimit(dir, "memory.max", maxOrNum(lim.Memory)); err != nil {
			return err
		}
		_ = writeStr(dir, "memory.swap.max", "0") // absent without swap accounting
		if err := writeLimit(dir, "pids.max", maxOrNum(lim.Pids)); err != nil {
			return err
		}
		if lim.CPUMillis > 0 {
			return writeStr(dir, "cpu.max", fmt.Sprintf("%d %d", quota(lim.CPUMillis), DefaultCPUPeriod))
		}
		return writeLimit(dir, "cpu.max", "max")
	}
	for i, c := range g.ctrls {
		dir := g.paths[i]
		switch c {
		case "memory":
			v := lim.Memory
			if v <= 0 {
				v = -1
			}
			// memsw must stay >= the memory limit: lower the limit first,
			// raise memsw first. memsw is absent without swap accounting.
			cur, _ := readInt(dir, "memory.limit_in_bytes")
			lowering := v > 0 && v < cur
			if !lowering {
				_ = write(dir, "memory.memsw.limit_in_bytes", v)
			}
			if err := write(dir, "memory.limit_in_bytes", v); err != nil {
				return err
			}
			if lowering {
				_ = write(dir, "memory.memsw.limit_in_bytes", v)
			}
		case "pids":
			if err := writeStr(dir, "pids.max", maxOrNum(lim.Pids)); err != nil {
				return err
			}
		case "cpu":
			if err := write(dir, "cpu.cfs_period_us", DefaultCPUPeriod); err != nil {
				return err
			}
			q := int64(-1)
			if lim.CPUMillis > 0 {
				q = quota(lim.CPUMillis)
			}
			if err := write(dir, "cpu.cfs_quota_us", q); err != nil {
				return err
			}
		}
	}
	return nil
}

// quota is the CFS quota per DefaultCPUPeriod of millis thousandths of a
// CPU (at least the kernel's minimum of 1 ms).
func quota(millis int64) int64 {
	return max(millis*DefaultCPUPeriod/1000, 1000)
}

func maxOrNum(v int64) string {
	if v <= 0 {
		return "max"
	}
	return strconv.FormatInt(v, 10)
}

func write(dir, file string, v int64) error {
	return writeStr(dir, file, strconv.FormatInt(v, 10))
}

func writeStr(dir, file, v string) error {
	f, err := os.OpenFile(filepath.Join(dir, file), os.O_WRONLY, 0)
	if err == nil {
		_, err = f.WriteString(v)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
	}
	if err != nil {
		return fmt.Errorf("cgroup: %w", err)
	}
	return nil
}

// writeLimit writes a limit; "no limit" (v == "max") is also what a
// missing file (a controller not enabled) means, and is then not an error.
func writeLimit(dir, file, v string) error {
	err := writeStr(dir, file, v)
	if v == "max" && errors.Is(err, os.ErrNotExist) {
		return nil
	}
	return err
}

func readInt(dir, file string) (int64, error) {
	b, err := os.ReadFile(filepath.Join(dir, file))
	if err != nil {
		return 0, fmt.Errorf("cgroup: %w", err)
	}
	return strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
}

// path returns the group's directory in hierarchy c ("" on v2).
func (g *Group) path(c string) string {
	if g.v2 {
		return g.paths[0]
	}
	for i, x := range g.ctrls {
		if x == c {
			return g.paths[i]
		}
	}
	return ""
}

// OOMKills returns how many processes the kernel's OOM killer has killed
// in the group (v1: memory.oom_control's oom_kill; v2: memory.events'
// oom_kill, which counts the group's descendants too).
//
// The file stays open until Destroy: each call after the first reads it
// again from its start (one pread; the kernel renders it afresh).
func (g *Group) OOMKills() (int64, error) {
	f, err := g.oomFile()
	if err != nil {
		return 0, err
	}
	// One pread: File.ReadAt would read again after a short read, to
	// learn of the end of the file (a second system call per session).
	var buf [512]byte
	rc, err := f.SyscallConn()
	if err != nil {
		return 0, fmt.Errorf("cgroup: %w", err)
	}
	var n int
	var perr error
	if err := rc.Control(func(fd uintptr) {
		for {
			n, perr = unix.Pread(int(fd), buf[:], 0)
			if perr != unix.EINTR {
				return
			}
		}
	}); err != nil {
		return 0, fmt.Errorf("cgroup: %w", err)
	}
	if perr != nil {
		return 0, fmt.Errorf("cgroup: read %s: %w", f.Name(), perr)
	}
	if n == len(buf) { // longer than any the kernel writes: read it whole
		b, err := os.ReadFile(f.Name())
		if err != nil {
			return 0, fmt.Errorf("cgroup: %w", err)
		}
		return parseOOMKills(b)
	}
	return parseOOMKills(buf[:n])
}

// oomFile opens the OOM count file once.
func (g *Group) oomFile() (*os.File, error) {
	g.oomMu.Lock()
	defer g.oomMu.Unlock()
	if g.oom != nil {
		return g.oom, nil
	}
	file := "memory.oom_control"
	if g.v2 {
		file = "memory.events"
	}
	f, err := os.Open(filepath.Join(g.path("memory"), file))
	if err != nil {
		return nil, fmt.Errorf("cgroup: %w", err)
	}
	g.oom = f
	return f, nil
}

// closeOOM closes the OOM count file, if open.
func (g *Group) closeOOM() {
	g.oomMu.Lock()
	defer g.oomMu.Unlock()
	if g.oom != nil {
		g.oom.Close()
		g.oom = nil
	}
}

func parseOOMKills(b []byte) (int64, error) {
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "oom_kill "); ok {
			return strconv.ParseInt(strings.TrimSpace(v), 10, 64)
		}
	}
	return 0, nil
}

// CPUUsage returns the CPU time the group's processes have used (v1: the
// cpuacct hierarchy's cpuacct.usage, an error without it; v2: cpu.stat's
// usage_usec).
func (g *Group) CPUUsage() (time.Duration, error) {
	if g.v2 {
		b, err := os.ReadFile(filepath.Join(g.paths[0], "cpu.stat"))
		if err != nil {
			return 0, fmt.Errorf("cgroup: %w", err)
		}
		for _, line := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(line, "usage_usec "); ok {
				n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
				return time.Duration(n) * time.Microsecond, err
			}
		}
		return 0, errors.New("cgroup: no usage_usec in cpu.stat")
	}
	dir := g.path("cpuacct")
	if dir == "" {
		return 0, errors.New("cgroup: no cpuacct hierarchy")
	}
	n, err := readInt(dir, "cpuacct.usage")
	return time.Duration(n), err
}

// Paths returns the group's directories.
func (g *Group) Paths() []string { return g.paths }

// Add moves the process pid (all its threads) into the group.
func (g *Group) Add(pid int) error {
	b := []byte(strconv.Itoa(pid))
	for _, p := range g.paths {
		if err := os.WriteFile(filepath.Join(p, "cgroup.procs"), b, 0); err != nil {
			return fmt.Errorf("cgroup: add %d: %w", pid, err)
		}
	}
	return nil
}

// Alive reports whether the group's directories all still exist (a group
// removed from outside has lost its limits).
func (g *Group) Alive() bool {
	for _, p := range g.paths {
		if _, err := os.Stat(filepath.Join(p, "cgroup.procs")); err != nil {
			return false
		}
	}
	return true
}

// Procs lists the processes in the group.
func (g *Group) Procs() ([]int, error) {
	seen := make(map[int]bool)
	var pids []int
	for _, p := range g.paths {
		b, err := os.ReadFile(filepath.Join(p, "cgroup.procs"))
		if err != nil {
			return nil, fmt.Errorf("cgroup: %w", err)
		}
		for _, f := range strings.Fields(string(b)) {
			if pid, err := strconv.Atoi(f); err == nil && !seen[pid] {
				seen[pid] = true
				pids = append(pids, pid)
			}
		}
	}
	return pids, nil
}

// Kill kills every process in the group and waits, up to timeout, until it
// is empty. v2 uses cgroup.kill; v1 repeats SIGKILL over cgroup.procs until
// nothing is left (a process forked meanwhile shows up on the next round).
func (g *Group) Kill(timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	if g.v2 {
		_ = os.WriteFile(filepath.Join(g.paths[0], "cgroup.kill"), []byte("1"), 0)
	}
	for {
		pids, err := g.Procs()
		if err != nil {
			if errors.Is(err, os.ErrNotExist) {
				return nil
			}
			return err
		}
		if len(pids) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("cgroup: %d processes left after %v", len(pids), timeout)
		}
		for _, pid := range pids {
			_ = unix.Kill(pid, unix.SIGKILL)
		}
		time.Sleep(time.Millisecond)
	}
}

// Destroy kills what is left in the group and removes it (with its child
// groups, on v2 the sessions'). Idempotent.
func (g *Group) Destroy() error {
	if err := g.Kill(5 * time.Second); err != nil {
		return err
	}
	g.closeOOM()
	var errs []error
	for _, p := range g.paths {
		if g.v2 {
			ents, _ := os.ReadDir(p)
			for _, e := range ents {
				if e.IsDir() {
					_ = rmdir(filepath.Join(p, e.Name()))
				}
			}
		}
		if err := rmdir(p); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// rmdir removes an empty cgroup, retrying while the kernel still counts
// dying processes in it.
func rmdir(p string) error {
	var err error
	for range 100 {
		err = unix.Rmdir(p)
		if err == nil || errors.Is(err, syscall.ENOENT) {
			return nil
		}
		if !errors.Is(err, syscall.EBUSY) {
			break
		}
		time.Sleep(2 * time.Millisecond)
	}
	return fmt.Errorf("cgroup: rmdir %s: %w", p, err)
}

// SessionParent returns the directory under which the group's sessions
// get cgroups of their own (see Delegate), or "" where they do not: on v1,
// whose process-per-group semantics are kept for the whole machine (the
// init's pid namespace holders give sessions an exact tree kill there).
func (g *Group) SessionParent() string {
	if !g.v2 {
		return ""
	}
	return g.paths[0]
}

// Delegate hands the group's v2 directory to uid and gid (the machine's
// guest root on the host), as systemd delegates a subtree: the directory
// and its cgroup.procs, cgroup.threads and cgroup.subtree_control, so
// that the init can create child groups for its sessions, fork into them
// with CLONE_INTO_CGROUP (which needs write access to cgroup.procs of the
// common ancestor) and kill and remove them. Its limits (memory.max,
// pids.max, cpu.max) stay root's. A no-op on v1.
func (g *Group) Delegate(uid, gid int) error {
	if !g.v2 {
		return nil
	}
	dir := g.paths[0]
	for _, p := range []string{dir, filepath.Join(dir, "cgroup.procs"), filepath.Join(dir, "cgroup.threads"), filepath.Join(dir, "cgroup.subtree_control")} {
		if err := os.Lchown(p, uid, gid); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("cgroup: delegate: %w", err)
		}
	}
	return nil
}
