package image

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// The unpacker writes one tar stream into a directory it alone can reach
// (a fresh directory under the store's 0700 tmp/), never following a
// symlink: parents are resolved one component at a time with openat2
// RESOLVE_BENEATH|RESOLVE_NO_SYMLINKS from an O_PATH descriptor of the
// root, and leaves are made with *at calls that do not follow them. It is
// the one place that writes tar entries to disk (layers, and the outer tar
// of an oci-archive).

const (
	whiteoutPrefix = ".wh."
	opaqueMarker   = ".wh..wh..opq"
	// opaqueXattr marks an opaque directory for an overlay mounted with
	// userxattr.
	opaqueXattr  = "user.overlay.opaque"
	paxXattr     = "SCHILY.xattr."
	maxImageID   = IDCount - 1
	holeChunk    = 64 << 10
	resolveFlags = unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS | unix.RESOLVE_NO_XDEV
)

// unpackMode says what kind of tar is unpacked.
type unpackMode int

const (
	// modeLayer: an image layer; owners shifted, whiteouts converted.
	modeLayer unpackMode = iota
	// modePlain: an archive of regular files and directories (an
	// oci-archive); owners and modes not kept (root, 0700/0600).
	modePlain
)

type unpacker struct {
	root  int // O_PATH descriptor of the tree's root
	mode  unpackMode
	shift uint32 // host id of image id 0
	size  int64  // bytes of regular file content written
	limit int64  // most bytes of regular file content allowed
	buf   []byte // copy buffer and a chunk of zeros, made on first use
	zero  []byte
	files int
	dirs  []dirTime
	// cache is the descriptor of the last parent directory resolved.
	cacheName string
	cacheFD   int
}

type dirTime struct {
	name         string
	atime, mtime time.Time
}

func unsafeEntry(name, why string) error {
	return fmt.Errorf("%w: %q: %s", ErrUnsafe, name, why)
}

// unpack writes the tar stream r into the existing, empty directory dir.
// At most limit bytes of file content are written (a larger entry is
// ErrUnsafe).
func unpack(ctx context.Context, r io.Reader, dir string, mode unpackMode, shift uint32, limit int64) (size int64, files int, err error) {
	root, err := unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return 0, 0, fmt.Errorf("image: unpack: %w", &os.PathError{Op: "open", Path: dir, Err: err})
	}
	u := &unpacker{root: root, mode: mode, shift: shift, limit: limit, cacheFD: -1}
	defer u.close()
	if mode == modeLayer {
		// The root of a layer is root's 0755 directory unless the tar
		// says otherwise.
		if err := unix.Fchownat(root, "", int(shift), int(shift), unix.AT_EMPTY_PATH); err != nil {
			return 0, 0, fmt.Errorf("image: unpack: chown root: %w", err)
		}
		if err := unix.Fchmodat(root, ".", 0o755, 0); err != nil {
			return 0, 0, fmt.Errorf("image: unpack: chmod root: %w", err)
		}
	}
	tr := tar.NewReader(r)
	for {
		if err := ctx.Err(); err != nil {
			return 0, 0, err
		}
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return 0, 0, fmt.Errorf("image: unpack: %w", err)
		}
		if err := u.entry(hdr, tr); err != nil {
			return 0, 0, err
		}
	}
	// Directory times last: making their entries changed them.
	for i := len(u.dirs) - 1; i >= 0; i-- {
		d := u.dirs[i]
		if err := u.setTimes(d.name, d.atime, d.mtime); err != nil {
			return 0, 0, err
		}
	}
	return u.size, u.files, nil
}

func (u *unpacker) close() {
	u.dropCache()
	unix.Close(u.root)
}

func (u *unpacker) dropCache() {
	if u.cacheFD >= 0 {
		unix.Close(u.cacheFD)
	}
	u.cacheFD, u.cacheName = -1, ""
}

