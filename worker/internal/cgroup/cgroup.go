// Package cgroup manages the worker's machine cgroups with plain file
// writes, on both layouts: cgroup v2 when /sys/fs/cgroup is a cgroup2 mount,
// otherwise the v1 memory and pids hierarchies (mounted at
// /sys/fs/cgroup/memory and /sys/fs/cgroup/pids).
package cgroup

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Root is where cgroup filesystems are mounted.
const Root = "/sys/fs/cgroup"

// v1Controllers are the v1 hierarchies a group spans.
var v1Controllers = []string{"memory", "pids"}

// Limits are the resource limits of a group. Zero means unlimited.
type Limits struct {
	Memory int64 // bytes, swap included where the kernel accounts it
	Pids   int64 // tasks (threads count)
}

// Group is one cgroup, spanning every hierarchy in use.
type Group struct {
	v2    bool
	paths []string // v2: one directory; v1: one per controller
}

// Layout describes where groups are created.
type Layout struct {
	v2 bool
	// parents are absolute directories under which groups are created (one
	// on v2, one per controller on v1).
	parents []string
}

// Detect returns the host's layout with groups created under parent: a
// path relative to this process's own cgroup on v1 (keeping the worker's
// accounting nested), and relative to the root on v2 (where this
// process's own cgroup cannot both hold it and have controllers).
func Detect(parent string) (*Layout, error) {
	return detect(Root, parent)
}

func detect(root, parent string) (*Layout, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(root, &st); err != nil {
		return nil, fmt.Errorf("cgroup: statfs %s: %w", root, err)
	}
	if st.Type == unix.CGROUP2_SUPER_MAGIC {
		dir := filepath.Join(root, parent)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return nil, fmt.Errorf("cgroup: %w", err)
		}
		// Enable the controllers down to the parent. The root's
		// subtree_control is usually set already; errors surface when the
		// limits are written.
		_ = os.WriteFile(filepath.Join(root, "cgroup.subtree_control"), []byte("+memory +pids"), 0)
		_ = os.WriteFile(filepath.Join(dir, "cgroup.subtree_control"), []byte("+memory +pids"), 0)
		return &Layout{v2: true, parents: []string{dir}}, nil
	}
	own, err := ownV1Paths()
	if err != nil {
		return nil, err
	}
	l := &Layout{}
	for _, c := range v1Controllers {
		mnt := filepath.Join(root, c)
		if err := unix.Statfs(mnt, &st); err != nil || st.Type != unix.CGROUP_SUPER_MAGIC {
			return nil, fmt.Errorf("cgroup: no cgroup v2 at %s and no v1 %s hierarchy at %s", root, c, mnt)
		}
		dir := filepath.Join(mnt, own[c], parent)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return nil, fmt.Errorf("cgroup: %w", err)
		}
		l.parents = append(l.parents, dir)
	}
	return l, nil
}

// V2 reports whether the layout is the unified hierarchy.
func (l *Layout) V2() bool { return l.v2 }

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

// RemoveStale kills the processes of, and removes, every group found under
// the layout's parents: what a previous worker left behind. Only one worker
// may use a parent.
func (l *Layout) RemoveStale() error {
	ents, err := os.ReadDir(l.parents[0])
	if err != nil {
		return fmt.Errorf("cgroup: %w", err)
	}
	var errs []error
	for _, e := range ents {
		if !e.IsDir() {
			continue
		}
		g := &Group{v2: l.v2}
		for _, p := range l.parents {
			g.paths = append(g.paths, filepath.Join(p, e.Name()))
		}
		errs = append(errs, g.Destroy())
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
// name under the layout's parents and applies lim.
func (l *Layout) New(name string, lim Limits) (*Group, error) {
	g := &Group{v2: l.v2}
	for _, p := range l.parents {
		g.paths = append(g.paths, filepath.Join(p, name))
	}
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
		if err := os.Mkdir(p, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
			return nil, fmt.Errorf("cgroup: %w", err)
		}
	}
	if err := g.setLimits(lim); err != nil {
		return nil, err
	}
	ok = true
	return g, nil
}

func (g *Group) setLimits(lim Limits) error {
	if g.v2 {
		dir := g.paths[0]
		if lim.Memory > 0 {
			if err := write(dir, "memory.max", lim.Memory); err != nil {
				return err
			}
			_ = write(dir, "memory.swap.max", 0) // absent without swap accounting
		}
		if lim.Pids > 0 {
			return write(dir, "pids.max", lim.Pids)
		}
		return nil
	}
	for i, c := range v1Controllers {
		dir := g.paths[i]
		switch {
		case c == "memory" && lim.Memory > 0:
			if err := write(dir, "memory.limit_in_bytes", lim.Memory); err != nil {
				return err
			}
			// memsw must be >= the memory limit; absent without swap accounting.
			_ = write(dir, "memory.memsw.limit_in_bytes", lim.Memory)
		case c == "pids" && lim.Pids > 0:
			if err := write(dir, "pids.max", lim.Pids); err != nil {
				return err
			}
		}
	}
	return nil
}

func write(dir, file string, v int64) error {
	if err := os.WriteFile(filepath.Join(dir, file), []byte(strconv.FormatInt(v, 10)), 0); err != nil {
		return fmt.Errorf("cgroup: %w", err)
	}
	return nil
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

// Destroy kills what is left in the group and removes it. Idempotent.
func (g *Group) Destroy() error {
	if err := g.Kill(5 * time.Second); err != nil {
		return err
	}
	var errs []error
	for _, p := range g.paths {
		var err error
		for range 100 {
			err = unix.Rmdir(p)
			if err == nil || errors.Is(err, syscall.ENOENT) {
				err = nil
				break
			}
			if !errors.Is(err, syscall.EBUSY) {
				break
			}
			time.Sleep(2 * time.Millisecond)
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("cgroup: rmdir %s: %w", p, err))
		}
	}
	return errors.Join(errs...)
}
