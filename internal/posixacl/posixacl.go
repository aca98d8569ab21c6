// Package posixacl grants a user access to a directory tree with POSIX
// ACLs, leaving owners, modes and every other entry as they are: how
// corral lets a project's unprivileged user write a directory it does not
// own (a host project's root, a root-owned checkout bound into a machine).
package posixacl

import (
	"cmp"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"

	"golang.org/x/sys/unix"
)

// POSIX ACLs, as Linux stores them in the extended attributes
// system.posix_acl_access (a file's ACL) and system.posix_acl_default (the
// ACL a directory's new entries inherit): a little-endian header, the
// version (2) as a uint32, then one 8-byte entry per line of the ACL, each
// a uint16 tag, a uint16 permission set (r 4, w 2, x 1) and a uint32 id
// (a uid or gid for the named tags, aclUndefinedID otherwise), sorted by
// tag, then by id. An ACL with named entries must have a mask, which
// bounds what every entry of the group class (the owning group and the
// named users and groups) grants; the file's group mode bits show the mask.
// See acl(5) and the kernel's include/uapi/linux/posix_acl_xattr.h.
const (
	aclVersion     = 2
	aclUndefinedID = ^uint32(0)

	aclUserObj  = 0x01
	aclUser     = 0x02
	aclGroupObj = 0x04
	aclGroup    = 0x08
	aclMask     = 0x10
	aclOther    = 0x20

	xattrACLAccess  = "system.posix_acl_access"
	xattrACLDefault = "system.posix_acl_default"
)

type aclEntry struct {
	tag  uint16
	perm uint16
	id   uint32
}

type acl []aclEntry

func decodeACL(b []byte) (acl, error) {
	if len(b) < 4 || (len(b)-4)%8 != 0 || binary.LittleEndian.Uint32(b) != aclVersion {
		return nil, errors.New("malformed POSIX ACL")
	}
	var a acl
	for b = b[4:]; len(b) > 0; b = b[8:] {
		a = append(a, aclEntry{
			tag:  binary.LittleEndian.Uint16(b),
			perm: binary.LittleEndian.Uint16(b[2:]),
			id:   binary.LittleEndian.Uint32(b[4:]),
		})
	}
	return a, nil
}

func (a acl) encode() []byte {
	slices.SortFunc(a, func(x, y aclEntry) int {
		if x.tag != y.tag {
			return int(x.tag) - int(y.tag)
		}
		return cmp.Compare(x.id, y.id)
	})
	b := binary.LittleEndian.AppendUint32(nil, aclVersion)
	for _, e := range a {
		b = binary.LittleEndian.AppendUint16(b, e.tag)
		b = binary.LittleEndian.AppendUint16(b, e.perm)
		b = binary.LittleEndian.AppendUint32(b, e.id)
	}
	return b
}

// aclFromMode is the minimal ACL equivalent to a mode's permission bits.
func aclFromMode(mode uint32) acl {
	return acl{
		{aclUserObj, uint16(mode>>6) & 7, aclUndefinedID},
		{aclGroupObj, uint16(mode>>3) & 7, aclUndefinedID},
		{aclOther, uint16(mode) & 7, aclUndefinedID},
	}
}

// withUser returns a with the named user uid granted perm (added to what
// an entry it had granted) and nobody else's effective permissions
// changed: the mask becomes the old mask (or, in a minimal ACL, the owning
// group's permissions) with perm added, and every other entry of the group
// class is first reduced to what the old mask let it grant, so that the
// wider mask widens nothing but uid's entry.
func (a acl) withUser(uid uint32, perm uint16) acl {
	oldMask, hasMask := uint16(7), false
	for _, e := range a {
		if e.tag == aclMask {
			oldMask, hasMask = e.perm, true
		}
	}
	out := make(acl, 0, len(a)+2)
	var mask uint16
	for _, e := range a {
		switch {
		case e.tag == aclMask:
			continue
		case e.tag == aclUser && e.id == uid:
			perm |= e.perm & oldMask
			continue
		case e.tag == aclUser, e.tag == aclGroup, e.tag == aclGroupObj:
			e.perm &= oldMask
			if !hasMask && e.tag == aclGroupObj {
				mask = e.perm
			}
		}
		out = append(out, e)
	}
	if hasMask {
		mask = oldMask
	}
	out = append(out, aclEntry{aclUser, perm, uid}, aclEntry{aclMask, mask | perm, aclUndefinedID})
	return out
}