// cleanName returns the entry name relative to the root ("" for the root
// itself), refusing absolute names and ".." components.
func cleanName(name string) (string, error) {
	if strings.HasPrefix(name, "/") {
		return "", unsafeEntry(name, "absolute path")
	}
	var parts []string
	for _, p := range strings.Split(name, "/") {
		switch p {
		case "", ".":
		case "..":
			return "", unsafeEntry(name, `".." component`)
		default:
			parts = append(parts, p)
		}
	}
	return strings.Join(parts, "/"), nil
}

func split(name string) (dir, base string) {
	i := strings.LastIndexByte(name, '/')
	if i < 0 {
		return "", name
	}
	return name[:i], name[i+1:]
}

// parent returns a descriptor (owned by the cache: do not close) of the
// directory dir beneath the root, creating missing components (0755, owned
// by image root) if create is set. A component that is a symlink, or not
// a directory, is ErrUnsafe naming entry.
func (u *unpacker) parent(entry, dir string, create bool) (int, error) {
	if dir == "" {
		return u.root, nil
	}
	if u.cacheFD >= 0 && u.cacheName == dir {
		return u.cacheFD, nil
	}
	u.dropCache()
	fd, err := unix.Dup(u.root)
	if err != nil {
		return -1, fmt.Errorf("image: unpack: %w", err)
	}
	how := &unix.OpenHow{Flags: unix.O_PATH | unix.O_DIRECTORY | unix.O_CLOEXEC, Resolve: resolveFlags}
	for _, c := range strings.Split(dir, "/") {
		next, err := unix.Openat2(fd, c, how)
		if err == unix.ENOENT && create {
			if err = unix.Mkdirat(fd, c, 0o755); err == nil || err == unix.EEXIST {
				if u.mode == modeLayer {
					if err := unix.Fchownat(fd, c, int(u.shift), int(u.shift), unix.AT_SYMLINK_NOFOLLOW); err != nil {
						unix.Close(fd)
						return -1, fmt.Errorf("image: unpack %q: %w", entry, err)
					}
				}
				next, err = unix.Openat2(fd, c, how)
			}
		}
		unix.Close(fd)
		switch {
		case err == unix.ELOOP:
			return -1, unsafeEntry(entry, "path passes through a symlink")
		case err == unix.ENOTDIR:
			return -1, unsafeEntry(entry, "path passes through a non-directory")
		case err == unix.EXDEV:
			return -1, unsafeEntry(entry, "path escapes the tree")
		case err != nil:
			return -1, fmt.Errorf("image: unpack %q: %w", entry, err)
		}
		fd = next
	}
	u.cacheName, u.cacheFD = dir, fd
	return fd, nil
}

