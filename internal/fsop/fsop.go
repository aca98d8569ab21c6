// Package fsop performs file operations inside a directory tree that
// another party controls (a machine's root filesystem, a host project's
// workspace), as one of that party's users: every path is resolved with
// openat2(2) under RESOLVE_IN_ROOT and RESOLVE_NO_MAGICLINKS against a
// root descriptor, so that no symlink and no ".." leads out of the tree and
// no /proc magic link is followed; files of procfs, sysfs and cgroupfs are
// refused; and, run through [Run], every system call is checked against
// the user's ids and not the caller's.
//
// It imports no project package: the worker (a machine's files) and the
// host provider (a host project's workspace) share it.
package fsop

import (
	"container/heap"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/corral-sandbox/corral/internal/errdefs"
)

// Cred is whom operations run as: host ids.
type Cred struct {
	UID, GID uint32
	// Groups are the supplementary groups.
	Groups []uint32
	// Override keeps CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH and
	// CAP_FOWNER (a machine's guest root, whose capabilities cover the
	// files of its own id range): a Root used with it should be limited
	// to that range with Root.Owners.
	Override bool
}

// Run runs f on a new OS thread whose ids are c's (real, effective and
// filesystem uid and gid, supplementary groups; the saved ids stay the
// caller's) and which has no capability, and returns
// f's error. The thread is never given back to the Go scheduler: it ends
// with f, and its credentials with it. The caller must be root (it needs
// CAP_SETUID and CAP_SETGID); f must not start goroutines that expect to
// share its credentials. A nil c runs f with the caller's credentials, on
// the calling goroutine.
func Run(c *Cred, f func() error) error {
	if c == nil {
		return f()
	}
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		// No UnlockOSThread: the runtime terminates the thread.
		if err := become(c); err != nil {
			errc <- err
			return
		}
		errc <- f()
	}()
	return <-errc
}

// become sets the calling thread's credentials (raw system calls: the Go
// wrappers of setgroups and friends change every thread of the process).
func become(c *Cred) error {
	groups := c.Groups
	var p unsafe.Pointer
	if len(groups) > 0 {
		p = unsafe.Pointer(&groups[0])
	}
	if _, _, e := unix.RawSyscall(unix.SYS_SETGROUPS, uintptr(len(groups)), uintptr(p), 0); e != 0 {
		return fmt.Errorf("fsop: setgroups: %w", e)
	}
	// The real and effective ids too, the saved ones staying 0 (so that
	// the permitted capabilities survive for capset below): the kernel
	// charges what the thread creates (an inotify instance and its
	// watches) to its real uid, which must be the user's, never host
	// root's (fs.inotify.max_user_instances is per user).
	const keep = ^uintptr(0)
	if _, _, e := unix.RawSyscall(unix.SYS_SETRESGID, uintptr(c.GID), uintptr(c.GID), keep); e != 0 {
		return fmt.Errorf("fsop: setresgid: %w", e)
	}
	if _, _, e := unix.RawSyscall(unix.SYS_SETRESUID, uintptr(c.UID), uintptr(c.UID), keep); e != 0 {
		return fmt.Errorf("fsop: setresuid: %w", e)
	}
	unix.RawSyscall(unix.SYS_SETFSGID, uintptr(c.GID), 0, 0)
	unix.RawSyscall(unix.SYS_SETFSUID, uintptr(c.UID), 0, 0)
	// setfs[ug]id report the previous id; asking with an invalid id
	// reports the current one without changing it.
	if r, _, _ := unix.RawSyscall(unix.SYS_SETFSUID, ^uintptr(0), 0, 0); uint32(r) != c.UID {
		return fmt.Errorf("fsop: setfsuid %d did not take", c.UID)
	}
	if r, _, _ := unix.RawSyscall(unix.SYS_SETFSGID, ^uintptr(0), 0, 0); uint32(r) != c.GID {
		return fmt.Errorf("fsop: setfsgid %d did not take", c.GID)
	}
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var none [2]unix.CapUserData
	if c.Override {
		keep := uint32(1<<unix.CAP_DAC_OVERRIDE | 1<<unix.CAP_DAC_READ_SEARCH | 1<<unix.CAP_FOWNER)
		none[0].Effective, none[0].Permitted = keep, keep
	}
	if err := unix.Capset(&hdr, &none[0]); err != nil {
		return fmt.Errorf("fsop: capset: %w", err)
	}
	return nil
}

