package worker

import (
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/corral-sandbox/corral/image"
	"github.com/corral-sandbox/corral/internal/posixacl"
	"github.com/corral-sandbox/corral/internal/safepath"
)

// workspaceMounts prepares the workspace and the home as detached mounts
// (open_tree clones the worker makes with its own access, so the init
// needs none to the host paths). It returns the workspace's mount, then
// the home's.
//
// No guest id may write as host root. A workspace owned by a host user U
// other than root is idmapped so that U is the guest user inside: what the
// guest user creates belongs to U, what the machine's other ids (guest
// root) create to their own host ids (see workspaceMap). A root-owned workspace is not idmapped: it is
// bound as is, so that what the guest creates belongs to the guest user's
// host id (root's files show as the overflow id inside and are writable
// only through their "other" bits) — unless Config.OwnWorkspaces, in which
// case the worker first gives the tree to the guest user's host id, or
// Config.GrantWorkspaces, in which case ACL entries let the guest user and
// guest root write it, its .git excepted. The
// home belongs to the guest user's host id and is bound as is.
func (m *machine) workspaceMounts(home string, uid, gid uint32) (mounts []*os.File, err error) {
	defer func() {
		if err != nil {
			closeAll(mounts)
		}
	}()
	guestUID, guestGID := m.hostUID+GuestUID, m.hostUID+GuestGID
	if uid == 0 && m.w.cfg.OwnWorkspaces {
		m.w.log.Info("giving the root-owned workspace to the project", "project", m.id, "workspace", m.workspace, "hostUID", guestUID)
		if err := chownFrom(m.workspace, 0, 0, guestUID, guestGID); err != nil {
			return nil, fmt.Errorf("workspace: %w", err)
		}
		uid, gid = guestUID, guestGID
	}
	grant := uid == 0 && m.w.cfg.GrantWorkspaces
	if grant {
		// The grant runs as root and stays: only on a path nobody but
		// root can redirect (a host user who owns a directory above it
		// could swap the workspace for a symlink to root's files).
		if err := safepath.Check(m.workspace, 0); err != nil {
			m.w.log.Warn("not granting the root-owned workspace to the machine, binding it as is", "project", m.id, "workspace", m.workspace, "err", err)
			grant = false
		}
	}
	if grant {
		for _, id := range []uint32{guestUID, m.hostUID} {
			if err := posixacl.GrantUser(m.workspace, id, isGitDir); err != nil {
				m.w.log.Warn("cannot grant the root-owned workspace to the machine, binding it as is", "project", m.id, "workspace", m.workspace, "err", err)
				break
			}
		}
	}
	var userns *os.File
	if uid != 0 && uid != guestUID {
		// A root group is not mapped either: the guest's files then get
		// the guest group's host id.
		ginner := gid
		if gid == 0 {
			ginner = guestGID
		}
		var release func()
		userns, release, err = m.w.userns(m.workspaceMap(uid, guestUID), m.workspaceMap(ginner, guestGID))
		if err != nil {
			m.w.log.Warn("idmapped mounts unavailable, binding the workspace as is", "project", m.id, "err", err)
		} else {
			defer release()
		}
	}
	ws, idmapped, err := cloneTree(m.workspace, userns)
	if err != nil {
		return nil, err
	}
	mounts = append(mounts, ws)
	if !idmapped && uid != guestUID {
		m.w.log.Info("workspace not idmapped, bound as is: files the guest creates belong to its host id",
			"project", m.id, "workspace", m.workspace, "owner", uid, "hostUID", guestUID)
	}
	m.idmapped = idmapped
	if err := m.ownHome(home, guestUID, guestGID); err != nil {
		return mounts, fmt.Errorf("home: %w", err)
	}
	hm, _, err := cloneTree(home, nil)
	if err != nil {
		return mounts, err
	}
	mounts = append(mounts, hm)
	return mounts, nil
}

// isGitDir reports whether p is a repository's .git (a directory, or the
// file of a submodule or worktree): GrantWorkspaces leaves them out.
func isGitDir(p string) bool { return filepath.Base(p) == ".git" }

