package main

import (
	"fmt"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"

	"github.com/corral-sandbox/corral/internal/safepath"
)

// checkStateDir returns an error unless nobody but this user (and root)
// can change what dir holds: dir is owned by this user and writable by
// nobody else, and nobody else can redirect the path to it
// (safepath.Check).
//
// A run opens the state directory's store, lock files, log and pid file
// and trusts the socket it finds there, as root for a --project run: in a
// directory another user can write, that user could plant a symlink (root
// would truncate or write the file it names) or a socket of their own
// (root's run would hand its requests and descriptors to it).
func checkStateDir(dir string) error {
	euid := uint32(os.Geteuid())
	if err := safepath.Check(dir, euid); err != nil {
		return fmt.Errorf("state directory %s: %w", dir, err)
	}
	dir, err := filepath.EvalSymlinks(dir)
	if err != nil {
		return fmt.Errorf("state directory: %w", err)
	}
	var st unix.Stat_t
	if err := unix.Lstat(dir, &st); err != nil {
		return fmt.Errorf("state directory: %w", &os.PathError{Op: "lstat", Path: dir, Err: err})
	}
	switch {
	case st.Mode&unix.S_IFMT != unix.S_IFDIR:
		return fmt.Errorf("state directory %s: not a directory", dir)
	case st.Uid != euid:
		return fmt.Errorf("state directory %s: owned by uid %d, not by this user (%d): another user could plant files in it", dir, st.Uid, euid)
	case st.Mode&0o022 != 0:
		return fmt.Errorf("state directory %s: writable by others (mode %04o): make it 0700", dir, st.Mode&0o7777)
	}
	return nil
}
