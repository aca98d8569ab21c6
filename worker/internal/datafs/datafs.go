// Package datafs makes, checks, resizes and loop-mounts ext4 filesystem
// images: a worker's per-project disks. A project's home (and upper layer)
// live on a filesystem of the project's own, in a sparse image file whose
// size is the project's disk limit, so that a write past the limit fails
// with ENOSPC inside that filesystem and the host filesystem holding the
// image grows by at most the image's size (only written blocks take
// space).
//
// (Project quotas on one shared filesystem would be cheaper — one mount —
// but need the kernel's quota formats (CONFIG_QFMT_V2 for ext4,
// CONFIG_XFS_QUOTA), which the kernels corral runs on may lack.)
//
// The loop device is attached with LO_FLAGS_AUTOCLEAR: it detaches itself
// when the filesystem is no longer mounted anywhere (Close unmounts it;
// mount namespaces copied while it was mounted keep it until they go).
package datafs

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// BytesPerInode is the images' inode ratio (mkfs.ext4 -i): one inode per
// 4 KiB, so that small files exhaust space about when they exhaust inodes.
const BytesPerInode = 4096

// MinSize is the smallest image Open makes: below it ext4's own metadata
// (its journal above all) leaves little room.
const MinSize = 8 << 20

// FS is a mounted filesystem image.
type FS struct {
	// Dir is where it is mounted.
	Dir string
	// Image is its image file.
	Image string
	// Size is the image's size in bytes, as mounted.
	Size int64
	// Created tells whether Open made the image (mkfs ran).
	Created bool
	// Resized tells whether Open changed the image's size.
	Resized bool
	// Reused tells whether it was already mounted (a previous worker left
	// it mounted) and Open only took it over, as it was.
	Reused bool
}

// Open mounts the ext4 filesystem of the image file at dir (created as
// needed, 0700; nosuid, nodev), making the image first if it does not
// exist: a sparse file of size bytes (at least MinSize) and mkfs.ext4.
// An image of another size is resized to size first (e2fsck -f, then
// resize2fs); a shrink that does not fit the data keeps the image's size
// and is reported by Resized false and Size. An image the kernel recorded
// errors in is checked (e2fsck -f -p) before it is mounted; a check that
// cannot repair it fails Open. If dir is already the mount of that very image (a previous
// worker's mount left behind), it is used as it is. Open needs root,
// e2fsprogs and loop devices.
func Open(image, dir string, size int64) (*FS, error) {
	size = max(size, MinSize)
	fs := &FS{Dir: dir, Image: image}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("datafs: %w", err)
	}
	if mounted, err := mountedFrom(dir, image); err != nil {
		return nil, err
	} else if mounted {
		fs.Reused = true
		st, err := os.Stat(image)
		if err != nil {
			return nil, fmt.Errorf("datafs: %w", err)
		}
		fs.Size = st.Size()
		return fs, nil
	}
	st, err := os.Stat(image)
	switch {
	case errors.Is(err, os.ErrNotExist):
		if err := mkfs(image, size); err != nil {
			return nil, err
		}
		fs.Created, fs.Size = true, size
	case err != nil:
		return nil, fmt.Errorf("datafs: %w", err)
	case st.Size() != size:
		fs.Size = st.Size()
		if err := e2fsck(image, "-f", "-p"); err != nil {
			return nil, err
		}
		if err := resize(image, st.Size(), size); err == nil {
			fs.Size, fs.Resized = size, true
		} else if size > st.Size() {
			return nil, err
		} // else: the data does not fit the smaller size; keep it.
	default:
		// No check: ext4's journal makes an unclean unmount (a crash)
		// consistent at mount, and e2fsck -p would cost about 15 ms a
		// start. A filesystem the kernel found errors in is checked.
		fs.Size = st.Size()
		if hasErrors(image) {
			if err := e2fsck(image, "-f", "-p"); err != nil {
				return nil, err
			}
		}
	}
	if err := mount(image, dir); err != nil {
		return nil, err
	}
	return fs, nil
}

// hasErrors tells whether the image's superblock records errors
// (s_state's EXT4_ERROR_FS bit, or a recorded error count): the kernel
// found an inconsistency while it was mounted. Unreadable counts as yes.
func hasErrors(image string) bool {
	f, err := os.Open(image)
	if err != nil {
		return true
	}
	defer f.Close()
	sb := make([]byte, 1024)
	if _, err := f.ReadAt(sb, 1024); err != nil {
		return true
	}
	const magic, state, errorCount = 0x38, 0x3a, 0x194
	if sb[magic] != 0x53 || sb[magic+1] != 0xef {
		return true
	}
	return sb[state]&2 != 0 || sb[errorCount]|sb[errorCount+1]|sb[errorCount+2]|sb[errorCount+3] != 0
}

func e2fsck(image string, args ...string) error {
	out, err := exec.Command("e2fsck", append(args, image)...).CombinedOutput()
	// Exit status 1 is "errors corrected"; 2 "corrected, reboot".
	var ee *exec.ExitError
	if err != nil && (!errors.As(err, &ee) || ee.ExitCode() > 2) {
		return fmt.Errorf("datafs: e2fsck %s: %w: %s", image, err, bytes.TrimSpace(out))
	}
	return nil
}