// Error codes, as [Code] reports them (protocol 2 uses the same strings).
const (
	CodeNotFound     = "not-found"
	CodePermission   = "permission-denied"
	CodeExists       = "exists"
	CodeNotDirectory = "not-directory"
	CodeIsDirectory  = "is-directory"
	CodeNotEmpty     = "not-empty"
	CodeNoSpace      = "no-space"
	CodeBadPath      = "bad-path"
	CodeFileFailed   = "file-failed"
)

// ErrBadPath is returned (wrapped) for a path that is not clean, that
// leads through a magic link, or into procfs, sysfs or cgroupfs, or that
// names a file of the wrong kind for the operation.
var ErrBadPath = errors.New("fsop: path refused")

// Code classifies err as one of the Code constants.
func Code(err error) string {
	var errno unix.Errno
	switch {
	case err == nil:
		return ""
	case errors.Is(err, ErrBadPath):
		return CodeBadPath
	case errors.As(err, &errno):
		switch errno {
		case unix.ENOENT:
			return CodeNotFound
		case unix.EACCES, unix.EPERM, unix.EROFS:
			return CodePermission
		case unix.EEXIST:
			return CodeExists
		case unix.ENOTDIR:
			return CodeNotDirectory
		case unix.EISDIR:
			return CodeIsDirectory
		case unix.ENOTEMPTY:
			return CodeNotEmpty
		case unix.ENOSPC, unix.EDQUOT, unix.EFBIG:
			return CodeNoSpace
		case unix.ELOOP, unix.EXDEV, unix.ENAMETOOLONG:
			return CodeBadPath
		}
	}
	return CodeFileFailed
}

// codeClass is the class (package internal/errdefs) of each Code that has
// one: what the HTTP edge answers for a host project's files.
var codeClass = map[string]errdefs.Kind{
	CodeNotFound:     errdefs.NotFound,
	CodePermission:   errdefs.Forbidden,
	CodeExists:       errdefs.Conflict,
	CodeNotEmpty:     errdefs.Conflict,
	CodeNotDirectory: errdefs.Invalid,
	CodeIsDirectory:  errdefs.Invalid,
	CodeBadPath:      errdefs.Invalid,
	CodeNoSpace:      errdefs.NoSpace,
}

// Classify returns err classified by its Code (not found, forbidden,
// conflict, invalid, no space); an error of no such code (CodeFileFailed)
// is returned as it is, and nil stays nil.
func Classify(err error) error {
	if k, ok := codeClass[Code(err)]; ok {
		return errdefs.Wrap(err, k)
	}
	return err
}

// Clean checks that p is a clean relative path inside a root ("" is the
// root itself): no empty, "." or ".." component, no NUL, no leading slash.
func Clean(p string) error {
	if p == "" {
		return nil
	}
	if strings.IndexByte(p, 0) >= 0 || strings.HasPrefix(p, "/") || path.Clean(p) != p {
		return fmt.Errorf("%w: %q is not a clean path", ErrBadPath, p)
	}
	for _, c := range strings.Split(p, "/") {
		if c == "." || c == ".." {
			return fmt.Errorf("%w: %q has a %q component", ErrBadPath, p, c)
		}
	}
	return nil
}

// Root is a directory the operations resolve paths in. Its methods are
// safe for concurrent use; each call resolves its path anew.
type Root struct {
	fd int
	// owners, when set, is the id range [start, end) that every file an
	// operation opens must be owned by (uid and gid): see Owners.
	owners *[2]uint32
}

// Owners limits r to files owned (uid and gid) by ids in [start,
// start+size): any other is refused with EACCES when an operation opens
// it. With Cred.Override this keeps a machine's guest root's capability
// override within the files its namespace maps, as the kernel does in the
// machine. Call it before using r.
func (r *Root) Owners(start, size uint32) { r.owners = &[2]uint32{start, start + size} }

