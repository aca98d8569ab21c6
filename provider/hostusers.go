package provider

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"sync"

	"github.com/corral-sandbox/corral/confine"
	"github.com/corral-sandbox/corral/internal/idrange"
	"github.com/corral-sandbox/corral/internal/posixacl"
	"golang.org/x/sys/unix"
)

// HostIDs configures the users confined host commands run as when the
// provider's process is root. Each host project gets a user of its own:
// uid and gid Start + project id, from a block of host ids claimed once in
// the host-wide idrange registry, so that no other corral installation,
// machine or image store on the host uses them.
type HostIDs struct {
	// Registry is the idrange registry; empty means
	// idrange.DefaultRegistry.
	Registry string
	// Owner is the directory that owns the block in the registry (the
	// block is freed when it is removed). Empty means "host-ids" beside
	// the store's SQLite file, created (0700) if missing; with a store
	// that is no file (PostgreSQL), host projects' confined commands are
	// then refused.
	Owner string
}

// HostIDBlock is the size of the block of host ids claimed for host
// projects: a project whose id is HostIDBlock or more is refused (ids are
// never reused, and blocks never grow: see idrange.Claim).
const HostIDBlock = 1 << 20

// hostUsers hands out project users and makes their roots theirs. It is
// safe for concurrent use.
type hostUsers struct {
	cfg    HostIDs
	dbPath string

	mu      sync.Mutex
	block   idrange.Range          // zero until claimed
	granted map[grantKey]bool      // roots made writable for a user
	reached map[grantKey]bool      // roots checked reachable by a user
	locks   map[string]*sync.Mutex // per root, while granting
}

type grantKey struct {
	root string
	uid  uint32
}

func newHostUsers(cfg HostIDs, dbPath string) *hostUsers {
	return &hostUsers{cfg: cfg, dbPath: dbPath, granted: map[grantKey]bool{}, reached: map[grantKey]bool{}, locks: map[string]*sync.Mutex{}}
}

// user returns the user of host project id, claiming the block first if
// needed (once per process; a failed claim is retried by the next call).
func (h *hostUsers) user(id int64) (*confine.User, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.block.Size == 0 {
		owner := h.cfg.Owner
		if owner == "" && h.dbPath == "" {
			return nil, fmt.Errorf("provider: host ids: no state directory to own them in (the store is no file: set core.Options.StateDir)")
		}
		if owner == "" {
			owner = filepath.Join(filepath.Dir(h.dbPath), "host-ids")
		}
		if err := os.MkdirAll(owner, 0o700); err != nil {
			return nil, fmt.Errorf("provider: host ids: %w", err)
		}
		r, err := idrange.Claim(h.cfg.Registry, owner, HostIDBlock)
		if err != nil {
			return nil, fmt.Errorf("provider: claim host ids for host projects: %w", err)
		}
		h.block = r
	}
	if id <= 0 || id >= int64(h.block.Size) {
		return nil, fmt.Errorf("provider: project %d is beyond the %d host ids claimed for host projects (from %d): it cannot run confined", id, h.block.Size, h.block.Start)
	}
	uid := h.block.Start + uint32(id)
	return &confine.User{UID: uid, GID: uid}, nil
}

// prepareRoot makes root writable for u (posixacl.GrantUser, once per
// process and root) and reachable: if u cannot search every directory
// above it, each one that others cannot search gets an ACL entry letting u
// search it (posixacl.GrantSearch).
func (h *hostUsers) prepareRoot(root string, u *confine.User) error {
	k := grantKey{root, u.UID}
	h.mu.Lock()
	done := h.granted[k] && h.reached[k]
	l := h.locks[root]
	if l == nil {
		l = new(sync.Mutex)
		h.locks[root] = l
	}
	h.mu.Unlock()
	if done {
		return nil
	}
	l.Lock()
	defer l.Unlock()
	if err := posixacl.GrantUser(root, u.UID, nil); err != nil {
		if errors.Is(err, unix.EOPNOTSUPP) {
			return fmt.Errorf("provider: %s: its file system does not support POSIX ACLs, so it cannot be made writable for the project's user %d: %w", root, u.UID, err)
		}
		return fmt.Errorf("provider: make %s writable for the project's user %d: %w", root, u.UID, err)
	}
	if err := canReach(root, u); err != nil {
		// Let it search the directories above the root, and only those.
		for dir := filepath.Dir(root); ; dir = filepath.Dir(dir) {
			if gerr := posixacl.GrantSearch(dir, u.UID); gerr != nil {
				return fmt.Errorf("%w (%w)", err, gerr)
			}
			if dir == "/" {
				break
			}
		}
		if err := canReach(root, u); err != nil {
			return err
		}
	}
	h.mu.Lock()
	h.granted[k], h.reached[k] = true, true
	h.mu.Unlock()
	return nil
}

// switchCaps are the capabilities giving a command a user and namespaces
// of its own takes: emptying the bounding set (SETPCAP), the namespaces
// (SYS_ADMIN), the user switch (SETUID, SETGID), the ACLs of files others
// own (FOWNER) and the command's pipes (CHOWN).
var switchCaps = []uint{unix.CAP_SETPCAP, unix.CAP_SYS_ADMIN, unix.CAP_SETUID, unix.CAP_SETGID, unix.CAP_FOWNER, unix.CAP_CHOWN}

// canSwitchUsers reports whether this process is root with the
// capabilities host commands' own users need (root in a container often
// lacks CAP_SYS_ADMIN).
func canSwitchUsers() bool {
	if os.Geteuid() != 0 {
		return false
	}
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		return false
	}
	for _, c := range switchCaps {
		if data[c/32].Effective&(1<<(c%32)) == 0 {
			return false
		}
	}
	return true
}

// canReach checks, with u's credentials, that u can search and write dir:
// a directory above it that u cannot search (a home directory of mode
// 0700, say) makes every command fail to start.
func canReach(dir string, u *confine.User) error {
	errc := make(chan error, 1)
	go func() {
		// The thread's credentials change: it is never unlocked, so the
		// runtime discards it. Raw system calls change this thread alone
		// (the syscall package's Setuid and friends change every thread).
		runtime.LockOSThread()
		if _, _, e := unix.RawSyscall(unix.SYS_SETGROUPS, 0, 0, 0); e != 0 {
			errc <- fmt.Errorf("setgroups: %w", e)
			return
		}
		unix.RawSyscall(unix.SYS_SETFSGID, uintptr(u.GID), 0, 0)
		// From fsuid 0 to another, the thread loses its file system
		// capabilities (CAP_DAC_OVERRIDE and the like).
		unix.RawSyscall(unix.SYS_SETFSUID, uintptr(u.UID), 0, 0)
		errc <- unix.Faccessat(unix.AT_FDCWD, dir, unix.X_OK|unix.W_OK, unix.AT_EACCESS)
	}()
	if err := <-errc; err != nil {
		return fmt.Errorf("provider: the project's user %d cannot reach %s: %w", u.UID, dir, err)
	}
	return nil
}
