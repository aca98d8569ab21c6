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
	// busy, while not nil, is closed when the disk's mount or unmount
	// (outside the lock) is done.
	busy chan struct{}
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
	home := filepath.Join(mnt, "home")
	d.mu.Lock()
	for {
		r := d.m[m.id]
		if r == nil {
			break
		}
		if r.busy != nil {
			ch := r.busy
			d.mu.Unlock()
			<-ch
			d.mu.Lock()
			continue
		}
		r.refs++
		m.disk = r
		d.mu.Unlock()
		if m.lim.Disk > 0 && max(m.lim.Disk, datafs.MinSize) != r.fs.Size {
			m.w.log.Info("disk resize waits for the project's running machine to stop", "project", m.id)
		}
		return home, nil
	}
	r := &diskRef{refs: 1, busy: make(chan struct{})}
	d.m[m.id] = r
	d.mu.Unlock()
	fs, err := m.mountDisk(image, mnt, home)
	d.mu.Lock()
	defer d.mu.Unlock()
	close(r.busy)
	r.busy = nil
	if err != nil || fs == nil {
		delete(d.m, m.id)
		return "", err
	}
	r.fs = fs
	m.disk = r
	return home, nil
}

// mountDisk mounts the project's disk, made (and the host home moved onto
// it) if need be; it returns nil when the project has none.
func (m *machine) mountDisk(image, mnt, home string) (*datafs.FS, error) {
	size := m.lim.Disk
	if size <= 0 {
		st, err := os.Stat(image)
		if errors.Is(err, os.ErrNotExist) {
			return nil, nil
		} else if err != nil {
			return nil, fmt.Errorf("disk: %w", err)
		}
		size = st.Size() // unlimited now: kept as it is
	}
	fs, err := datafs.Open(image, mnt, size)
	if err != nil {
		return nil, fmt.Errorf("disk: %w", err)
	}
	if m.lim.Disk > 0 && fs.Size != max(m.lim.Disk, datafs.MinSize) {
		m.w.log.Warn("disk kept larger than its limit: its data does not fit", "project", m.id, "size", fs.Size, "limit", m.lim.Disk)
	}
	if fs.Created {
		if err := m.migrateHome(home); err != nil {
			_ = fs.Close()
			os.Remove(image)
			return nil, err
		}
	}
	if err := os.MkdirAll(home, 0o700); err != nil {
		_ = fs.Close()
		return nil, fmt.Errorf("disk: %w", err)
	}
	return fs, nil
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
	d := m.w.disks
	d.mu.Lock()
	r := m.disk
	m.disk = nil
	if r == nil {
		d.mu.Unlock()
		return
	}
	if r.refs--; r.refs > 0 {
		d.mu.Unlock()
		return
	}
	r.busy = make(chan struct{})
	d.mu.Unlock()
	err := r.fs.Close()
	d.mu.Lock()
	delete(d.m, m.id)
	close(r.busy)
	d.mu.Unlock()
	if err != nil {
		m.w.log.Error("unmounting a project's disk failed", "project", m.id, "err", err)
	}
}

// closeAll unmounts every disk still mounted (at Shutdown, for machines
// whose cleanup is still under way).
func (d *disks) closeAll(log interface{ Error(string, ...any) }) {
	d.mu.Lock()
	defer d.mu.Unlock()
	for id, r := range d.m {
		if r.busy != nil {
			continue // its machine's cleanup is unmounting it
		}
		delete(d.m, id)
		if err := r.fs.Close(); err != nil {
			log.Error("unmounting a project's disk failed", "project", id, "err", err)
		}
	}
}
