package guest

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"

	"golang.org/x/sys/unix"

	"github.com/corral-sandbox/corral/worker/internal/ctl"
)

// Layout while building (bubblewrap's approach): a tmpfs staged over /tmp
// becomes the root, the host tree hangs at /oldroot, the guest root is a
// tmpfs at /newroot that receives read-only binds of the host's top-level
// entries plus the machine's own mounts; a final pivot_root into /newroot
// detaches everything else.
const (
	stage   = "/tmp"
	oldroot = "/oldroot"
	newroot = "/newroot"
)

// skipped are top-level host entries the guest does not see (they are
// replaced by the machine's own mounts).
var skipped = map[string]bool{
	"proc": true, "sys": true, "dev": true, "tmp": true, "home": true,
	"workspace": true, "lost+found": true,
}

// setupRoot builds the guest's filesystem. mountFDs are the detached mounts
// of the workspace and of the home, in that order.
func setupRoot(cfg *ctl.Config, mountFDs []*os.File) error {
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("make / private: %w", err)
	}
	if err := unix.Mount("tmpfs", stage, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "mode=0755"); err != nil {
		return fmt.Errorf("mount staging tmpfs: %w", err)
	}
	for _, d := range []string{stage + oldroot, stage + newroot} {
		if err := os.Mkdir(d, 0o755); err != nil {
			return err
		}
	}
	if err := unix.PivotRoot(stage, stage+oldroot); err != nil {
		return fmt.Errorf("pivot_root to staging: %w", err)
	}
	if err := unix.Chdir("/"); err != nil {
		return err
	}
	if err := unix.Mount("tmpfs", newroot, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "mode=0755"); err != nil {
		return fmt.Errorf("mount root tmpfs: %w", err)
	}
	if err := bindHostEntries(); err != nil {
		return err
	}
	for _, p := range cfg.Mask {
		if st, err := os.Lstat(newroot + p); err != nil || !st.IsDir() {
			continue // not visible anyway
		}
		if err := unix.Mount("tmpfs", newroot+p, "tmpfs", unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "size=4k,mode=0755"); err != nil {
			return fmt.Errorf("mask %s: %w", p, err)
		}
	}
	for _, d := range []string{"proc", "sys", "dev", "tmp", "home", cfg.GuestWorkspace[1:], cfg.GuestHome[1:]} {
		if err := os.MkdirAll(filepath.Join(newroot, d), 0o755); err != nil {
			return err
		}
	}
	if err := unix.Mount("proc", newroot+"/proc", "proc", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
		return fmt.Errorf("mount proc: %w", err)
	}
	// A fresh sysfs shows the machine's network namespace (only lo). Where
	// the kernel refuses it, the host's is bound read-only instead.
	if err := unix.Mount("sysfs", newroot+"/sys", "sysfs", unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
		if err := bindRO(oldroot+"/sys", newroot+"/sys"); err != nil {
			return fmt.Errorf("mount sys: %w", err)
		}
	}
	if err := unix.Mount("tmpfs", newroot+"/tmp", "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, tmpfsOptions("mode=1777", cfg.TmpSize)); err != nil {
		return fmt.Errorf("mount /tmp: %w", err)
	}
	if err := setupDev(cfg.TmpSize); err != nil {
		return err
	}
	if err := maskSys(newroot+"/sys", newroot+"/dev/null"); err != nil {
		return err
	}
	if err := moveMount(mountFDs[0], newroot+cfg.GuestWorkspace); err != nil {
		return fmt.Errorf("attach workspace: %w", err)
	}
	if err := moveMount(mountFDs[1], newroot+cfg.GuestHome); err != nil {
		return fmt.Errorf("attach home: %w", err)
	}
	// The root tmpfs itself becomes read-only: "/" is not writable.
	if err := unix.MountSetattr(unix.AT_FDCWD, newroot, 0, &unix.MountAttr{Attr_set: unix.MOUNT_ATTR_RDONLY}); err != nil {
		return fmt.Errorf("remount / read-only: %w", err)
	}
	// runc's pivot_root(".", ".") trick: the old root is stacked under the
	// new one and detached.
	if err := unix.Chdir(newroot); err != nil {
		return err
	}
	if err := unix.PivotRoot(".", "."); err != nil {
		return fmt.Errorf("pivot_root: %w", err)
	}
	if err := unix.Unmount(".", unix.MNT_DETACH); err != nil {
		return fmt.Errorf("detach old root: %w", err)
	}
	return unix.Chdir("/")
}

