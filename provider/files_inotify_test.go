package provider

import (
	"context"
	"errors"
	"os"
	"testing"

	"github.com/corral-sandbox/corral/internal/fsop"
	"golang.org/x/sys/unix"
)

// TestHostWatchChargedToProjectUser: a host project's watch is an inotify
// instance of the project's user, never of host root (whose
// fs.inotify.max_user_instances, 128 by default, every root daemon of the
// host shares: a tenant opening 128 watches would have exhausted it). The
// test fills a throwaway uid's quota and expects the watch to be refused.
func TestHostWatchChargedToProjectUser(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("switching users needs root")
	}
	const uid = 1<<24 + 5151
	dir := t.TempDir()
	if err := os.Chown(dir, uid, uid); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile("/proc/sys/fs/inotify/max_user_instances")
	if err != nil {
		t.Skip(err)
	}
	var max int
	for _, c := range string(b) {
		if c >= '0' && c <= '9' {
			max = max*10 + int(c-'0')
		}
	}
	if max > 4096 {
		t.Skipf("max_user_instances is %d: too many to fill", max)
	}
	// Fill the user's quota.
	var held []int
	defer func() {
		for _, fd := range held {
			unix.Close(fd)
		}
	}()
	err = fsop.Run(&fsop.Cred{UID: uid, GID: uid}, func() error {
		for {
			fd, err := unix.InotifyInit1(unix.IN_CLOEXEC)
			if err != nil {
				if errors.Is(err, unix.EMFILE) {
					return nil
				}
				return err
			}
			held = append(held, fd)
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	h := &hostFiles{root: dir, user: &fsop.Cred{UID: uid, GID: uid}}
	ino, _, err := h.Watch(context.Background(), "/workspace", false)
	if err == nil {
		ino.Close()
		t.Fatal("a watch succeeded with the project user's inotify quota used up: it was charged to host root")
	}
}