// resize changes an unmounted, checked image from old to size bytes.
func resize(image string, old, size int64) error {
	if size > old {
		if err := os.Truncate(image, size); err != nil {
			return fmt.Errorf("datafs: %w", err)
		}
	}
	out, err := exec.Command("resize2fs", image, strconv.FormatInt(size/1024, 10)+"K").CombinedOutput()
	if err != nil {
		return fmt.Errorf("datafs: resize2fs %s: %w: %s", image, err, bytes.TrimSpace(out))
	}
	if size < old {
		if err := os.Truncate(image, size); err != nil {
			return fmt.Errorf("datafs: %w", err)
		}
	}
	return nil
}

func mkfs(image string, size int64) error {
	f, err := os.OpenFile(image, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return fmt.Errorf("datafs: %w", err)
	}
	err = f.Truncate(size)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		var out []byte
		out, err = exec.Command("mkfs.ext4", "-q", "-F", "-m", "0",
			"-i", strconv.Itoa(BytesPerInode), "-E", "lazy_itable_init=1,lazy_journal_init=1",
			image).CombinedOutput()
		if err != nil {
			err = fmt.Errorf("mkfs.ext4: %w: %s", err, bytes.TrimSpace(out))
		}
	}
	if err != nil {
		os.Remove(image)
		return fmt.Errorf("datafs: creating %s: %w", image, err)
	}
	return nil
}

// mount attaches image to a free loop device (autoclear) and mounts it at
// dir.
func mount(image, dir string) error {
	img, err := os.OpenFile(image, os.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("datafs: %w", err)
	}
	defer img.Close()
	ctl, err := os.OpenFile("/dev/loop-control", os.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("datafs: %w", err)
	}
	defer ctl.Close()
	for range 16 {
		n, err := unix.IoctlRetInt(int(ctl.Fd()), unix.LOOP_CTL_GET_FREE)
		if err != nil {
			return fmt.Errorf("datafs: LOOP_CTL_GET_FREE: %w", err)
		}
		dev := "/dev/loop" + strconv.Itoa(n)
		loop, err := os.OpenFile(dev, os.O_RDWR|unix.O_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("datafs: %w", err)
		}
		cfg := unix.LoopConfig{Fd: uint32(img.Fd())}
		cfg.Info.Flags = unix.LO_FLAGS_AUTOCLEAR
		copy(cfg.Info.File_name[:], image)
		if err := unix.IoctlLoopConfigure(int(loop.Fd()), &cfg); err != nil {
			loop.Close()
			if errors.Is(err, unix.EBUSY) {
				continue // taken by someone else meanwhile
			}
			return fmt.Errorf("datafs: LOOP_CONFIGURE %s: %w", dev, err)
		}
		err = unix.Mount(dev, dir, "ext4", unix.MS_NOSUID|unix.MS_NODEV, "")
		// With the mount holding the device, closing it leaves the
		// detach to the kernel (autoclear) once the filesystem is gone;
		// without, closing it detaches it now.
		loop.Close()
		if err != nil {
			return fmt.Errorf("datafs: mounting %s (%s) on %s: %w", image, dev, dir, err)
		}
		return nil
	}
	return errors.New("datafs: no free loop device")
}

// mountedFrom tells whether dir is the mount of a loop device backed by
// image.
func mountedFrom(dir, image string) (bool, error) {
	dev, ok, err := mountSource(dir)
	if err != nil || !ok {
		return false, err
	}
	name := strings.TrimPrefix(dev, "/dev/")
	if !strings.HasPrefix(name, "loop") {
		return false, fmt.Errorf("datafs: %s is already a mount of %s", dir, dev)
	}
	b, err := os.ReadFile("/sys/block/" + name + "/loop/backing_file")
	if err != nil {
		return false, fmt.Errorf("datafs: %s: %w", dir, err)
	}
	abs, _ := filepath.Abs(image)
	if got := strings.TrimSpace(string(b)); got != abs {
		return false, fmt.Errorf("datafs: %s is already a mount of %s (%s), not of %s", dir, dev, got, abs)
	}
	return true, nil
}

// mountSource returns the source of the topmost mount at dir in this
// process's mount namespace.
func mountSource(dir string) (string, bool, error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return "", false, err
	}
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return "", false, err
	}
	defer f.Close()
	src, found := "", false
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 10 || unescape(fields[4]) != abs {
			continue
		}
		for i, f := range fields {
			if f == "-" && i+2 < len(fields) {
				src, found = fields[i+2], true // later lines are above
			}
		}
	}
	return src, found, sc.Err()
}

func unescape(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// Close unmounts the filesystem (lazily if it is busy); the loop device
// detaches itself once no mount namespace holds the filesystem. It is
// idempotent.
func (fs *FS) Close() error {
	err := unix.Unmount(fs.Dir, 0)
	if errors.Is(err, unix.EBUSY) {
		err = unix.Unmount(fs.Dir, unix.MNT_DETACH)
	}
	if errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOENT) {
		return nil // not mounted
	}
	if err != nil {
		return fmt.Errorf("datafs: unmounting %s: %w", fs.Dir, err)
	}
	return nil
}
