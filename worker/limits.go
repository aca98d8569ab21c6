package worker

import (
	"errors"
	"fmt"
	"os"
	"strconv"

	"github.com/corral-sandbox/corral/wire"
	"github.com/corral-sandbox/corral/worker/internal/cgroup"
)

// machineLimits are a machine's resolved limits: zero means none.
type machineLimits struct {
	cgroup.Limits
	// Tmp is the size of /tmp and of /dev/shm (each), in bytes.
	Tmp int64
	// Disk is the size of the machine's disk image, in bytes.
	Disk int64
}

// resolve returns the limits of a machine whose request asks for req (nil:
// the defaults): a zero field of req is the worker's default, a negative
// one no limit.
func (w *Worker) resolve(req *wire.Limits) machineLimits {
	l := w.defaults
	if req == nil {
		return l
	}
	pick := func(v, def int64) int64 {
		switch {
		case v == 0:
			return def
		case v < 0:
			return 0
		}
		return v
	}
	l.Memory = pick(req.Memory, l.Memory)
	l.Pids = pick(req.Pids, l.Pids)
	l.CPUMillis = pick(req.CPU, l.CPUMillis)
	l.Tmp = pick(req.Tmp, l.Tmp)
	l.Disk = pick(req.Disk, l.Disk)
	return l
}

// nproc is RLIMIT_NPROC for a machine's sessions under a pids limit:
// room is left for the init's own threads and for its ready pid
// namespace holders (a few threads each).
func nproc(pids int64) int {
	if pids <= 0 {
		return 0
	}
	return int(max(pids-32, pids/2, 1))
}

// setLimits applies changed limits to a running machine's cgroup: memory,
// pids and CPU change at once; the sizes of /tmp, /dev/shm and the disk,
// and the sessions' RLIMIT_NPROC, at the machine's next start.
func (m *machine) setLimits(l machineLimits) {
	m.limMu.Lock()
	defer m.limMu.Unlock()
	if l.Limits == m.lim.Limits {
		return
	}
	if err := m.cg.SetLimits(l.Limits); err != nil {
		m.w.log.Warn("changing a running machine's limits failed", "project", m.id, "err", err)
		return
	}
	m.w.log.Info("machine limits changed", "project", m.id, "memory", l.Memory, "pids", l.Pids, "cpuMillis", l.CPUMillis)
	m.lim.Limits = l.Limits
}

// protectInit makes the kernel's OOM killer spare the init (and the
// holders it forks, which inherit the value); see package guest for how
// sessions start unprotected. A worker without CAP_SYS_RESOURCE cannot
// lower the value (EACCES): the init then keeps its own and sessions start
// above it.
func (w *Worker) protectInit(pid int) error {
	err := os.WriteFile("/proc/"+strconv.Itoa(pid)+"/oom_score_adj", []byte("-1000"), 0)
	switch {
	case err == nil:
		return nil
	case errors.Is(err, os.ErrPermission):
		w.noOOMProtection.Do(func() {
			w.log.Warn("no CAP_SYS_RESOURCE: machine inits cannot get oom_score_adj -1000; their sessions start at +500 instead")
		})
		return nil
	}
	return fmt.Errorf("init oom_score_adj: %w", err)
}