// checkOwner applies Owners to the file fd.
func (r *Root) checkOwner(fd int) error {
	if r.owners == nil {
		return nil
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return err
	}
	in := func(id uint32) bool { return id >= r.owners[0] && id < r.owners[1] }
	if !in(st.Uid) || !in(st.Gid) {
		return unix.EACCES
	}
	return nil
}

// OpenRoot opens dir (a host path, resolved with the caller's
// credentials) as a Root.
func OpenRoot(dir string) (*Root, error) {
	fd, err := unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, &fs.PathError{Op: "open", Path: dir, Err: err}
	}
	return &Root{fd: fd}, nil
}

// Limited returns a Root sharing r's descriptor (r still owns it: close
// only r) limited by Owners(start, size).
func (r *Root) Limited(start, size uint32) *Root {
	l := &Root{fd: r.fd}
	l.Owners(start, size)
	return l
}

// Close closes r. Idempotent.
func (r *Root) Close() error {
	if r.fd < 0 {
		return nil
	}
	err := unix.Close(r.fd)
	r.fd = -1
	return err
}

// resolveFlags are the openat2 resolution flags of every path.
const resolveFlags = unix.RESOLVE_IN_ROOT | unix.RESOLVE_NO_MAGICLINKS

// open resolves rel in r with flags and checks the file system it landed
// on.
func (r *Root) open(rel string, flags int, mode uint32) (int, error) {
	if err := Clean(rel); err != nil {
		return -1, err
	}
	name := rel
	if name == "" {
		name = "."
	}
	fd, err := unix.Openat2(r.fd, name, &unix.OpenHow{Flags: uint64(flags | unix.O_CLOEXEC), Mode: uint64(mode), Resolve: resolveFlags})
	if err != nil {
		return -1, &fs.PathError{Op: "open", Path: "/" + rel, Err: err}
	}
	if err := checkFS(fd); err != nil {
		unix.Close(fd)
		return -1, fmt.Errorf("%w: /%s is in a kernel file system", ErrBadPath, rel)
	}
	if err := r.checkOwner(fd); err != nil {
		unix.Close(fd)
		return -1, &fs.PathError{Op: "open", Path: "/" + rel, Err: err}
	}
	return fd, nil
}

// checkFS refuses descriptors of procfs, sysfs and cgroupfs: their files
// are views of processes and of the kernel, not of the tree.
func checkFS(fd int) error {
	var st unix.Statfs_t
	if err := unix.Fstatfs(fd, &st); err != nil {
		return err
	}
	switch st.Type {
	case unix.PROC_SUPER_MAGIC, unix.SYSFS_MAGIC, unix.CGROUP_SUPER_MAGIC, unix.CGROUP2_SUPER_MAGIC,
		unix.DEBUGFS_MAGIC, unix.SECURITYFS_MAGIC, unix.TRACEFS_MAGIC, unix.BPF_FS_MAGIC:
		return ErrBadPath
	}
	return nil
}

// parent opens rel's directory (O_PATH) and returns it with rel's last
// component; rel must not be the root.
func (r *Root) parent(rel string) (int, string, error) {
	if err := Clean(rel); err != nil {
		return -1, "", err
	}
	if rel == "" {
		return -1, "", fmt.Errorf("%w: the operation needs a path below the root", ErrBadPath)
	}
	dir, base := path.Split(rel)
	fd, err := r.open(strings.TrimSuffix(dir, "/"), unix.O_PATH|unix.O_DIRECTORY, 0)
	return fd, base, err
}

// Stat describes a file.
type Stat struct {
	// Name is the file's last path component; Rel its path in the root.
	Name, Rel string
	// Type is "file", "dir", "symlink" or "other".
	Type string
	Size int64
	// Mode is the permission, set-id and sticky bits.
	Mode uint32
	// MTime is in nanoseconds since the Unix epoch.
	MTime int64
	// Target is a symlink's.
	Target string
}

func makeStat(rel string, st *unix.Stat_t) Stat {
	s := Stat{Name: path.Base("/" + rel), Rel: rel, Size: st.Size, Mode: st.Mode & 0o7777, MTime: st.Mtim.Nano()}
	if rel == "" {
		s.Name = "/"
	}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFREG:
		s.Type = "file"
	case unix.S_IFDIR:
		s.Type = "dir"
	case unix.S_IFLNK:
		s.Type = "symlink"
	default:
		s.Type = "other"
	}
	return s
}