// grants reports whether a gives uid at least perm (through its named
// entry and the mask).
func (a acl) grants(uid uint32, perm uint16) bool {
	var named, mask uint16 = 0, 7
	found := false
	for _, e := range a {
		switch {
		case e.tag == aclUser && e.id == uid:
			named, found = e.perm, true
		case e.tag == aclMask:
			mask = e.perm
		}
	}
	return found && named&mask&perm == perm
}

// readACL returns the ACL of the given kind (xattrACLAccess or
// xattrACLDefault) of the file path resolves to (a descriptor's fdPath,
// or a directory that is not a symlink); a file without one has the ACL of its mode (access) or
// none (default).
func readACL(path, kind string, mode uint32) (acl, error) {
	buf := make([]byte, 256)
	for {
		n, err := unix.Getxattr(path, kind, buf)
		switch {
		case errors.Is(err, unix.ENODATA):
			if kind == xattrACLDefault {
				return nil, nil
			}
			return aclFromMode(mode), nil
		case errors.Is(err, unix.ERANGE):
			buf = make([]byte, 2*len(buf))
			continue
		case err != nil:
			return nil, err
		}
		return decodeACL(buf[:n])
	}
}

// GrantUser gives uid read and write access (and search, for directories
// and executables) to root and everything beneath it that is not a
// symlink or on another file system, by adding a named-user entry to each
// one's access ACL, and to each directory's default ACL, so that what is
// created beneath later inherits it. Only that entry and the mask change:
// no owner, group, mode or other entry. A root whose ACLs already grant
// uid everything is left alone (the walk is a one-time cost per project).
//
// Its limits are POSIX ACLs' own: the mask of a file created later by
// someone else comes from that creator's mode, so a file another user
// creates 0644 grants uid reading only. Files uid creates are its own.
//
// The walk goes by descriptor: each entry is opened beneath its
// directory's descriptor without following a symlink (O_PATH|O_NOFOLLOW)
// and its ACLs are read and written through that descriptor, so a
// directory swapped for a symlink while the walk runs (by someone who can
// write beneath root) leads it nowhere outside root.
//
// skip, if not nil, is asked about every path beneath root (not root
// itself): a directory it reports is left alone with everything beneath
// it, as is a file.
func GrantUser(root string, uid uint32, skip func(path string) bool) error {
	fd, err := openNoFollow(unix.AT_FDCWD, root)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return &os.PathError{Op: "fstat", Path: root, Err: err}
	}
	if granted(fdPath(fd), st.Mode, uid) {
		return nil
	}
	if st.Mode&unix.S_IFMT == unix.S_IFDIR {
		if err := grantBeneath(fd, root, st.Dev, uid, skip); err != nil {
			return err
		}
	}
	// The root last: it is what marks the walk as done.
	return grantOne(fdPath(fd), root, st.Mode, uid)
}

// grantBeneath grants uid what GrantUser does on everything beneath the
// directory dirfd (named dir), in lexical order, each directory before
// what it holds, staying on the file system dev.
func grantBeneath(dirfd int, dir string, dev uint64, uid uint32, skip func(string) bool) error {
	rfd, err := unix.Openat(dirfd, ".", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return &os.PathError{Op: "open", Path: dir, Err: err}
	}
	f := os.NewFile(uintptr(rfd), dir)
	names, err := f.Readdirnames(-1)
	f.Close()
	if err != nil {
		return err
	}
	slices.Sort(names)
	for _, name := range names {
		path := filepath.Join(dir, name)
		if skip != nil && skip(path) {
			continue
		}
		if err := grantEntry(dirfd, name, path, dev, uid, skip); err != nil {
			return err
		}
	}
	return nil
}

// grantEntry grants uid access to the entry name of dirfd (named path),
// and beneath it if it is a directory; a symlink, special file or entry of
// another file system is left alone, as is one that disappeared.
func grantEntry(dirfd int, name, path string, dev uint64, uid uint32, skip func(string) bool) error {
	fd, err := openNoFollow(dirfd, name)
	if errors.Is(err, unix.ENOENT) {
		return nil
	}
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return &os.PathError{Op: "fstat", Path: path, Err: err}
	}
	kind := st.Mode & unix.S_IFMT
	if kind != unix.S_IFDIR && kind != unix.S_IFREG || st.Dev != dev {
		return nil
	}
	if err := grantOne(fdPath(fd), path, st.Mode, uid); err != nil {
		return err
	}
	if kind == unix.S_IFDIR {
		return grantBeneath(fd, path, dev, uid, skip)
	}
	return nil
}

