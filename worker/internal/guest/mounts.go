package guest

import (
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/corral-sandbox/corral/worker/internal/ctl"
)

// Layout while building (bubblewrap's approach): a tmpfs staged over /tmp
// becomes the root, the host tree hangs at /oldroot; the worker's detached
// mounts are attached under /layers/<i> (the image's layers, idmapped onto
// the machine's ids) and /upper (the project's upper and work
// directories); the guest root is the overlay of these at /newroot, which
// receives the machine's own mounts; a final pivot_root into /newroot
// detaches everything else. Nothing of the host is reachable from the
// guest root but what the worker passed and the few /dev nodes setupDev
// binds.
const (
	stage   = "/tmp"
	oldroot = "/oldroot"
	newroot = "/newroot"
	layers  = "/layers"
	upper   = "/upper"
)

// setupRoot builds the guest's filesystem from mountFDs, the detached
// mounts the worker sent in the order ctl.Config.Mounts gives.
func setupRoot(cfg *ctl.Config, mountFDs []*os.File) error {
	if len(mountFDs) != cfg.Mounts() {
		return fmt.Errorf("got %d mounts, want %d", len(mountFDs), cfg.Mounts())
	}
	workspace, home, upperFD := mountFDs[0], mountFDs[1], mountFDs[2]
	layerFDs := mountFDs[3 : 3+cfg.Layers]
	hostBinds := mountFDs[3+cfg.Layers:]
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("make / private: %w", err)
	}
	if err := unix.Mount("tmpfs", stage, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "mode=0755"); err != nil {
		return fmt.Errorf("mount staging tmpfs: %w", err)
	}
	for _, d := range []string{stage + oldroot, stage + newroot, stage + layers, stage + upper} {
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
	if err := mountOverlay(layerFDs, upperFD); err != nil {
		return err
	}
	for _, d := range []string{"proc", "sys", "dev", "tmp", cfg.GuestWorkspace[1:], cfg.GuestHome[1:]} {
		if err := mkdirGuest(d); err != nil {
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
	for i, p := range cfg.HostBinds {
		if err := mkdirGuest(p[1:]); err != nil {
			return err
		}
		if err := moveMount(hostBinds[i], newroot+p); err != nil {
			return fmt.Errorf("attach %s: %w", p, err)
		}
	}
	if err := moveMount(workspace, newroot+cfg.GuestWorkspace); err != nil {
		return fmt.Errorf("attach workspace: %w", err)
	}
	if err := moveMount(home, newroot+cfg.GuestHome); err != nil {
		return fmt.Errorf("attach home: %w", err)
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

// mountOverlay mounts the guest root at /newroot: an overlay of the image's
// layers (attached at /layers/<i>, lowest first) under the project's upper
// directory (attached at /upper, holding "upper" and "work"), with
// userxattr: inside a user namespace overlayfs keeps its metadata, and
// reads the layers' opaque markers, in user.overlay.* xattrs. The layer
// mounts are needed only for the mount call: overlayfs takes its own
// private clones of them, and they go away with the staging tree.
func mountOverlay(layerFDs []*os.File, upperFD *os.File) error {
	var lower []string
	for i, f := range layerFDs {
		d := fmt.Sprintf("%s/%d", layers, i)
		if err := os.Mkdir(d, 0o755); err != nil {
			return err
		}
		if err := moveMount(f, d); err != nil {
			return fmt.Errorf("attach layer %d: %w", i, err)
		}
		lower = append(lower, d)
	}
	if len(lower) == 0 {
		// An image without layers: an empty root.
		lower = append(lower, layers)
	}
	slices.Reverse(lower) // overlayfs lists the uppermost lower layer first
	if err := moveMount(upperFD, upper); err != nil {
		return fmt.Errorf("attach upper layer: %w", err)
	}
	opts := "lowerdir=" + strings.Join(lower, ":") + ",upperdir=" + upper + "/upper,workdir=" + upper + "/work,userxattr"
	if err := unix.Mount("overlay", newroot, "overlay", unix.MS_NOSUID|unix.MS_NODEV, opts); err != nil {
		return fmt.Errorf("mount overlay root (%s): %w", opts, err)
	}
	return nil
}

// mkdirGuest makes the directory rel (relative to the guest root) and its
// parents, as guest root, without following a symlink of the image out of
// the new root: each component is resolved beneath it.
func mkdirGuest(rel string) error {
	root, err := unix.Open(newroot, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(root)
	dir := root
	for _, c := range strings.Split(rel, "/") {
		if c == "" {
			continue
		}
		err := unix.Mkdirat(dir, c, 0o755)
		if err != nil && err != unix.EEXIST {
			return fmt.Errorf("mkdir /%s: %w", rel, err)
		}
		next, err := unix.Openat2(dir, c, &unix.OpenHow{
			Flags:   unix.O_PATH | unix.O_DIRECTORY | unix.O_CLOEXEC,
			Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_XDEV,
		})
		if dir != root {
			unix.Close(dir)
		}
		if err != nil {
			return fmt.Errorf("mount point /%s: %w", rel, err)
		}
		dir = next
	}
	if dir != root {
		unix.Close(dir)
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
