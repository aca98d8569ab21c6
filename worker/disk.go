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
		m.disk, m.diskMnt = r, mnt
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
	m.disk, m.diskMnt = r, mnt
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
		if err := m.migrate(home, mnt); err != nil {
			_ = fs.Close()
			os.Remove(image)
			return nil, err
		}
	}
	// A reset while no machine ran left its mark beside the image.
	if _, err := os.Stat(image + ".reset"); err == nil {
		layer := filepath.Join(mnt, "layer")
		if err := errors.Join(os.RemoveAll(layer), os.RemoveAll(layer+".image")); err != nil {
			_ = fs.Close()
			return nil, fmt.Errorf("disk: reset: %w", err)
		}
		if err := os.Remove(image + ".reset"); err != nil {
			_ = fs.Close()
			return nil, fmt.Errorf("disk: reset: %w", err)
		}
		m.w.log.Info("upper layer reset on the project's disk", "project", m.id)
	}
	if err := os.MkdirAll(home, 0o700); err != nil {
		_ = fs.Close()
		return nil, fmt.Errorf("disk: %w", err)
	}
	return fs, nil
}

// migrate moves the project's host home and upper layer, if any, onto its
// new disk mounted at mnt.
func (m *machine) migrate(home, mnt string) error {
	layer := filepath.Join(mnt, "layer")
	for _, mv := range [][2]string{
		{filepath.Join(m.w.cfg.HomesRoot, strconv.FormatInt(m.id, 10)), home},
		{m.w.projectDir(m.id), layer},
		{m.w.projectDir(m.id) + ".image", layer + ".image"},
	} {
		if err := m.moveOnto(mv[0], mv[1]); err != nil {
			return err
		}
	}
	return nil
}

// moveOnto copies old, if it exists, to dst on the disk, then removes it.
func (m *machine) moveOnto(old, dst string) error {
	if _, err := os.Lstat(old); errors.Is(err, os.ErrNotExist) {
		return nil
	}
	// cp -a keeps owners, modes, times, links, device nodes (overlay
	// whiteouts) and xattrs; the copy is renamed into place so that a
	// failed one leaves nothing half made.
	tmp := dst + ".migrating"
	if out, err := exec.Command("cp", "-a", "--no-dereference", old, tmp).CombinedOutput(); err != nil {
		return fmt.Errorf("disk: moving %s onto the project's disk (limit %d bytes): %w: %s", old, m.lim.Disk, err, bytes.TrimSpace(out))
	}
	if err := os.Rename(tmp, dst); err != nil {
		return fmt.Errorf("disk: %w", err)
	}
	if err := os.RemoveAll(old); err != nil {
		m.w.log.Warn("a host directory moved onto the project's disk could not be removed", "project", m.id, "path", old, "err", err)
	}
	m.w.log.Info("moved onto the project's disk", "project", m.id, "path", old)
	return nil
}

// layerDir is the directory of the machine's upper layer: on its disk if
// it has one, else under StateDir (see projectDir).
func (m *machine) layerDir() string {
	if m.diskMnt != "" {
		return filepath.Join(m.diskMnt, "layer")
	}
	return m.w.projectDir(m.id)
}

// resetDisk marks project id's disk, if it has one, for its upper layer's
// removal at its next mount (no machine of the project runs: its disk is
// not mounted).
func (w *Worker) resetDisk(id int64) error {
	image, _ := w.disks.paths(id)
	if _, err := os.Stat(image); errors.Is(err, os.ErrNotExist) {
		return nil
	}
	return os.WriteFile(image+".reset", nil, 0o600)
}

// closeDisk releases the machine's disk: unmounted (its loop device then
// detaches itself) when no machine of the project holds it.
func (m *machine) closeDisk() {
	d := m.w.disks
	d.mu.Lock()
	r := m.disk
	m.disk, m.diskMnt = nil, ""
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
