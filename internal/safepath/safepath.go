// Package safepath tells whether a path names what it names now only
// because of root and one trusted user: whether anybody else could make
// it name something else (by replacing a directory or a symlink on the
// way) before a privileged program uses it.
package safepath

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// Check returns an error unless nobody but root and uid can change what
// the absolute path p resolves to: every directory above p's last
// component is owned by root or uid and is not writable by group or
// others unless it is sticky (as /tmp is: others can neither rename nor
// remove what they do not own there), and every symlink on the way
// (p's last component included) is owned by root or uid and leads to a
// path that passes Check too. p's last component itself, if it is not a
// symlink, may belong to anybody: the caller judges it.
//
// Check looks at the file system as it is; it is meaningful because what
// it accepts cannot be changed by anybody else afterwards.
func Check(p string, uid uint32) error {
	return check(p, uid, 0)
}

// maxLinks bounds the symlinks followed, as the kernel's ELOOP does.
const maxLinks = 40

func check(p string, uid uint32, links int) error {
	if !filepath.IsAbs(p) {
		return fmt.Errorf("%s: not an absolute path", p)
	}
	p = filepath.Clean(p)
	parts := strings.Split(strings.TrimPrefix(p, "/"), "/")
	cur := "/"
	for i, part := range parts {
		if part == "" {
			break
		}
		last := i == len(parts)-1
		var st unix.Stat_t
		if err := unix.Lstat(cur, &st); err != nil {
			return &os.PathError{Op: "lstat", Path: cur, Err: err}
		}
		if err := trustedDir(cur, &st, uid); err != nil {
			return err
		}
		next := filepath.Join(cur, part)
		if err := unix.Lstat(next, &st); err != nil {
			return &os.PathError{Op: "lstat", Path: next, Err: err}
		}
		if st.Mode&unix.S_IFMT == unix.S_IFLNK {
			if st.Uid != 0 && st.Uid != uid {
				return fmt.Errorf("%s: the symlink %s belongs to uid %d, who could point it elsewhere", p, next, st.Uid)
			}
			if links++; links > maxLinks {
				return &os.PathError{Op: "resolve", Path: p, Err: unix.ELOOP}
			}
			target, err := os.Readlink(next)
			if err != nil {
				return err
			}
			if !filepath.IsAbs(target) {
				target = filepath.Join(cur, target)
			}
			rest := filepath.Join(append([]string{target}, parts[i+1:]...)...)
			return check(rest, uid, links)
		}
		if last {
			return nil
		}
		cur = next
	}
	return nil
}

// trustedDir returns an error unless the directory dir (st) is owned by
// root or uid and is writable by nobody else, or is sticky.
func trustedDir(dir string, st *unix.Stat_t, uid uint32) error {
	switch {
	case st.Mode&unix.S_IFMT != unix.S_IFDIR:
		return fmt.Errorf("%s: not a directory", dir)
	case st.Uid != 0 && st.Uid != uid:
		return fmt.Errorf("%s is owned by uid %d, who could replace what is in it", dir, st.Uid)
	case st.Mode&0o022 != 0 && st.Mode&unix.S_ISVTX == 0:
		return fmt.Errorf("%s is writable by others (mode %04o), who could replace what is in it", dir, st.Mode&0o7777)
	}
	return nil
}
