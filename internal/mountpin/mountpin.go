// Package mountpin finds the processes whose mount namespaces still hold a
// loop device's filesystem.
//
// A mount namespace made with unshare(CLONE_NEWNS) or clone(CLONE_NEWNS)
// starts with a copy of every mount of its parent, and keeps each copy
// until it unmounts it or the namespace ends, whatever the parent does: a
// filesystem unmounted on the host stays mounted there, and an autoclear
// loop device under it stays attached. A machine drops its copies (it
// pivots into its own root and detaches the old one); other programs on
// the host (an unshare(1) left running, a systemd service with
// PrivateTmp, a benchmark's agent) may not. Tests that check that a loop
// device detached use Holders to tell such a pin from a leak of their own.
package mountpin

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"
)

// Holders returns the ids of processes in other mount namespaces than the
// caller's that have a mount of one of the loop devices backed by image
// (a path prefix; as /sys/block/loopN/loop/backing_file reads), and the
// devices. A process in the caller's own namespace is never listed: a
// mount there is the caller's own.
func Holders(image string) (pids []int, devices []string) {
	devs := map[string]string{} // "major:minor" → loopN
	for _, name := range Loops(image) {
		d, err := os.ReadFile(filepath.Join("/sys/block", name, "dev"))
		if err != nil {
			continue
		}
		devs[strings.TrimSpace(string(d))] = name
	}
	if len(devs) == 0 {
		return nil, nil
	}
	for _, name := range devs {
		devices = append(devices, name)
	}
	self := ownMountNS()
	seen := map[string]bool{self: true}
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		ns, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/mnt", pid))
		if err != nil || seen[ns] {
			continue
		}
		seen[ns] = true
		if mounts(pid, devs) {
			pids = append(pids, pid)
		}
	}
	return pids, devices
}

// Loops returns the loop devices (loopN) backed by a file whose path
// begins with prefix.
func Loops(prefix string) []string {
	var names []string
	files, _ := filepath.Glob("/sys/block/loop*/loop/backing_file")
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err == nil && strings.HasPrefix(strings.TrimSpace(string(b)), prefix) {
			names = append(names, filepath.Base(filepath.Dir(filepath.Dir(f))))
		}
	}
	return names
}

// Await fails tb unless the loop devices backed by files under prefix
// detach (autoclear, once their filesystems are unmounted) within 10
// seconds. Devices that only other mount namespaces still hold (see
// Holders) are logged, not failed: they are not the caller's leak.
func Await(tb testing.TB, prefix string) {
	tb.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		left := Loops(prefix)
		if len(left) == 0 {
			return
		}
		if time.Now().After(deadline) {
			if pids, _ := Holders(prefix); len(pids) > 0 {
				tb.Logf("loop devices %v (under %s) are held by the mount namespaces of pids %v; autoclear detaches them when those end", left, prefix, pids)
				return
			}
			tb.Errorf("loop devices left attached under %s: %v", prefix, left)
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// ownMountNS names the process's mount namespace as a fresh locked thread
// has it. /proc/self names the main thread's, which a goroutine that
// locked it and entered another namespace (confine's threads unshare
// theirs) may have left wedged there.
func ownMountNS() string {
	ns := make(chan string, 1)
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		s, _ := os.Readlink("/proc/thread-self/ns/mnt")
		ns <- s
	}()
	return <-ns
}

// mounts reports whether pid's mountinfo has a mount of one of devs.
func mounts(pid int, devs map[string]string) bool {
	f, err := os.Open(fmt.Sprintf("/proc/%d/mountinfo", pid))
	if err != nil {
		return false
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		// id parent major:minor root mountpoint …
		fields := strings.SplitN(sc.Text(), " ", 4)
		if len(fields) >= 3 && devs[fields[2]] != "" {
			return true
		}
	}
	return false
}