// openNoFollow opens name beneath dirfd as a path descriptor, without
// following it if it is a symlink (the descriptor is then the link's).
func openNoFollow(dirfd int, name string) (int, error) {
	fd, err := unix.Openat(dirfd, name, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, &os.PathError{Op: "open", Path: name, Err: err}
	}
	return fd, nil
}

// fdPath is the name under which the kernel resolves exactly fd's file:
// extended attributes cannot be set through a path descriptor itself.
func fdPath(fd int) string { return "/proc/self/fd/" + strconv.Itoa(fd) }

// GrantSearch lets uid search dir (x only: it can reach what is beneath by
// name, not list it), with an entry in dir's access ACL, unless others may
// search it already. It is how a project's user reaches a root beneath a
// directory such as a 0700 home: the narrowest grant that does it (chmod
// o+x would open the directory to every user). What uid may then read or
// write beneath dir is still what Landlock allows (the roots and the
// system directories only).
func GrantSearch(dir string, uid uint32) error {
	var st unix.Stat_t
	if err := unix.Stat(dir, &st); err != nil {
		return &os.PathError{Op: "stat", Path: dir, Err: err}
	}
	if st.Mode&0o001 != 0 {
		return nil
	}
	a, err := readACL(dir, xattrACLAccess, st.Mode)
	if err != nil {
		return fmt.Errorf("read the ACL of %s: %w", dir, err)
	}
	if a.grants(uid, 1) {
		return nil
	}
	if err := unix.Setxattr(dir, xattrACLAccess, a.withUser(uid, 1).encode(), 0); err != nil {
		return fmt.Errorf("set the ACL of %s: %w", dir, err)
	}
	return nil
}

func granted(path string, mode uint32, uid uint32) bool {
	a, err := readACL(path, xattrACLAccess, mode)
	if err != nil || !a.grants(uid, 7) {
		return false
	}
	d, err := readACL(path, xattrACLDefault, mode)
	return err == nil && d.grants(uid, 7)
}

// grantOne grants uid access to the file at p (a descriptor's fdPath),
// named name in errors.
func grantOne(p, name string, mode uint32, uid uint32) error {
	perm := uint16(6)
	dir := mode&unix.S_IFMT == unix.S_IFDIR
	if dir || mode&0o111 != 0 {
		perm = 7
	}
	a, err := readACL(p, xattrACLAccess, mode)
	if err != nil {
		return fmt.Errorf("read the ACL of %s: %w", name, err)
	}
	if err := unix.Setxattr(p, xattrACLAccess, a.withUser(uid, perm).encode(), 0); err != nil {
		return fmt.Errorf("set the ACL of %s: %w", name, err)
	}
	if !dir {
		return nil
	}
	d, err := readACL(p, xattrACLDefault, mode)
	if err != nil {
		return fmt.Errorf("read the default ACL of %s: %w", name, err)
	}
	if d == nil {
		d = aclFromMode(mode)
	}
	if err := unix.Setxattr(p, xattrACLDefault, d.withUser(uid, 7).encode(), 0); err != nil {
		return fmt.Errorf("set the default ACL of %s: %w", name, err)
	}
	return nil
}

// Grants reports whether path's access ACL (or, without one, its mode)
// gives uid at least perm (r 4, w 2, x 1) through a named-user entry and
// the mask.
func Grants(path string, uid uint32, perm uint16) (bool, error) {
	fd, err := openNoFollow(unix.AT_FDCWD, path)
	if err != nil {
		return false, err
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return false, &os.PathError{Op: "fstat", Path: path, Err: err}
	}
	if st.Mode&unix.S_IFMT == unix.S_IFLNK {
		return false, nil // a symlink has no ACL of its own
	}
	a, err := readACL(fdPath(fd), xattrACLAccess, st.Mode)
	if err != nil {
		return false, err
	}
	return a.grants(uid, perm), nil
}
