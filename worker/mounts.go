package worker

import (
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"syscall"

	"golang.org/x/sys/unix"
)

// workspaceMounts prepares the workspace and the home as detached mounts
// (open_tree clones the worker makes with its own access, so the init
// needs none to the host paths), idmapped where the filesystem allows so
// that the host owner of the workspace is the guest user. Where it does
// not, the clone is used as is and the fallback is logged; the home is then
// chowned to the guest user's host id. It returns the workspace's mount,
// then the home's.
func (m *machine) workspaceMounts(home string, uid, gid uint32) (mounts []*os.File, err error) {
	defer func() {
		if err != nil {
			closeAll(mounts)
		}
	}()
	guestUID, guestGID := m.hostUID+GuestUID, m.hostUID+GuestGID
	userns, err := holdUserns(m.w.cfg.SelfExe, uid, gid, guestUID, guestGID)
	if err != nil {
		m.w.log.Warn("idmapped mounts unavailable, falling back to plain binds", "project", m.id, "err", err)
	} else {
		defer userns.Close()
	}
	ws, idmapped, err := cloneTree(m.workspace, userns)
	if err != nil {
		return nil, err
	}
	mounts = append(mounts, ws)
	if !idmapped {
		m.w.log.Warn("workspace not idmapped, bound as is: files the guest creates belong to its host id",
			"project", m.id, "workspace", m.workspace, "hostUID", guestUID)
	}
	m.idmapped = idmapped
	// Owned by the workspace's owner, for the idmapping; re-owned below if
	// that fails.
	if err := os.Chown(home, int(uid), int(gid)); err != nil {
		return mounts, fmt.Errorf("home: %w", err)
	}
	hm, idmapped, err := cloneTree(home, userns)
	if err != nil {
		return mounts, err
	}
	mounts = append(mounts, hm)
	if !idmapped {
		m.w.log.Warn("home not idmapped, chowned to the guest user's host id", "project", m.id, "hostUID", guestUID)
		if err := os.Chown(home, int(guestUID), int(guestGID)); err != nil {
			return mounts, fmt.Errorf("home: %w", err)
		}
	}
	return mounts, nil
}

// holdUserns returns a descriptor of a fresh user namespace mapping host
// uid/gid to id host (the idmapping of the guest user's files). A helper
// process (this binary, see MaybeRunInit) creates it and is killed once
// the descriptor is open.
func holdUserns(self string, uid, gid, hostUID, hostGID uint32) (*os.File, error) {
	r, wr, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	defer wr.Close()
	cmd := exec.Command(self, holdArg)
	cmd.Env = []string{}
	cmd.Stdin = r
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Cloneflags:  syscall.CLONE_NEWUSER,
		UidMappings: []syscall.SysProcIDMap{{ContainerID: int(uid), HostID: int(hostUID), Size: 1}},
		GidMappings: []syscall.SysProcIDMap{{ContainerID: int(gid), HostID: int(hostGID), Size: 1}},
	}
	err = cmd.Start()
	r.Close()
	if err != nil {
		return nil, fmt.Errorf("userns helper: %w", err)
	}
	f, err := os.Open("/proc/" + strconv.Itoa(cmd.Process.Pid) + "/ns/user")
	// The helper has served its purpose once the namespace is open; no
	// need to wait for its runtime to start and see EOF.
	_ = cmd.Process.Kill()
	_ = cmd.Wait()
	if err != nil {
		return nil, fmt.Errorf("userns helper: %w", err)
	}
	return f, nil
}

// cloneTree clones the mount tree at path as a detached mount, idmapped
// through userns when userns is not nil and the filesystem allows it.
func cloneTree(path string, userns *os.File) (f *os.File, idmapped bool, err error) {
	fd, err := unix.OpenTree(unix.AT_FDCWD, path, unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC|unix.AT_RECURSIVE)
	if err != nil {
		return nil, false, fmt.Errorf("open_tree %s: %w", path, err)
	}
	if userns != nil {
		attr := &unix.MountAttr{Attr_set: unix.MOUNT_ATTR_IDMAP, Userns_fd: uint64(userns.Fd())}
		if err := unix.MountSetattr(fd, "", unix.AT_EMPTY_PATH|unix.AT_RECURSIVE, attr); err == nil {
			idmapped = true
		} else {
			// EINVAL: the filesystem does not support idmapping. The failed
			// call changed nothing; clone again to be sure of a clean tree.
			unix.Close(fd)
			if fd, err = unix.OpenTree(unix.AT_FDCWD, path, unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC|unix.AT_RECURSIVE); err != nil {
				return nil, false, fmt.Errorf("open_tree %s: %w", path, err)
			}
		}
	}
	return os.NewFile(uintptr(fd), "mount:"+path), idmapped, nil
}