// workspaceMap is the uid (or gid) map of an idmapped workspace whose
// owner is the host id owner: owner shows as guest (the guest user's host
// id) inside, and every other id of the machine's range maps to itself, so
// that guest root and the image's other users write the workspace too,
// their files belonging on the host to their own unprivileged ids of the
// machine (an unmapped writer would get EOVERFLOW). Host root, and every
// host id outside the range but owner, stays unmapped: nothing the guest
// writes can become theirs. An owner inside the machine's range (owner ==
// guest included) gets the identity map of the whole range.
func (m *machine) workspaceMap(owner, guest uint32) []idMap {
	lo, hi := m.hostUID, m.hostUID+RangeSize
	if owner >= lo && owner < hi {
		return []idMap{{inner: lo, outer: lo, size: RangeSize}}
	}
	maps := []idMap{{inner: owner, outer: guest, size: 1}}
	if guest > lo {
		maps = append(maps, idMap{inner: lo, outer: lo, size: guest - lo})
	}
	if guest+1 < hi {
		maps = append(maps, idMap{inner: guest + 1, outer: guest + 1, size: hi - guest - 1})
	}
	return maps
}

// ownHome makes home belong to the guest user's host id. A home a previous
// worker left to another owner — root, the workspace's owner (earlier
// versions idmapped the home too) or the guest user of another id range —
// is given to it first.
func (m *machine) ownHome(home string, uid, gid uint32) error {
	var st unix.Stat_t
	if err := unix.Lstat(home, &st); err != nil {
		return err
	}
	switch {
	case st.Uid == uid:
		return nil
	case st.Uid >= RangeSize+GuestUID:
		// The project's id range moved: shift it, keeping guest owners.
		if err := shiftTree(home, st.Uid-GuestUID, m.hostUID); err != nil {
			return err
		}
	default:
		if err := chownFrom(home, st.Uid, st.Gid, uid, gid); err != nil {
			return err
		}
	}
	return os.Lchown(home, int(uid), int(gid))
}

// nsPromise is a user namespace being made (see layerUserns).
type nsPromise struct {
	done    chan struct{}
	f       *os.File
	release func()
	err     error
}

// layerUserns starts making the user namespace that maps the image store's
// ids onto the machine's, so that the helper process it may take runs
// while the machine's init starts. The caller must call close.
func (m *machine) layerUserns() *nsPromise {
	p := &nsPromise{done: make(chan struct{})}
	go func() {
		defer close(p.done)
		ids := m.w.images.IDs()
		if ids.Size < RangeSize {
			p.err = fmt.Errorf("image store id block of %d ids, want %d", ids.Size, RangeSize)
			return
		}
		p.f, p.release, p.err = m.w.userns(
			[]idMap{{inner: ids.Start, outer: m.hostUID, size: RangeSize}},
			[]idMap{{inner: ids.Start, outer: m.hostUID, size: RangeSize}})
	}()
	return p
}

func (p *nsPromise) wait() (*os.File, error) {
	<-p.done
	return p.f, p.err
}

// close waits for the namespace and releases it.
func (p *nsPromise) close() {
	if _, err := p.wait(); err == nil {
		p.release()
	}
}

// rootMounts prepares the detached mounts of the machine's root, in the
// order ctl.Config.Mounts gives after the workspace and the home: the
// project directory (holding the overlay's upper and work directories),
// each of img's layers idmapped from the image store's ids onto the
// machine's range, then img's host binds read-only, nosuid and nodev. It
// returns what it made also on error, for the caller to close.
func (m *machine) rootMounts(img *image.Image, projDir string, layerNS *nsPromise) (mounts []*os.File, err error) {
	up, _, err := cloneTree(projDir, nil)
	if err != nil {
		return nil, err
	}
	mounts = append(mounts, up)
	if len(img.Layers) > 0 {
		userns, err := layerNS.wait()
		if err != nil {
			return mounts, fmt.Errorf("image layers: %w", err)
		}
		for _, l := range img.Layers {
			f, idmapped, err := cloneTree(l, userns)
			if err != nil {
				return mounts, err
			}
			mounts = append(mounts, f)
			if !idmapped {
				return mounts, fmt.Errorf("image layer %s: the filesystem refuses idmapped mounts", l)
			}
		}
	}
	for _, p := range img.HostBinds {
		f, _, err := cloneTree(p, nil)
		if err != nil {
			return mounts, err
		}
		mounts = append(mounts, f)
		if err := unix.MountSetattr(int(f.Fd()), "", unix.AT_EMPTY_PATH|unix.AT_RECURSIVE, &unix.MountAttr{
			Attr_set: unix.MOUNT_ATTR_RDONLY | unix.MOUNT_ATTR_NOSUID | unix.MOUNT_ATTR_NODEV,
		}); err != nil {
			return mounts, fmt.Errorf("host bind %s: %w", p, err)
		}
	}
	return mounts, nil
}

