package worker

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/corral-sandbox/corral/image"
	"github.com/corral-sandbox/corral/worker/internal/cgroup"
	"github.com/corral-sandbox/corral/worker/internal/ctl"
)

// machineStartTimeout bounds a machine's cold start.
const machineStartTimeout = 30 * time.Second

// projectDir is the directory of project id's persistent machine state
// under StateDir: the overlay's upper and work directories ("upper",
// "work"), owned by the machine's guest root. Beside it, projectDir+".image"
// (root's) records the id of the image the upper layer was made over.
// StateDir/uppers is 0700 root: no host user reaches them. A project with
// a disk has them on it instead (see machine.layerDir).
func (w *Worker) projectDir(id int64) string {
	return filepath.Join(w.cfg.StateDir, "uppers", strconv.FormatInt(id, 10))
}

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
	// The project's previous machine may still be dying, its overlay over
	// the same upper directory.
	if m.prev != nil {
		select {
		case <-m.prev.dead:
		case <-time.After(machineStartTimeout):
			return fmt.Errorf("the project's previous machine did not stop")
		}
		m.prev = nil
	}

	ctx, cancel := context.WithTimeout(context.Background(), machineStartTimeout)
	defer cancel()
	img, err := w.resolveImage(ctx, m.imageName)
	if err != nil {
		return err
	}
	m.image, m.imageID, m.imageEnv = img.Name, img.ID, img.Config.Env
	m.imageCwd = GuestWorkspace
	if d := img.Config.WorkingDir; path.IsAbs(d) && path.Clean(d) == d && d != "/" && !strings.ContainsRune(d, 0) {
		m.imageCwd = d
	}

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
	projDir, err := m.prepareUpper(img)
	if err != nil {
		return err
	}
	var layerNS *nsPromise
	if len(img.Layers) > 0 {
		layerNS = m.layerUserns()
		defer layerNS.close()
	}

	m.cg, err = w.cgroups.New(fmt.Sprintf("%d.%d", m.id, m.gen), m.lim.Limits)
	if err != nil {
		return err
	}
	cleanups = append(cleanups, func() { _ = m.cg.Destroy() })

	cfg := &ctl.Config{
		Hostname: "project-" + strconv.FormatInt(m.id, 10),
		UID:      GuestUID, GID: GuestGID, GuestWorkspace: GuestWorkspace, GuestHome: GuestHome,
		DefaultUser: defaultUser(img.Config.User),
		GoHolder:    w.cfg.GoHolders,
		// Enough holders kept for the sessions the machine admits.
		MaxSessions: w.cfg.MaxSessions,
	}
	// On v2 each session gets a cgroup of its own below the machine's,
	// created by the init, to which the machine's group is delegated.
	m.sessCG = m.cg
	if sl := w.sessionLayout.Load(); sl != nil {
		// Tests on hybrid hosts: session groups in the v2 hierarchy.
		if m.sessCG, err = sl.New(fmt.Sprintf("%d.%d", m.id, m.gen), cgroup.Limits{}); err != nil {
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
	m.defaultUser = cfg.DefaultUser
	cfg.NProc = nproc(m.lim.Pids)
	cfg.TmpSize = m.lim.Tmp
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
	// The machine's mounts are made while the init's runtime starts.
	mounts, err := m.workspaceMounts(home, wsStat.Uid, wsStat.Gid)
	if err != nil {
		return err
	}
	defer func() { closeAll(mounts) }()
	root, err := m.rootMounts(img, projDir, layerNS)
	mounts = append(mounts, root...)
	if err != nil {
		return err
	}
	cfg.Layers, cfg.HostBinds = len(img.Layers), img.HostBinds
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

// defaultUser is the user sessions of an image run as by default: its
// config's, where an empty one means root (as for OCI runtimes).
func defaultUser(u string) string {
	if u == "" {
		return "0"
	}
	return u
}

// prepareUpper makes the project's upper and work directories, owned by
// the machine's guest root, and returns the project directory holding
// them. An upper layer made over another image (the project's image
// changed) is discarded: its whiteouts and copies would be applied to
// files they were not made from. One whose owner is not this machine's
// guest root (the project's id range changed) is shifted onto the
// machine's range, keeping every file's guest owner.
func (m *machine) prepareUpper(img *image.Image) (string, error) {
	dir := m.layerDir()
	marker := dir + ".image"
	if b, err := os.ReadFile(marker); err == nil && string(b) != img.ID {
		m.w.log.Info("project image changed, discarding its upper layer", "project", m.id, "was", string(b), "now", img.ID)
		if err := os.RemoveAll(dir); err != nil {
			return "", fmt.Errorf("discard upper layer: %w", err)
		}
	}
	var st unix.Stat_t
	switch err := unix.Lstat(dir, &st); {
	case errors.Is(err, unix.ENOENT):
	case err != nil:
		return "", fmt.Errorf("upper layer: %w", err)
	case st.Uid != m.hostUID:
		m.w.log.Warn("project id range changed, shifting its upper layer", "project", m.id, "from", st.Uid, "to", m.hostUID)
		if err := shiftTree(dir, st.Uid, m.hostUID); err != nil {
			return "", fmt.Errorf("shift upper layer: %w", err)
		}
	}
	for _, d := range []string{dir, filepath.Join(dir, "upper"), filepath.Join(dir, "work")} {
		mode := os.FileMode(0o755)
		if d == dir {
			mode = 0o700
		}
		if err := os.Mkdir(d, mode); err != nil && !errors.Is(err, fs.ErrExist) {
			return "", fmt.Errorf("upper layer: %w", err)
		}
		if err := os.Lchown(d, int(m.hostUID), int(m.hostUID)); err != nil {
			return "", fmt.Errorf("upper layer: %w", err)
		}
	}
	if err := os.WriteFile(marker, []byte(img.ID), 0o600); err != nil {
		return "", fmt.Errorf("upper layer: %w", err)
	}
	return dir, nil
}

// shiftTree moves every owner and group of the tree at dir that lies in
// [from, from+RangeSize) by to-from, without following symlinks.
func shiftTree(dir string, from, to uint32) error {
	shift := func(id uint32) (int, bool) {
		if id >= from && uint64(id) < uint64(from)+RangeSize {
			return int(id - from + to), true
		}
		return int(id), false
	}
	return filepath.WalkDir(dir, func(p string, _ fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		var st unix.Stat_t
		if err := unix.Lstat(p, &st); err != nil {
			return err
		}
		uid, su := shift(st.Uid)
		gid, sg := shift(st.Gid)
		if !su && !sg {
			return nil
		}
		// Lchown clears set-id bits of a regular file; put them back (they
		// elevate only within the machine's own range).
		if err := os.Lchown(p, uid, gid); err != nil {
			return err
		}
		if st.Mode&unix.S_IFMT == unix.S_IFREG && st.Mode&(unix.S_ISUID|unix.S_ISGID) != 0 {
			return unix.Chmod(p, st.Mode&0o7777)
		}
		return nil
	})
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
