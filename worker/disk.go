package worker

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/corral-sandbox/corral/worker/internal/datafs"
)

// disks are the projects' mounted disk images, shared by a project's
// machines while one stops and the next starts.
type disks struct {
	dir string // StateDir/disks
	mu  sync.Mutex
	m   map[int64]*diskRef
}

type diskRef struct {
	fs   *datafs.FS
	refs int
}

func (d *disks) paths(id int64) (image, mnt string) {
	n := strconv.FormatInt(id, 10)
	return filepath.Join(d.dir, n+".img"), filepath.Join(d.dir, n)
}

// sweep unmounts the disks a previous worker left mounted (it died
// without Shutdown), so that their loop devices go.
func (d *disks) sweep() error {
	if err := os.MkdirAll(d.dir, 0o700); err != nil {
		return err
	}
	ents, err := os.ReadDir(d.dir)
	if err != nil {
		return err
	}
	for _, e := range ents {
		if e.IsDir() {
			_ = unix.Unmount(filepath.Join(d.dir, e.Name()), unix.MNT_DETACH)
		}
	}
	return nil
}

// openDisk mounts the machine's disk if it has a disk limit or was given
// one before, and returns the home directory on it; it returns "" when
// the machine has no disk. A new disk takes over the project's host home
// (HomesRoot/<id>), copied onto it and then removed; a home that does not
// fit fails the start and leaves the host home as it was.
func (m *machine) openDisk() (string, error) {
	d := m.w.disks
	image, mnt := d.paths(m.id)
	d.mu.Lock()
	defer d.mu.Unlock()
	if r := d.m[m.id]; r != nil {
		r.refs++
		m.disk = r
		if m.lim.Disk > 0 && m.lim.Disk != r.fs.Size {
			m.w.log.Info("disk resize waits for the project's previous machine to stop", "project", m.id)
		}
		return filepath.Join(mnt, "home"), nil
	}
	size := m.lim.Disk
	if size <= 0 {
		st, err := os.Stat(image)
		if errors.Is(err, os.ErrNotExist) {
			return "", nil
		} else if err != nil {
			return "", fmt.Errorf("disk: %w", err)
		}
		size = st.Size() // unlimited now: kept as it is
	}
	fs, err := datafs.Open(image, mnt, size)
	if err != nil {
		return "", fmt.Errorf("disk: %w", err)
	}
	if m.lim.Disk > 0 && fs.Size != max(m.lim.Disk, datafs.MinSize) {
		m.w.log.Warn("disk kept larger than its limit: its data does not fit", "project", m.id, "size", fs.Size, "limit", m.lim.Disk)
	}
	home := filepath.Join(mnt, "home")
	if fs.Created {
		if err := m.migrateHome(home); err != nil {
			_ = fs.Close()
			os.Remove(image)
			return "", err
		}
	}
	if err := os.MkdirAll(home, 0o700); err != nil {
		_ = fs.Close()
		return "", fmt.Errorf("disk: %w", err)
	}
	r := &diskRef{fs: fs, refs: 1}
	d.m[m.id] = r
	m.disk = r
	return home, nil
}

// migrateHome moves the project's host home, if any, onto its new disk.
func (m *machine) migrateHome(home string) error {
	old := filepath.Join(m.w.cfg.HomesRoot, strconv.FormatInt(m.id, 10))
	if _, err := os.Lstat(old); errors.Is(err, os.ErrNotExist) {
		return nil
	}
	// cp -a keeps owners, modes, times, links and xattrs; the disk's root
	// is not the home itself so that a failed copy leaves nothing half
	// used.
	tmp := home + ".migrating"
	if out, err := exec.Command("cp", "-a", "--no-dereference", old, tmp).CombinedOutput(); err != nil {
		return fmt.Errorf("disk: moving the home onto the project's disk (limit %d bytes): %w: %s", m.lim.Disk, err, bytes.TrimSpace(out))
	}
	if err := os.Rename(tmp, home); err != nil {
		return fmt.Errorf("disk: %w", err)
	}
	if err := os.RemoveAll(old); err != nil {
		m.w.log.Warn("the host home moved onto the project's disk could not be removed", "project", m.id, "err", err)
	}
	m.w.log.Info("home moved onto the project's disk", "project", m.id)
	return nil
}

// closeDisk releases the machine's disk: unmounted (its loop device then
// detaches itself) when no machine of the project holds it.
func (m *machine) closeDisk() {
	if m.disk == nil {
		return
	}
	d := m.w.disks
	d.mu.Lock()
	defer d.mu.Unlock()
	r := m.disk
	m.disk = nil
	if r.refs--; r.refs > 0 {
		return
	}
	delete(d.m, m.id)
	if err := r.fs.Close(); err != nil {
		m.w.log.Error("unmounting a project's disk failed", "project", m.id, "err", err)
	}
}

// closeAll unmounts every disk still mounted (at Shutdown, for machines
// whose cleanup is still under way).
func (d *disks) closeAll(log interface{ Error(string, ...any) }) {
	d.mu.Lock()
	defer d.mu.Unlock()
	for id, r := range d.m {
		delete(d.m, id)
		if err := r.fs.Close(); err != nil {
			log.Error("unmounting a project's disk failed", "project", id, "err", err)
		}
	}
}