// Read opens rel, a regular file (a final symlink is followed inside the
// root), for reading. It looks before it opens: a FIFO or a device is
// refused without being opened (opening one may block or act), and the
// file opened must be the one looked at. A file replaced between the look
// and the open (a writer renaming a new version over it) is looked at
// again, up to 64 times (each a few system calls), so that a reader racing
// atomic replacements gets one whole version; a writer renaming in a tight
// loop wins a look-then-open window a fifth of the time on a loaded host,
// and only such a writer can make Read fail, with ErrBadPath.
func (r *Root) Read(rel string) (*os.File, Stat, error) {
	const attempts = 64
	for i := 1; ; i++ {
		f, st, err := r.read(rel)
		if errors.Is(err, errChanged) && i < attempts {
			continue
		}
		return f, st, err
	}
}

// errChanged is read's report that the file opened is not the one looked at.
var errChanged = errors.New("changed while it was opened")

func (r *Root) read(rel string) (*os.File, Stat, error) {
	pfd, err := r.open(rel, unix.O_PATH, 0)
	if err != nil {
		return nil, Stat{}, err
	}
	var pst unix.Stat_t
	err = unix.Fstat(pfd, &pst)
	unix.Close(pfd)
	if err != nil {
		return nil, Stat{}, err
	}
	switch pst.Mode & unix.S_IFMT {
	case unix.S_IFREG:
	case unix.S_IFDIR:
		return nil, Stat{}, &fs.PathError{Op: "read", Path: "/" + rel, Err: unix.EISDIR}
	default:
		return nil, Stat{}, fmt.Errorf("%w: /%s is not a regular file", ErrBadPath, rel)
	}
	fd, err := r.open(rel, unix.O_RDONLY|unix.O_NOCTTY|unix.O_NONBLOCK, 0)
	if err != nil {
		return nil, Stat{}, err
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return nil, Stat{}, err
	}
	if st.Dev != pst.Dev || st.Ino != pst.Ino || st.Mode&unix.S_IFMT != unix.S_IFREG {
		unix.Close(fd)
		return nil, Stat{}, fmt.Errorf("%w: /%s %w", ErrBadPath, rel, errChanged)
	}
	// Regular files ignore O_NONBLOCK; clear it all the same.
	_ = unix.SetNonblock(fd, false)
	return os.NewFile(uintptr(fd), "/"+rel), makeStat(rel, &st), nil
}

// tempPrefix starts the names of Create's temporary files.
const tempPrefix = ".corral-put-"