// entry writes one tar entry.
func (u *unpacker) entry(hdr *tar.Header, r io.Reader) error {
	name, err := cleanName(hdr.Name)
	if err != nil {
		return err
	}
	switch hdr.Typeflag {
	case tar.TypeGNUSparse, tar.TypeCont:
		// archive/tar expands a sparse file's holes; a contiguous file
		// is a regular file.
		hdr.Typeflag = tar.TypeReg
	}
	if u.mode == modeLayer && (hdr.Uid < 0 || hdr.Uid > maxImageID || hdr.Gid < 0 || hdr.Gid > maxImageID) {
		return unsafeEntry(hdr.Name, fmt.Sprintf("owner %d:%d outside the image's ids 0..%d", hdr.Uid, hdr.Gid, maxImageID))
	}
	if name == "" {
		if hdr.Typeflag != tar.TypeDir {
			return unsafeEntry(hdr.Name, "the root is not a directory")
		}
		if u.mode == modePlain {
			return nil
		}
		return u.dirMeta(hdr, u.root, name)
	}
	dir, base := split(name)
	if u.mode == modePlain {
		switch hdr.Typeflag {
		case tar.TypeReg, tar.TypeDir:
		default:
			return unsafeEntry(hdr.Name, fmt.Sprintf("entry type %q in an archive of files", hdr.Typeflag))
		}
	}
	pfd, err := u.parent(hdr.Name, dir, true)
	if err != nil {
		return err
	}
	if u.mode == modeLayer && strings.HasPrefix(base, whiteoutPrefix) {
		return u.whiteout(hdr.Name, pfd, dir, base)
	}
	switch hdr.Typeflag {
	case tar.TypeChar:
		if hdr.Devmajor == 0 && hdr.Devminor == 0 {
			return u.whiteout(hdr.Name, pfd, dir, whiteoutPrefix+base)
		}
		return nil
	case tar.TypeBlock, tar.TypeFifo:
		return nil
	case tar.TypeDir, tar.TypeReg, tar.TypeSymlink, tar.TypeLink:
	default:
		// Not a file system object (GNU long names and PAX headers are
		// read by archive/tar); nothing to write.
		return nil
	}
	// Replace what an earlier entry left at the name, except that a
	// directory merges with a directory.
	var st unix.Stat_t
	if err := unix.Fstatat(pfd, base, &st, unix.AT_SYMLINK_NOFOLLOW); err == nil {
		if hdr.Typeflag == tar.TypeDir && st.Mode&unix.S_IFMT == unix.S_IFDIR {
			d, err := u.openDir(hdr.Name, pfd, base)
			if err != nil {
				return err
			}
			defer unix.Close(d)
			return u.dirMeta(hdr, d, name)
		}
		if err := u.removeAt(hdr.Name, pfd, dir, base, st.Mode&unix.S_IFMT == unix.S_IFDIR); err != nil {
			return err
		}
		// removeAt may have dropped the cache.
		if pfd, err = u.parent(hdr.Name, dir, false); err != nil {
			return err
		}
	} else if err != unix.ENOENT {
		return fmt.Errorf("image: unpack %q: %w", hdr.Name, err)
	}
	switch hdr.Typeflag {
	case tar.TypeDir:
		if err := unix.Mkdirat(pfd, base, 0o700); err != nil {
			return fmt.Errorf("image: unpack %q: %w", hdr.Name, err)
		}
		d, err := u.openDir(hdr.Name, pfd, base)
		if err != nil {
			return err
		}
		defer unix.Close(d)
		return u.dirMeta(hdr, d, name)
	case tar.TypeReg:
		return u.regular(hdr, r, pfd, base)
	case tar.TypeSymlink:
		if err := unix.Symlinkat(hdr.Linkname, pfd, base); err != nil {
			return fmt.Errorf("image: unpack %q: %w", hdr.Name, err)
		}
		if err := unix.Fchownat(pfd, base, u.uid(hdr), u.gid(hdr), unix.AT_SYMLINK_NOFOLLOW); err != nil {
			return fmt.Errorf("image: unpack %q: %w", hdr.Name, err)
		}
		return u.setTimesAt(hdr.Name, pfd, base, hdr.AccessTime, hdr.ModTime)
	case tar.TypeLink:
		return u.hardlink(hdr, pfd, base)
	}
	return nil
}

func (u *unpacker) uid(hdr *tar.Header) int { return int(u.shift) + hdr.Uid }
func (u *unpacker) gid(hdr *tar.Header) int { return int(u.shift) + hdr.Gid }

func (u *unpacker) openDir(entry string, pfd int, base string) (int, error) {
	d, err := unix.Openat(pfd, base, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, fmt.Errorf("image: unpack %q: %w", entry, err)
	}
	return d, nil
}

// dirMeta sets a directory's owner, mode and xattrs through its open
// descriptor d (or the root's) and queues its times.
func (u *unpacker) dirMeta(hdr *tar.Header, d int, name string) error {
	if u.mode == modeLayer {
		fd := d
		if d == u.root {
			var err error
			if fd, err = unix.Openat(u.root, ".", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0); err != nil {
				return fmt.Errorf("image: unpack %q: %w", hdr.Name, err)
			}
			defer unix.Close(fd)
		}
		if err := u.meta(hdr, fd); err != nil {
			return err
		}
		u.dirs = append(u.dirs, dirTime{name: name, atime: hdr.AccessTime, mtime: hdr.ModTime})
	}
	return nil
}

