package mountpin

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestHoldersFindsAnotherNamespace mounts an image on a loop device, lets
// a process in a new mount namespace copy the mount, unmounts it here, and
// expects Holders to name that process (and nothing once it is gone).
func TestHoldersFindsAnotherNamespace(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root (loop devices, mount)")
	}
	for _, tool := range []string{"mkfs.ext4", "unshare", "losetup"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("no %s", tool)
		}
	}
	dir := t.TempDir()
	img, mnt := filepath.Join(dir, "img"), filepath.Join(dir, "mnt")
	run := func(name string, args ...string) string {
		t.Helper()
		out, err := exec.Command(name, args...).CombinedOutput()
		if err != nil {
			t.Fatalf("%s %v: %v\n%s", name, args, err, out)
		}
		return strings.TrimSpace(string(out))
	}
	run("truncate", "-s", "8M", img)
	run("mkfs.ext4", "-q", img)
	if err := os.Mkdir(mnt, 0o700); err != nil {
		t.Fatal(err)
	}
	loop := run("losetup", "--find", "--show", img)
	run("mount", loop, mnt)
	run("losetup", "-d", loop) // autoclear: detached once unmounted everywhere

	if pids, _ := Holders(img); len(pids) != 0 {
		t.Fatalf("Holders = %v while only this namespace mounts it", pids)
	}
	holder := exec.Command("unshare", "--mount", "--propagation", "private", "sleep", "60")
	if err := holder.Start(); err != nil {
		t.Fatal(err)
	}
	defer holder.Process.Kill()
	deadline := time.Now().Add(10 * time.Second)
	for {
		ns, _ := os.Readlink("/proc/" + strconv.Itoa(holder.Process.Pid) + "/ns/mnt")
		self := ownMountNS()
		if ns != "" && ns != self {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("unshare made no namespace")
		}
		time.Sleep(10 * time.Millisecond)
	}
	run("umount", mnt)
	// Another process of the host (a test of another package making a
	// private mount namespace while the file system was mounted here) may
	// hold a copy too: the holder must be among those found.
	pids, devs := Holders(img)
	if !slices.Contains(pids, holder.Process.Pid) || len(devs) != 1 {
		t.Fatalf("Holders = %v %v, want %d among them and one device", pids, devs, holder.Process.Pid)
	}
	if len(pids) > 1 {
		t.Logf("other mount namespaces hold it too: %v", pids)
	}
	holder.Process.Kill()
	holder.Wait()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		pids, devs := Holders(img)
		if len(pids) == 0 && len(devs) == 0 {
			return
		}
		if len(pids) > 0 && !slices.Contains(pids, holder.Process.Pid) {
			t.Logf("held by other mount namespaces after the holder exited: %v", pids)
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("the loop device stayed attached after its holder exited")
		}
	}
}