// Create makes a new temporary file (mode 0600, opened for writing) in
// rel's directory, to be renamed over rel once written, and returns it
// with its path. It refuses (EISDIR) when rel is a directory.
func (r *Root) Create(rel string) (*os.File, string, error) {
	pfd, base, err := r.parent(rel)
	if err != nil {
		return nil, "", err
	}
	defer unix.Close(pfd)
	var st unix.Stat_t
	if err := unix.Fstatat(pfd, base, &st, unix.AT_SYMLINK_NOFOLLOW); err == nil && st.Mode&unix.S_IFMT == unix.S_IFDIR {
		return nil, "", &fs.PathError{Op: "create", Path: "/" + rel, Err: unix.EISDIR}
	}
	var b [8]byte
	for range 16 {
		if _, err := readRandom(b[:]); err != nil {
			return nil, "", err
		}
		name := tempPrefix + strconv.FormatUint(leUint64(b[:]), 36)
		fd, err := unix.Openat(pfd, name, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
		if err == unix.EEXIST {
			continue
		}
		if err != nil {
			return nil, "", &fs.PathError{Op: "create", Path: "/" + rel, Err: err}
		}
		tmp := path.Join(path.Dir("/"+rel), name)[1:]
		return os.NewFile(uintptr(fd), "/"+tmp), tmp, nil
	}
	return nil, "", &fs.PathError{Op: "create", Path: "/" + rel, Err: unix.EEXIST}
}

func readRandom(b []byte) (int, error) { return unix.Getrandom(b, 0) }

func leUint64(b []byte) uint64 {
	var v uint64
	for i := 7; i >= 0; i-- {
		v = v<<8 | uint64(b[i])
	}
	return v
}

// Stat describes rel without following a final symlink.
func (r *Root) Stat(rel string) (Stat, error) {
	fd, err := r.open(rel, unix.O_PATH|unix.O_NOFOLLOW, 0)
	if err != nil {
		return Stat{}, err
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return Stat{}, err
	}
	s := makeStat(rel, &st)
	if s.Type == "symlink" {
		s.Target = readlink(fd, "")
	}
	return s, nil
}

func readlink(dirfd int, name string) string {
	buf := make([]byte, 4096)
	n, err := unix.Readlinkat(dirfd, name, buf)
	if err != nil {
		return ""
	}
	return string(buf[:n])
}

// MaxListBytes bounds the sum of the lengths of the names, paths and
// symlink targets of one List's entries: past it the listing ends,
// truncated. (Ten thousand entries of 4 KiB targets and 4 KiB paths would
// otherwise be 80 MiB, held by the lister and every hop after it.)
const MaxListBytes = 8 << 20

// List calls fn for the entries of directory rel, in name order, to depth
// levels (below 1 means 1), depth first, at most limit of them and
// [MaxListBytes] of their strings (then it reports truncated). Symlinks
// are reported, never followed.
func (r *Root) List(rel string, depth, limit int, fn func(Stat) error) (truncated bool, err error) {
	fd, err := r.open(rel, unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		return false, err
	}
	if depth < 1 {
		depth = 1
	}
	n, size := 0, 0
	full := false
	trunc, err := r.listDir(fd, rel, depth, limit, &n, func(s Stat) error {
		if size += len(s.Name) + len(s.Rel) + len(s.Target); size > MaxListBytes {
			full = true
			return errListFull
		}
		return fn(s)
	})
	if full {
		return true, nil
	}
	return trunc, err
}

// errListFull ends a listing past MaxListBytes.
var errListFull = errors.New("fsop: the listing is full")

// listDir lists the directory fd (which it closes) at rel.
func (r *Root) listDir(fd int, rel string, depth, limit int, n *int, fn func(Stat) error) (bool, error) {
	f := os.NewFile(uintptr(fd), "/"+rel)
	defer f.Close()
	names, more, err := smallestNames(f, limit-*n)
	if err != nil {
		return false, err
	}
	for _, name := range names {
		if *n >= limit {
			return true, nil
		}
		var st unix.Stat_t
		if err := unix.Fstatat(fd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			continue // gone meanwhile
		}
		s := makeStat(path.Join(rel, name), &st)
		if s.Type == "symlink" {
			s.Target = readlink(fd, name)
		}
		*n++
		if err := fn(s); err != nil {
			return false, err
		}
		if s.Type == "dir" && depth > 1 {
			cfd, err := unix.Openat(fd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
			if err != nil {
				continue // not readable by the user: listed, not descended
			}
			if checkFS(cfd) != nil || r.checkOwner(cfd) != nil {
				unix.Close(cfd)
				continue
			}
			if t, err := r.listDir(cfd, s.Rel, depth-1, limit, n, fn); t || err != nil {
				return t, err
			}
		}
	}
	return more, nil
}

// namesChunk is how many names a directory read takes at once.
const namesChunk = 1024

// smallestNames returns, in order, the k smallest names of directory f's
// entries, and whether it had more. It holds at most k names and one
// chunk, whatever the directory's size: a directory of millions of
// entries (made by whoever controls the tree) costs the caller no more
// memory than a listing's limit.
func smallestNames(f *os.File, k int) ([]string, bool, error) {
	if k < 0 {
		k = 0
	}
	h := &nameHeap{}
	more := false
	for {
		names, err := f.Readdirnames(namesChunk)
		for _, name := range names {
			switch {
			case h.Len() < k:
				heap.Push(h, name)
			case k > 0 && name < (*h)[0]:
				(*h)[0] = name
				heap.Fix(h, 0)
				more = true
			default:
				more = true
			}
		}
		if errors.Is(err, io.EOF) || (err == nil && len(names) == 0) {
			break
		}
		if err != nil {
			return nil, false, err
		}
	}
	sort.Strings(*h)
	return *h, more, nil
}

// nameHeap is a max-heap of names.
type nameHeap []string

func (h nameHeap) Len() int           { return len(h) }
func (h nameHeap) Less(i, j int) bool { return h[i] > h[j] }
func (h nameHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *nameHeap) Push(x any)        { *h = append(*h, x.(string)) }
func (h *nameHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

// Mkdir makes directory rel with mode (0 means 0755); with parents, its
// missing parents too, and an existing directory is no error.
func (r *Root) Mkdir(rel string, mode uint32, parents bool) error {
	if mode == 0 {
		mode = 0o755
	}
	mode &= 0o1777
	if !parents {
		pfd, base, err := r.parent(rel)
		if err != nil {
			return err
		}
		defer unix.Close(pfd)
		if err := unix.Mkdirat(pfd, base, mode); err != nil {
			return &fs.PathError{Op: "mkdir", Path: "/" + rel, Err: err}
		}
		return nil
	}
	if err := Clean(rel); err != nil {
		return err
	}
	parts := strings.Split(rel, "/")
	for i := range parts {
		sub := strings.Join(parts[:i+1], "/")
		pfd, base, err := r.parent(sub)
		if err != nil {
			return err
		}
		err = unix.Mkdirat(pfd, base, mode)
		if err == unix.EEXIST {
			var st unix.Stat_t
			// Through the root: an existing symlink to a directory counts.
			if serr := unix.Fstatat(pfd, base, &st, 0); serr == nil && st.Mode&unix.S_IFMT == unix.S_IFDIR {
				err = nil
			}
		}
		unix.Close(pfd)
		if err != nil {
			return &fs.PathError{Op: "mkdir", Path: "/" + sub, Err: err}
		}
	}
	return nil
}

// Remove removes rel (a final symlink itself, not its target); a
// non-empty directory only with recursive, which never follows a symlink.
func (r *Root) Remove(rel string, recursive bool) error {
	pfd, base, err := r.parent(rel)
	if err != nil {
		return err
	}
	defer unix.Close(pfd)
	if recursive {
		return r.removeAll(pfd, base, "/"+rel)
	}
	var st unix.Stat_t
	if err := unix.Fstatat(pfd, base, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return &fs.PathError{Op: "remove", Path: "/" + rel, Err: err}
	}
	flags := 0
	if st.Mode&unix.S_IFMT == unix.S_IFDIR {
		flags = unix.AT_REMOVEDIR
	}
	if err := unix.Unlinkat(pfd, base, flags); err != nil {
		return &fs.PathError{Op: "remove", Path: "/" + rel, Err: err}
	}
	return nil
}

func (r *Root) removeAll(pfd int, name, display string) error {
	var st unix.Stat_t
	if err := unix.Fstatat(pfd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return &fs.PathError{Op: "remove", Path: display, Err: err}
	}
	if st.Mode&unix.S_IFMT != unix.S_IFDIR {
		if err := unix.Unlinkat(pfd, name, 0); err != nil {
			return &fs.PathError{Op: "remove", Path: display, Err: err}
		}
		return nil
	}
	fd, err := unix.Openat(pfd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return &fs.PathError{Op: "remove", Path: display, Err: err}
	}
	f := os.NewFile(uintptr(fd), display)
	if err = r.checkOwner(fd); err != nil {
		err = &fs.PathError{Op: "remove", Path: display, Err: err}
	}
	// A chunk of names at a time (see smallestNames); the entries not yet
	// read are returned once each, whatever is removed meanwhile.
	for err == nil {
		var names []string
		names, err = f.Readdirnames(namesChunk)
		if errors.Is(err, io.EOF) || (err == nil && len(names) == 0) {
			err = nil
			break
		}
		for _, n := range names {
			if err = r.removeAll(fd, n, display+"/"+n); err != nil {
				break
			}
		}
	}
	f.Close()
	if err != nil {
		return err
	}
	if err := unix.Unlinkat(pfd, name, unix.AT_REMOVEDIR); err != nil {
		return &fs.PathError{Op: "remove", Path: display, Err: err}
	}
	return nil
}

// Rename renames from to to, replacing a file at to (rename(2)'s rules).
func (r *Root) Rename(from, to string) error {
	ffd, fbase, err := r.parent(from)
	if err != nil {
		return err
	}
	defer unix.Close(ffd)
	tfd, tbase, err := r.parent(to)
	if err != nil {
		return err
	}
	defer unix.Close(tfd)
	if err := unix.Renameat(ffd, fbase, tfd, tbase); err != nil {
		return &os.LinkError{Op: "rename", Old: "/" + from, New: "/" + to, Err: err}
	}
	return nil
}

// Chmod sets the permission bits of f, a file Create made (before the
// rename), to mode & 0777.
func Chmod(f *os.File, mode uint32) error {
	return f.Chmod(fs.FileMode(mode & 0o777))
}

// WatchMask is what watches report.
const WatchMask = unix.IN_CREATE | unix.IN_MODIFY | unix.IN_DELETE | unix.IN_MOVED_FROM |
	unix.IN_MOVED_TO | unix.IN_DELETE_SELF | unix.IN_MOVE_SELF | unix.IN_ONLYDIR

// NewInotify returns a new inotify descriptor (non-blocking, close-on-exec).
func NewInotify() (*os.File, error) {
	fd, err := unix.InotifyInit1(unix.IN_CLOEXEC | unix.IN_NONBLOCK)
	if err != nil {
		return nil, fmt.Errorf("fsop: inotify_init1: %w", err)
	}
	return os.NewFile(uintptr(fd), "inotify"), nil
}

// Watch adds a watch for directory rel to the inotify descriptor ifd and,
// with recursive, for the directories below it (symlinks not followed),
// at most limit in all (then truncated), calling fn with each watch's
// descriptor and path.
func (r *Root) Watch(ifd int, rel string, recursive bool, limit int, fn func(wd int, rel string) error) (truncated bool, err error) {
	fd, err := r.open(rel, unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		return false, err
	}
	n := 0
	return r.watchDir(ifd, fd, rel, recursive, limit, &n, fn)
}

// watchDir watches the directory fd (which it closes) at rel.
func (r *Root) watchDir(ifd, fd int, rel string, recursive bool, limit int, n *int, fn func(int, string) error) (bool, error) {
	f := os.NewFile(uintptr(fd), "/"+rel)
	defer f.Close()
	if *n >= limit {
		return true, nil
	}
	// inotify_add_watch takes a path: the descriptor's, through this
	// process's /proc (the kernel checks read permission on the
	// directory with the thread's credentials).
	wd, err := unix.InotifyAddWatch(ifd, "/proc/self/fd/"+strconv.Itoa(fd), WatchMask)
	if err != nil {
		return false, &fs.PathError{Op: "watch", Path: "/" + rel, Err: err}
	}
	*n++
	if err := fn(wd, rel); err != nil {
		return false, err
	}
	if !recursive {
		return false, nil
	}
	// Read a chunk at a time (a huge directory's names are never all
	// held), in directory order.
	for {
		names, err := f.Readdirnames(namesChunk)
		if len(names) == 0 || (err != nil && !errors.Is(err, io.EOF)) {
			return false, nil
		}
		if t, err := r.watchNames(ifd, fd, rel, names, limit, n, fn); t || err != nil {
			return t, err
		}
	}
}

// watchNames watches, recursively, the directories among names in the
// directory fd at rel.
func (r *Root) watchNames(ifd, fd int, rel string, names []string, limit int, n *int, fn func(int, string) error) (bool, error) {
	for _, name := range names {
		var st unix.Stat_t
		if unix.Fstatat(fd, name, &st, unix.AT_SYMLINK_NOFOLLOW) != nil || st.Mode&unix.S_IFMT != unix.S_IFDIR {
			continue
		}
		cfd, err := unix.Openat(fd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			continue
		}
		if checkFS(cfd) != nil || r.checkOwner(cfd) != nil {
			unix.Close(cfd)
			continue
		}
		if t, err := r.watchDir(ifd, cfd, path.Join(rel, name), true, limit, n, fn); t || err != nil {
			return t, err
		}
	}
	return false, nil
}