// meta sets owner, mode (after the owner: chown clears set-id bits) and
// the kept xattrs of the open file fd.
func (u *unpacker) meta(hdr *tar.Header, fd int) error {
	if err := unix.Fchown(fd, u.uid(hdr), u.gid(hdr)); err != nil {
		return fmt.Errorf("image: unpack %q: %w", hdr.Name, err)
	}
	if err := unix.Fchmod(fd, uint32(hdr.Mode&0o7777)); err != nil {
		return fmt.Errorf("image: unpack %q: %w", hdr.Name, err)
	}
	for k, v := range hdr.PAXRecords {
		x, ok := strings.CutPrefix(k, paxXattr)
		if !ok || !keepXattr(x) {
			continue
		}
		if err := unix.Fsetxattr(fd, x, []byte(v), 0); err != nil {
			return fmt.Errorf("image: unpack %q: xattr %s: %w", hdr.Name, x, err)
		}
	}
	return nil
}

// keepXattr says whether an image's xattr is kept: user.* only, and not
// user.overlay.* (the machine's overlay reads those).
func keepXattr(name string) bool {
	return strings.HasPrefix(name, "user.") && !strings.HasPrefix(name, "user.overlay.")
}

func (u *unpacker) regular(hdr *tar.Header, r io.Reader, pfd int, base string) error {
	fd, err := unix.Openat(pfd, base, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return fmt.Errorf("image: unpack %q: %w", hdr.Name, err)
	}
	f := os.NewFile(uintptr(fd), base)
	defer f.Close()
	if hdr.Size > u.limit-u.size {
		return unsafeEntry(hdr.Name, fmt.Sprintf("unpacks to more than %d bytes", u.limit))
	}
	n, err := u.copyHoles(f, r)
	if err != nil {
		return fmt.Errorf("image: unpack %q: %w", hdr.Name, err)
	}
	u.size += n
	u.files++
	if u.mode == modePlain {
		return nil
	}
	if err := u.meta(hdr, fd); err != nil {
		return err
	}
	return u.setTimesAt(hdr.Name, pfd, base, hdr.AccessTime, hdr.ModTime)
}

// copyHoles copies r to the new file f, leaving holes where r has runs of
// zeros a chunk long: a sparse entry (a 10 KiB tar can hold a file of a
// terabyte of zeros) takes no more disk than its data.
func (u *unpacker) copyHoles(f *os.File, r io.Reader) (int64, error) {
	if u.buf == nil {
		u.buf, u.zero = make([]byte, holeChunk), make([]byte, holeChunk)
	}
	var off int64
	hole := false
	for {
		n, err := io.ReadFull(r, u.buf)
		if n > 0 {
			hole = bytes.Equal(u.buf[:n], u.zero[:n])
			if !hole {
				if _, werr := f.WriteAt(u.buf[:n], off); werr != nil {
					return off, werr
				}
			}
			off += int64(n)
		}
		if err == io.EOF || err == io.ErrUnexpectedEOF {
			break
		}
		if err != nil {
			return off, err
		}
	}
	if hole {
		return off, f.Truncate(off)
	}
	return off, nil
}

// hardlink links base to an earlier entry of the tree, resolved beneath
// the root without following symlinks.
func (u *unpacker) hardlink(hdr *tar.Header, pfd int, base string) error {
	target, err := cleanName(hdr.Linkname)
	if err != nil || target == "" {
		return unsafeEntry(hdr.Name, fmt.Sprintf("hard link target %q outside the tree", hdr.Linkname))
	}
	// pfd is the cache; take our own descriptor of the link's parent.
	lfd, err := unix.Dup(pfd)
	if err != nil {
		return fmt.Errorf("image: unpack %q: %w", hdr.Name, err)
	}
	defer unix.Close(lfd)
	tdir, tbase := split(target)
	tfd, err := u.parent(hdr.Name, tdir, false)
	if errors.Is(err, unix.ENOENT) {
		return unsafeEntry(hdr.Name, fmt.Sprintf("hard link to %q, which the tree does not hold", hdr.Linkname))
	}
	if err != nil {
		return err
	}
	var st unix.Stat_t
	if err := unix.Fstatat(tfd, tbase, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return unsafeEntry(hdr.Name, fmt.Sprintf("hard link to %q, which the tree does not hold", hdr.Linkname))
	}
	if st.Mode&unix.S_IFMT == unix.S_IFDIR {
		return unsafeEntry(hdr.Name, "hard link to a directory")
	}
	// linkat without AT_SYMLINK_FOLLOW links a symlink itself.
	if err := unix.Linkat(tfd, tbase, lfd, base, 0); err != nil {
		return fmt.Errorf("image: unpack %q: %w", hdr.Name, err)
	}
	return nil
}

