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
	"io/fs"
	"os"
	"path/filepath"
	"slices"

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

// readACL returns path's ACL of the given kind (xattrACLAccess or
// xattrACLDefault); a file without one has the ACL of its mode (access) or
// none (default).
func readACL(path, kind string, mode uint32) (acl, error) {
	buf := make([]byte, 256)
	for {
		n, err := unix.Lgetxattr(path, kind, buf)
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
// The walk goes by path (lstat, then lsetxattr), so it must not run while
// someone who can write beneath root can swap a directory for a symlink:
// it runs before the project's first confined command (uid has no process
// yet) and again only if root's own entry was removed. An fd-based walk
// (openat with O_NOFOLLOW all the way) would close that window for good.
//
// skip, if not nil, is asked about every path beneath root (not root
// itself): a directory it reports is left alone with everything beneath
// it, as is a file.
func GrantUser(root string, uid uint32, skip func(path string) bool) error {
	var st unix.Stat_t
	if err := unix.Lstat(root, &st); err != nil {
		return &os.PathError{Op: "lstat", Path: root, Err: err}
	}
	if granted(root, st.Mode, uid) {
		return nil
	}
	dev := st.Dev
	// The root last: it is what marks the walk as done.
	var rootErr error
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if path == root {
			return nil
		}
		if skip != nil && skip(path) {
			if d.IsDir() {
				return fs.SkipDir
			}
			return nil
		}
		if d.Type()&fs.ModeSymlink != 0 || !d.IsDir() && !d.Type().IsRegular() {
			return nil
		}
		var st unix.Stat_t
		if err := unix.Lstat(path, &st); err != nil {
			return &os.PathError{Op: "lstat", Path: path, Err: err}
		}
		if st.Dev != dev {
			if d.IsDir() {
				return fs.SkipDir
			}
			return nil
		}
		return grantOne(path, st.Mode, uid)
	})
	if err != nil {
		return err
	}
	rootErr = grantOne(root, st.Mode, uid)
	return rootErr
}

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

func grantOne(path string, mode uint32, uid uint32) error {
	perm := uint16(6)
	dir := mode&unix.S_IFMT == unix.S_IFDIR
	if dir || mode&0o111 != 0 {
		perm = 7
	}
	a, err := readACL(path, xattrACLAccess, mode)
	if err != nil {
		return fmt.Errorf("read the ACL of %s: %w", path, err)
	}
	if err := unix.Lsetxattr(path, xattrACLAccess, a.withUser(uid, perm).encode(), 0); err != nil {
		return fmt.Errorf("set the ACL of %s: %w", path, err)
	}
	if !dir {
		return nil
	}
	d, err := readACL(path, xattrACLDefault, mode)
	if err != nil {
		return fmt.Errorf("read the default ACL of %s: %w", path, err)
	}
	if d == nil {
		d = aclFromMode(mode)
	}
	if err := unix.Lsetxattr(path, xattrACLDefault, d.withUser(uid, 7).encode(), 0); err != nil {
		return fmt.Errorf("set the default ACL of %s: %w", path, err)
	}
	return nil
}

// Grants reports whether path's access ACL (or, without one, its mode)
// gives uid at least perm (r 4, w 2, x 1) through a named-user entry and
// the mask.
func Grants(path string, uid uint32, perm uint16) (bool, error) {
	var st unix.Stat_t
	if err := unix.Lstat(path, &st); err != nil {
		return false, &os.PathError{Op: "lstat", Path: path, Err: err}
	}
	a, err := readACL(path, xattrACLAccess, st.Mode)
	if err != nil {
		return false, err
	}
	return a.grants(uid, perm), nil
}
