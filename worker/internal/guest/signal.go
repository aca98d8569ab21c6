package guest

import (
	"os"
	"strconv"

	"golang.org/x/sys/unix"
)

// signalNamespace sends sig to every process of h's pid namespace but h
// (a session's whole tree: its main process, what it forked, and the
// orphans h adopted), as seen in the init's /proc, which is the machine's
// pid namespace's. Each process is pinned by a pidfd before its namespace
// is checked, so a pid reused meanwhile is never signalled. Two passes
// catch most children forked while the first was delivered; a process
// that keeps forking can outrun them (the holder's kill cannot be
// outrun).
func signalNamespace(h *holder, sig unix.Signal) {
	want, err := os.Readlink("/proc/" + strconv.Itoa(h.pid) + "/ns/pid")
	if err != nil {
		return
	}
	done := map[int]bool{h.pid: true}
	for range 2 {
		d, err := os.Open("/proc")
		if err != nil {
			return
		}
		names, _ := d.Readdirnames(-1)
		d.Close()
		for _, name := range names {
			pid, err := strconv.Atoi(name)
			if err != nil || done[pid] {
				continue
			}
			fd, err := unix.PidfdOpen(pid, 0)
			if err != nil {
				continue
			}
			if ns, err := os.Readlink("/proc/" + name + "/ns/pid"); err == nil && ns == want {
				_ = unix.PidfdSendSignal(fd, sig, nil, 0)
				done[pid] = true
			}
			unix.Close(fd)
		}
	}
}