// chownFrom gives every file of the tree at dir owned by fromUID (or
// root) to uid, and every group fromGID (or root) to gid, without following
// symlinks. A regular file with several links is left alone: it may be a
// host file linked into the tree.
func chownFrom(dir string, fromUID, fromGID, uid, gid uint32) error {
	return filepath.WalkDir(dir, func(p string, _ fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		var st unix.Stat_t
		if err := unix.Lstat(p, &st); err != nil {
			return err
		}
		if st.Mode&unix.S_IFMT != unix.S_IFDIR && st.Nlink > 1 {
			return nil
		}
		u, g := int(st.Uid), int(st.Gid)
		if st.Uid == 0 || st.Uid == fromUID {
			u = int(uid)
		}
		if st.Gid == 0 || st.Gid == fromGID {
			g = int(gid)
		}
		if u == int(st.Uid) && g == int(st.Gid) {
			return nil
		}
		return os.Lchown(p, u, g)
	})
}

// idMap is one extent of a user namespace's uid or gid map: ids
// [inner, inner+size) inside are [outer, outer+size) outside.
type idMap struct{ inner, outer, size uint32 }

// nsKey is the cache key of a user namespace with these maps.
func nsKey(uids, gids []idMap) string { return fmt.Sprint(uids, gids) }

func sysMaps(maps []idMap) []syscall.SysProcIDMap {
	out := make([]syscall.SysProcIDMap, len(maps))
	for i, e := range maps {
		out[i] = syscall.SysProcIDMap{ContainerID: int(e.inner), HostID: int(e.outer), Size: int(e.size)}
	}
	return out
}

// maxUserns bounds the user namespaces a worker keeps for idmapped mounts.
const maxUserns = 512

// userns returns a user namespace with the given maps, for idmapped mounts,
// and the function to call when done with it: one the worker keeps (a
// machine's restart spawns no helper for its namespaces), or, once the
// worker keeps maxUserns, a new one that release closes.
func (w *Worker) userns(uids, gids []idMap) (f *os.File, release func(), err error) {
	key := nsKey(uids, gids)
	w.nsMu.Lock()
	f = w.nsCache[key]
	w.nsMu.Unlock()
	if f != nil {
		return f, func() {}, nil
	}
	// Made without the lock: boots of other projects do not wait.
	if f, err = holdUserns(w.cfg.SelfExe, uids, gids); err != nil {
		return nil, nil, err
	}
	w.nsMu.Lock()
	defer w.nsMu.Unlock()
	switch kept := w.nsCache[key]; {
	case kept != nil: // made meanwhile by another boot
		f.Close()
		return kept, func() {}, nil
	case len(w.nsCache) >= maxUserns:
		return f, func() { f.Close() }, nil
	}
	w.nsCache[key] = f
	return f, func() {}, nil
}

// holdUserns returns a descriptor of a fresh user namespace with the given
// maps. Used for an idmapped mount, it shows a file owned on disk by inner
// as owned by outer. A helper process (this binary, see MaybeRunInit)
// creates it and is killed once the descriptor is open.
func holdUserns(self string, uids, gids []idMap) (*os.File, error) {
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
		UidMappings: sysMaps(uids),
		GidMappings: sysMaps(gids),
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