// bindHostEntries binds every top-level entry of the host root read-only
// (recursively, nosuid, nodev) into the new root, and recreates top-level
// symlinks (merged-/usr systems).
func bindHostEntries() error {
	ents, err := os.ReadDir(oldroot)
	if err != nil {
		return err
	}
	for _, e := range ents {
		name := e.Name()
		if skipped[name] {
			continue
		}
		src, dst := oldroot+"/"+name, newroot+"/"+name
		switch {
		case e.Type()&os.ModeSymlink != 0:
			target, err := os.Readlink(src)
			if err != nil {
				return err
			}
			if err := os.Symlink(target, dst); err != nil {
				return err
			}
		case e.IsDir():
			if err := os.Mkdir(dst, 0o755); err != nil {
				return err
			}
			if err := bindRO(src, dst); err != nil {
				return fmt.Errorf("bind /%s: %w", name, err)
			}
		case e.Type().IsRegular():
			if err := touch(dst); err != nil {
				return err
			}
			if err := bindRO(src, dst); err != nil {
				return fmt.Errorf("bind /%s: %w", name, err)
			}
		}
	}
	return nil
}

func bind(src, dst string) error {
	return unix.Mount(src, dst, "", unix.MS_BIND|unix.MS_REC, "")
}

// bindRO binds src at dst recursively and makes the whole subtree
// read-only, nosuid and nodev in one mount_setattr.
func bindRO(src, dst string) error {
	if err := bind(src, dst); err != nil {
		return err
	}
	return unix.MountSetattr(unix.AT_FDCWD, dst, unix.AT_RECURSIVE, &unix.MountAttr{
		Attr_set: unix.MOUNT_ATTR_RDONLY | unix.MOUNT_ATTR_NOSUID | unix.MOUNT_ATTR_NODEV,
	})
}

func moveMount(f *os.File, dst string) error {
	defer f.Close()
	return unix.MoveMount(int(f.Fd()), "", unix.AT_FDCWD, dst, unix.MOVE_MOUNT_F_EMPTY_PATH)
}

func touch(path string) error {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	return f.Close()
}

// setupDev builds a minimal /dev: a tmpfs with the host's harmless
// character devices bound in (a user namespace cannot mknod), a private
// devpts instance (newinstance: its ptys are the machine's alone) with
// /dev/ptmx a link to its ptmx, and a tmpfs /dev/shm of shmSize bytes
// (unsized if zero).
func setupDev(shmSize int64) error {
	dev := newroot + "/dev"
	if err := unix.Mount("tmpfs", dev, "tmpfs", unix.MS_NOSUID|unix.MS_NOEXEC, "mode=0755"); err != nil {
		return fmt.Errorf("mount /dev: %w", err)
	}
	for _, n := range []string{"null", "zero", "full", "random", "urandom", "tty"} {
		if err := touch(dev + "/" + n); err != nil {
			return err
		}
		if err := unix.Mount(oldroot+"/dev/"+n, dev+"/"+n, "", unix.MS_BIND, ""); err != nil {
			return fmt.Errorf("bind /dev/%s: %w", n, err)
		}
	}
	for _, d := range []string{"pts", "shm"} {
		if err := os.Mkdir(dev+"/"+d, 0o755); err != nil {
			return err
		}
	}
	if err := unix.Mount("devpts", dev+"/pts", "devpts", unix.MS_NOSUID|unix.MS_NOEXEC, "newinstance,ptmxmode=0666,mode=0620"); err != nil {
		return fmt.Errorf("mount devpts: %w", err)
	}
	if err := unix.Mount("tmpfs", dev+"/shm", "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, tmpfsOptions("mode=1777", shmSize)); err != nil {
		return fmt.Errorf("mount /dev/shm: %w", err)
	}
	for link, target := range map[string]string{
		"ptmx": "pts/ptmx", "fd": "/proc/self/fd", "stdin": "/proc/self/fd/0",
		"stdout": "/proc/self/fd/1", "stderr": "/proc/self/fd/2",
	} {
		if err := os.Symlink(target, dev+"/"+link); err != nil {
			return err
		}
	}
	return nil
}

// tmpfsOptions returns tmpfs mount options: opts, and size= when size is
// positive.
func tmpfsOptions(opts string, size int64) string {
	if size > 0 {
		opts += ",size=" + strconv.FormatInt(size, 10)
	}
	return opts
}

// loopbackUp sets IFF_UP on lo, the only interface of a fresh network
// namespace.
func loopbackUp() error {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("socket: %w", err)
	}
	defer unix.Close(fd)
	ifr, err := unix.NewIfreq("lo")
	if err != nil {
		return err
	}
	if err := unix.IoctlIfreq(fd, unix.SIOCGIFFLAGS, ifr); err != nil {
		return fmt.Errorf("SIOCGIFFLAGS lo: %w", err)
	}
	ifr.SetUint16(ifr.Uint16() | unix.IFF_UP)
	if err := unix.IoctlIfreq(fd, unix.SIOCSIFFLAGS, ifr); err != nil {
		return fmt.Errorf("SIOCSIFFLAGS lo: %w", err)
	}
	return nil
}
