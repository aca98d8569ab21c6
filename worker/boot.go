package worker

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/corral-sandbox/corral/worker/internal/cgroup"
	"github.com/corral-sandbox/corral/worker/internal/ctl"
)

// machineStartTimeout bounds a machine's cold start.
const machineStartTimeout = 30 * time.Second

func (m *machine) boot() (err error) {
	w := m.w
	var cleanups []func()
	defer func() {
		if err != nil {
			for i := len(cleanups) - 1; i >= 0; i-- {
				cleanups[i]()
			}
		}
	}()

	var wsStat unix.Stat_t
	if err := unix.Stat(m.workspace, &wsStat); err != nil {
		return fmt.Errorf("workspace: %w", err)
	}
	home, err := m.openDisk()
	if err != nil {
		return err
	}
	cleanups = append(cleanups, m.closeDisk)
	if home == "" {
		home = filepath.Join(w.cfg.HomesRoot, strconv.FormatInt(m.id, 10))
		if err := os.MkdirAll(home, 0o700); err != nil {
			return fmt.Errorf("home: %w", err)
		}
	}

	m.cg, err = w.cgroups.New(fmt.Sprintf("%d.%d", m.id, m.gen), m.lim.Limits)
	if err != nil {
		return err
	}
	cleanups = append(cleanups, func() { _ = m.cg.Destroy() })

	cfg := &ctl.Config{
		Hostname: "project-" + strconv.FormatInt(m.id, 10),
		UID:      GuestUID, GID: GuestGID, GuestWorkspace: GuestWorkspace, GuestHome: GuestHome,
		Mask:     w.masks,
		GoHolder: w.cfg.GoHolders,
		// Enough holders kept for the sessions the machine admits.
		MaxSessions: w.cfg.MaxSessions,
	}
	// On v2 each session gets a cgroup of its own below the machine's,
	// created by the init, to which the machine's group is delegated.
	m.sessCG = m.cg
	if w.sessionLayout != nil {
		// Tests on hybrid hosts: session groups in the v2 hierarchy.
		if m.sessCG, err = w.sessionLayout.New(fmt.Sprintf("%d.%d", m.id, m.gen), cgroup.Limits{}); err != nil {
			return err
		}
		cleanups = append(cleanups, func() { _ = m.sessCG.Destroy() })
	}
	if dir := m.sessCG.SessionParent(); dir != "" {
		if err := m.sessCG.Delegate(int(m.hostUID), int(m.hostUID)); err != nil {
			return err
		}
		cfg.SessionCgroup = dir
	}
	if w.configHook != nil {
		w.configHook(cfg)
	}
	cfg.NProc = nproc(m.lim.Pids)
	cfg.TmpSize = m.lim.Tmp
	mounts, err := m.workspaceMounts(home, wsStat.Uid, wsStat.Gid)
	if err != nil {
		return err
	}
	defer closeAll(mounts)

	ctlConn, initEnd, err := ctl.Pair()
	if err != nil {
		return err
	}
	cleanups = append(cleanups, func() { ctlConn.Close() })
	m.ctl = ctlConn

	cmd := exec.Command(w.cfg.SelfExe, initArg)
	cmd.Env = []string{}
	cmd.Stderr = os.Stderr
	cmd.ExtraFiles = []*os.File{initEnd}
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Cloneflags: syscall.CLONE_NEWUSER | syscall.CLONE_NEWNS | syscall.CLONE_NEWPID |
			syscall.CLONE_NEWNET | syscall.CLONE_NEWIPC | syscall.CLONE_NEWUTS,
		UidMappings:                []syscall.SysProcIDMap{{ContainerID: 0, HostID: int(m.hostUID), Size: RangeSize}},
		GidMappings:                []syscall.SysProcIDMap{{ContainerID: 0, HostID: int(m.hostUID), Size: RangeSize}},
		GidMappingsEnableSetgroups: true,
		Credential:                 &syscall.Credential{Uid: 0, Gid: 0, Groups: []uint32{}},
	}
	// The machine's user namespace is owned by its guest root's host id,
	// not by host root (see startOwnedBy).
	err = startOwnedBy(m.hostUID, m.hostUID, cmd.Start)
	initEnd.Close()
	if err != nil {
		return fmt.Errorf("start init: %w", err)
	}
	m.cmd, m.initPID = cmd, cmd.Process.Pid
	cleanups = append(cleanups, func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })

	// The init waits for its config before doing anything, so it is in the
	// machine's cgroup before it can fork.
	if err := m.cg.Add(m.initPID); err != nil {
		return err
	}
	if m.sessCG != m.cg {
		// CLONE_INTO_CGROUP needs the init's group and the session's to
		// have a delegated common ancestor.
		if err := m.sessCG.Add(m.initPID); err != nil {
			return err
		}
	}
	if err := w.protectInit(m.initPID); err != nil {
		return err
	}
	if err := ctlConn.Send(&ctl.Msg{Op: ctl.OpConfig, Config: cfg}, mounts...); err != nil {
		return err
	}
	closeAll(mounts)
	mounts = nil
	reply, _, err := ctlConn.RecvTimeout(machineStartTimeout)
	switch {
	case err != nil:
		return fmt.Errorf("init: %w", err)
	case reply.Op == ctl.OpFail:
		return fmt.Errorf("init: %s", reply.Message)
	case reply.Op != ctl.OpReady:
		return fmt.Errorf("init: unexpected %q", reply.Op)
	}
	if m.netns, err = os.Open("/proc/" + strconv.Itoa(m.initPID) + "/ns/net"); err != nil {
		return fmt.Errorf("open machine netns: %w", err)
	}
	return nil
}

func closeFDs(fds []int) {
	for _, fd := range fds {
		unix.Close(fd)
	}
}

func closeAll(fs []*os.File) {
	for _, f := range fs {
		f.Close()
	}
}