// whiteout hides name (base with the whiteout prefix) of the lower layers,
// or makes dir opaque.
func (u *unpacker) whiteout(entry string, pfd int, dir, base string) error {
	if base == opaqueMarker {
		d, err := unix.Openat(pfd, ".", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("image: unpack %q: %w", entry, err)
		}
		defer unix.Close(d)
		if err := unix.Fsetxattr(d, opaqueXattr, []byte("y"), 0); err != nil {
			return fmt.Errorf("image: unpack %q: opaque: %w", entry, err)
		}
		return nil
	}
	name := strings.TrimPrefix(base, whiteoutPrefix)
	if name == "" || name == "." || name == ".." {
		return unsafeEntry(entry, "whiteout of no name")
	}
	var st unix.Stat_t
	if err := unix.Fstatat(pfd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err == nil {
		// The layer itself holds name: a whiteout hides only lower
		// layers, so name stays; a directory of this layer must not
		// merge with the lower one it replaces.
		if st.Mode&unix.S_IFMT == unix.S_IFDIR {
			d, err := u.openDir(entry, pfd, name)
			if err != nil {
				return err
			}
			defer unix.Close(d)
			if err := unix.Fsetxattr(d, opaqueXattr, []byte("y"), 0); err != nil {
				return fmt.Errorf("image: unpack %q: opaque: %w", entry, err)
			}
		}
		return nil
	}
	if err := unix.Mknodat(pfd, name, unix.S_IFCHR, 0); err != nil {
		return fmt.Errorf("image: unpack %q: whiteout: %w", entry, err)
	}
	if err := unix.Fchownat(pfd, name, int(u.shift), int(u.shift), unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return fmt.Errorf("image: unpack %q: whiteout: %w", entry, err)
	}
	return nil
}

// removeAt removes what is at base in dir, a tree if isDir.
func (u *unpacker) removeAt(entry string, pfd int, dir, base string, isDir bool) error {
	if !isDir {
		if err := unix.Unlinkat(pfd, base, 0); err != nil {
			return fmt.Errorf("image: unpack %q: %w", entry, err)
		}
		return nil
	}
	u.dropCache()
	// The tree is private (under the store's 0700 tmp/) and its parents
	// were just resolved without symlinks; os.RemoveAll does not follow
	// symlinks inside it.
	if err := os.RemoveAll(fmt.Sprintf("/proc/self/fd/%d/%s", u.root, path.Join(dir, base))); err != nil {
		return fmt.Errorf("image: unpack %q: %w", entry, err)
	}
	return nil
}

func (u *unpacker) setTimes(name string, atime, mtime time.Time) error {
	if name == "" {
		return u.setTimesAt(name, u.root, ".", atime, mtime)
	}
	dir, base := split(name)
	pfd, err := u.parent(name, dir, false)
	if err != nil {
		return err
	}
	return u.setTimesAt(name, pfd, base, atime, mtime)
}

func (u *unpacker) setTimesAt(entry string, pfd int, base string, atime, mtime time.Time) error {
	if atime.IsZero() {
		atime = mtime
	}
	ts := []unix.Timespec{unix.NsecToTimespec(atime.UnixNano()), unix.NsecToTimespec(mtime.UnixNano())}
	if err := unix.UtimesNanoAt(pfd, base, ts, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return fmt.Errorf("image: unpack %q: times: %w", entry, err)
	}
	return nil
}
