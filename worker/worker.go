package worker

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/corral-sandbox/corral/image"
	"github.com/corral-sandbox/corral/internal/idrange"
	"github.com/corral-sandbox/corral/internal/layout"
	"github.com/corral-sandbox/corral/wire"
	"github.com/corral-sandbox/corral/worker/internal/cgroup"
	"github.com/corral-sandbox/corral/worker/internal/ctl"
	"github.com/corral-sandbox/corral/worker/internal/guest"
)

// Defaults for zero Config fields.
const (
	DefaultIdleGrace   = time.Minute
	DefaultSendTimeout = 5 * time.Second
	DefaultMaxSessions = 64
	DefaultMemory      = 1 << 30
	DefaultPids        = 512
	DefaultCPUMillis   = 1000
	DefaultTmp         = 256 << 20
	DefaultMaxProjects = 1024
	// RangeSize is the number of host ids mapped into each machine.
	RangeSize = 65536
	// GuestUID and GuestGID are the ids sessions run as inside a machine.
	GuestUID = 1000
	GuestGID = 1000
	// GuestWorkspace and GuestHome are where the workspace and the
	// per-project home are mounted inside a machine.
	GuestWorkspace = layout.Workspace
	GuestHome      = layout.Home
	// DefaultPath is the PATH of a session unless its request sets one.
	DefaultPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
)

// Re-execution arguments recognised by MaybeRunInit.
const (
	initArg = "__corral-machine-init"
	holdArg = "__corral-userns-hold"
)

// Limits are a machine's resource limits: the worker's defaults
// (Config.Limits), which a request's project limits (wire.Limits, feature
// machine-spec) override field by field.
type Limits struct {
	// Memory is the machine's memory limit in bytes (swap included where
	// the kernel accounts it). Zero means DefaultMemory; negative means no
	// limit. The pages of /tmp and /dev/shm (tmpfs) are charged to the
	// process that writes them, so they count against it.
	Memory int64
	// Pids is the machine's limit on tasks (threads count). Zero means
	// DefaultPids; negative means no limit.
	Pids int64
	// CPUMillis is the machine's CPU bandwidth in thousandths of a CPU
	// (cpu.max on cgroup v2, the CFS quota of the v1 cpu hierarchy). Zero
	// means DefaultCPUMillis; negative means no limit.
	CPUMillis int64
	// Tmp is the size in bytes of the machine's /tmp and, separately, of
	// its /dev/shm (tmpfs; both charged to Memory, so that together they
	// never exceed it). Zero means DefaultTmp; negative means unsized
	// (bounded by Memory alone).
	Tmp int64
	// Disk is the size in bytes of the machine's disk: an ext4 filesystem
	// in a sparse image file of its own (StateDir/disks/<id>.img,
	// loop-mounted while the machine runs) that holds its home and its
	// upper layer, so that a write past it fails with ENOSPC and the host
	// filesystem grows by at most Disk. It counts ext4's own metadata
	// (about 14% at 64 MiB) and is at least 8 MiB. The workspace is not
	// on it: it is a host directory, unlimited. Zero means no disk limit
	// unless the request sets one (then the home and the upper layer are
	// host directories, as for a project without a limit whose disk was
	// never made); negative means none. Once made, a project's disk stays
	// its own, resized at each machine start to the limit (kept as it is
	// when unlimited, or when its data does not fit a smaller one). See
	// the package documentation, Disk.
	Disk int64
}

// Config configures a Worker. Only ProjectsRoot and StateDir are required.
type Config struct {
	// ProjectsRoot is the directory under which workspaces are accepted:
	// an exec-start or net-dial whose workspace, after EvalSymlinks, is
	// not strictly below it is rejected with "bad-workspace". A machine
	// sees nothing of the host but its own workspace and home, its image
	// and the image's host binds (base: /usr).
	ProjectsRoot string
	// StateDir holds the worker's state. It must be root-owned.
	StateDir string
	// HomesRoot holds the per-project home directories (HomesRoot/<id>).
	// Empty means StateDir/homes.
	HomesRoot string
	// ImagesDir is the image store (package image) that machines' root
	// filesystems come from. Empty means StateDir/images; corral's daemon
	// and `corral run --project` pass <state>/images, beside the worker's
	// state <state>/worker, where `corral image import --state <state>`
	// puts images.
	ImagesDir string
	// OwnWorkspaces makes the worker give a root-owned workspace to the
	// project before its machine's first start: it chowns the tree
	// (recursively, never following a symlink) to the guest user's host
	// id, so that the project's files belong on the host to an unprivileged
	// id of its own. For workspaces the worker's operator manages (the
	// daemon's projects root); not for a user's checkout.
	OwnWorkspaces bool
	// GrantWorkspaces, for a root-owned workspace the worker does not own
	// (a checkout on a root machine), gives the machine's guest user and
	// guest root read and write access with POSIX ACL entries (the access
	// and default ACLs of the tree, package posixacl) before the machine's
	// first start, instead of binding it read-only in effect: owners and
	// modes stay, what the guest creates is its own unprivileged host
	// ids', and every ".git" is left out, so that the guest cannot write
	// the configuration or hooks host root's git would run. corral run's
	// shared worker sets it.
	GrantWorkspaces bool
	// IdleGrace is how long a machine without sessions stays up. Zero
	// means DefaultIdleGrace.
	IdleGrace time.Duration
	// MaxSessions limits the sessions (accepted and not yet ended) of one
	// machine; more are rejected with "too-many-sessions". Zero means
	// DefaultMaxSessions.
	MaxSessions int
	// SendTimeout bounds how long a frame to a client may wait for the
	// client to read: a connection whose client does not read for that long
	// is closed (which cancels its sessions), so that it cannot stall the
	// machines reporting to it. Zero means DefaultSendTimeout.
	SendTimeout time.Duration
	// Limits are every machine's resource limits.
	Limits Limits
	// MaxProjects is how many projects the worker holds host id ranges
	// for: it claims a block of MaxProjects*RangeSize host ids for its
	// state directory in the host-wide registry (IDRegistry; package
	// internal/idrange), distinct from every other state directory's, and
	// gives each project a slot of RangeSize ids in it, recorded in
	// StateDir/id-slots.json: stable across restarts (files keep their
	// owners), freed by ForgetProject. A project beyond MaxProjects is
	// rejected ("machine-failed", ErrTooManyProjects). Zero means
	// DefaultMaxProjects.
	MaxProjects int
	// IDRegistry is the host-wide registry of id blocks. Empty means
	// idrange.DefaultRegistry.
	IDRegistry string
	// UIDBase, when not zero, replaces the registry claim with the block
	// [UIDBase, UIDBase+MaxProjects*RangeSize): UNSAFE, as nothing stops
	// another worker or user from using those ids; for benchmarks and
	// tests. Below RangeSize is refused.
	UIDBase uint32
	// CgroupParent is where this worker's machine cgroups are created: a
	// clean relative path, below the worker's own cgroup on v1 and on a
	// delegated v2 subtree (systemd's Delegate=yes; the worker then moves
	// itself into a "worker" child group), below the root of a
	// non-delegated v2 hierarchy. Empty means "corral-" and 12 hex digits
	// of the SHA-256 of the resolved StateDir, so that workers with
	// different state directories never share one. The parent is the
	// worker's alone: New removes the machine groups (machine-*) a previous
	// run left there, killing their processes, and a parent removed from
	// outside is recreated at the next machine start. Two workers must not
	// be given the same parent.
	CgroupParent string
	// Logger receives the worker's logs. Nil means no logging.
	Logger *slog.Logger
	// SelfExe is the executable re-executed as a machine init; it must call
	// MaybeRunInit first thing in main. Empty means /proc/self/exe.
	SelfExe string
	// Name is the worker's name in its hello frame. Empty means
	// "corral-worker".
	Name string
	// AllowUID is the one uid besides root whose connections are served
	// (the daemon's, when it does not run as root). The worker reads each
	// accepted connection's peer credentials (SO_PEERCRED) and answers any
	// other peer a connection error frame with code "forbidden" before
	// interpreting anything it sends, then closes it. Zero means root only.
	AllowUID uint32
	// images overrides the store opened from ImagesDir (tests).
	images imageStore

	// GoHolders makes every session's pid-namespace holder corral's own
	// binary (SelfExe) instead of `env --ignore-signal=CHLD sleep infinity`
	// from the host, which machines use when the host's env supports that
	// option. For hosts without GNU coreutils 8.31 or newer, and tests.
	GoHolders bool
}

// RequireRoot returns an error unless the process runs as root.
func RequireRoot() error {
	if uid := os.Geteuid(); uid != 0 {
		return fmt.Errorf("corral worker must run as root (effective uid is %d): it creates user namespaces with mapped id ranges, cgroups and idmapped mounts", uid)
	}
	return nil
}

// MaybeRunInit must be the first thing main (and TestMain) does in a binary
// that serves as Config.SelfExe. If the process was started by the worker
// as a machine init (or as one of its helpers), it runs that and never
// returns; otherwise it returns at once.
func MaybeRunInit() {
	if len(os.Args) < 2 {
		return
	}
	switch os.Args[1] {
	case initArg:
		guest.Main()
	case guest.HolderArg:
		guest.Holder()
	case holdArg:
		// Holds a user namespace open for the worker until stdin closes.
		_, _ = io.Copy(io.Discard, os.Stdin)
		os.Exit(0)
	}
}

// Worker serves protocol 2 and runs machines. Its methods are safe for
// concurrent use.
type Worker struct {
	cfg      Config
	log      *slog.Logger
	root     string // ProjectsRoot, resolved
	cgroups  *cgroup.Layout
	ids      idrange.Range // host ids of the machines: one RangeSize slot per project
	hostNet  *os.File
	disks    *disks
	images   imageStore
	closeNet sync.Once

	nsMu    sync.Mutex
	nsCache map[string]*os.File // user namespaces of idmapped mounts, by maps
	// configHook, when set (by tests), edits every machine's init config.
	configHook func(*ctl.Config)
	lock       *os.File // the state directory's lock, held until Shutdown
	// sessionLayout, set by tests on hybrid hosts, is a v2 layout where
	// sessions get their groups (otherwise only a v2 machine layout).
	// Atomic: a test sets it while the worker serves.
	sessionLayout atomic.Pointer[cgroup.Layout]
	// noOOMProtection logs once that inits cannot be protected.
	noOOMProtection sync.Once
	defaults        machineLimits

	mu       sync.Mutex
	gen      int // machines started, for unique cgroup names
	machines map[int64]*machine
	slots    map[int64]int // project id → id-range slot, persisted in StateDir
	used     map[int]bool
	// workspaces maps project ids to the workspace their machine last
	// started for (persisted with slots).
	workspaces map[int64]string
	// resetting holds the projects being reset; each channel closes when
	// its reset is done. No machine of theirs starts meanwhile.
	resetting map[int64]chan struct{}
	// latest is each project's most recent machine, running or stopping,
	// until it is dead: a new machine waits for it (they would share the
	// upper layer), and so does a reset.
	latest map[int64]*machine
	conns  map[*conn]struct{}
	closed bool
}

// MachineInfo describes a running machine.
type MachineInfo struct {
	ProjectID int64
	Workspace string
	// InitPID is the host pid of the machine's init.
	InitPID int
	// HostUID is the host id that guest id 0 maps to.
	HostUID uint32
	// Sessions counts the accepted sessions not yet ended.
	Sessions int
	// Cgroups are the machine's cgroup directories.
	Cgroups []string
	// Idmapped reports whether the workspace is an idmapped mount.
	Idmapped bool
	// Image is the name of the machine's image, ImageID its id.
	Image, ImageID string
}

// New checks cfg and prepares a worker; it starts no machine. It removes
// stale machine cgroups under CgroupParent and marks every inherited
// descriptor above 2 close-on-exec, so that none reaches a machine. It fails
// when not run as root, when ProjectsRoot or StateDir are unusable, or when
// no usable cgroup hierarchy exists.
func New(cfg Config) (*Worker, error) {
	if err := RequireRoot(); err != nil {
		return nil, err
	}
	if cfg.ProjectsRoot == "" || cfg.StateDir == "" {
		return nil, errors.New("worker: ProjectsRoot and StateDir are required")
	}
	root, err := filepath.EvalSymlinks(cfg.ProjectsRoot)
	if err != nil {
		return nil, fmt.Errorf("worker: projects root: %w", err)
	}
	if root, err = filepath.Abs(root); err != nil {
		return nil, fmt.Errorf("worker: projects root: %w", err)
	}
	if err := os.MkdirAll(cfg.StateDir, 0o711); err != nil {
		return nil, fmt.Errorf("worker: %w", err)
	}
	stateDir, err := filepath.EvalSymlinks(cfg.StateDir)
	if err == nil {
		stateDir, err = filepath.Abs(stateDir)
	}
	if err != nil {
		return nil, fmt.Errorf("worker: state directory: %w", err)
	}
	if cfg.HomesRoot == "" {
		cfg.HomesRoot = filepath.Join(cfg.StateDir, "homes")
	}
	if err := os.MkdirAll(cfg.HomesRoot, 0o711); err != nil {
		return nil, fmt.Errorf("worker: %w", err)
	}
	if cfg.ImagesDir == "" {
		cfg.ImagesDir = filepath.Join(cfg.StateDir, "images")
	}
	if err := os.MkdirAll(filepath.Join(cfg.StateDir, "uppers"), 0o700); err != nil {
		return nil, fmt.Errorf("worker: %w", err)
	}
	if cfg.IdleGrace == 0 {
		cfg.IdleGrace = DefaultIdleGrace
	}
	if cfg.MaxSessions == 0 {
		cfg.MaxSessions = DefaultMaxSessions
	}
	if cfg.SendTimeout <= 0 {
		cfg.SendTimeout = DefaultSendTimeout
	}
	if cfg.MaxProjects <= 0 {
		cfg.MaxProjects = DefaultMaxProjects
	}
	if cfg.CgroupParent == "" {
		cfg.CgroupParent = DefaultCgroupParent(stateDir)
	}
	if cfg.SelfExe == "" {
		cfg.SelfExe = "/proc/self/exe"
	}
	if cfg.Name == "" {
		cfg.Name = "corral-worker"
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	w := &Worker{
		cfg: cfg, log: log, root: root,
		defaults: machineLimits{
			Limits: cgroup.Limits{
				Memory:    limit(cfg.Limits.Memory, DefaultMemory),
				Pids:      limit(cfg.Limits.Pids, DefaultPids),
				CPUMillis: limit(cfg.Limits.CPUMillis, DefaultCPUMillis),
			},
			Tmp:  limit(cfg.Limits.Tmp, DefaultTmp),
			Disk: max(cfg.Limits.Disk, 0),
		},
		images:     cfg.images,
		machines:   make(map[int64]*machine),
		slots:      make(map[int64]int),
		used:       make(map[int]bool),
		workspaces: make(map[int64]string),
		resetting:  make(map[int64]chan struct{}),
		latest:     make(map[int64]*machine),
		nsCache:    make(map[string]*os.File),
		conns:      make(map[*conn]struct{}),
	}
	if w.images == nil {
		st, err := image.Open(cfg.ImagesDir, image.Options{Logger: log})
		if err != nil {
			return nil, fmt.Errorf("worker: images: %w", err)
		}
		w.images = st
	}
	// One worker per state directory: another one would sweep this one's
	// cgroups and share its id slots.
	if w.lock, err = lockStateDir(stateDir); err != nil {
		return nil, err
	}
	ok := false
	defer func() {
		if !ok {
			w.lock.Close()
		}
	}()
	if w.ids, err = claimIDs(&w.cfg, stateDir); err != nil {
		return nil, err
	}
	if err := w.loadSlots(); err != nil {
		return nil, err
	}
	w.disks = &disks{dir: filepath.Join(stateDir, "disks"), m: make(map[int64]*diskRef)}
	if err := w.disks.sweep(); err != nil {
		return nil, fmt.Errorf("worker: disks: %w", err)
	}
	w.reconcileSlots()
	if w.cgroups, err = cgroup.Detect(cfg.CgroupParent); err != nil {
		return nil, fmt.Errorf("worker: %w", err)
	}
	if err := w.cgroups.RemoveStale(); err != nil {
		log.Warn("removing stale machine cgroups", "err", err)
	}
	markInheritedCloexec()
	if w.hostNet, err = os.Open("/proc/thread-self/ns/net"); err != nil {
		return nil, fmt.Errorf("worker: %w", err)
	}
	ok = true
	return w, nil
}

// ErrStateDirInUse is returned by New when another worker holds the state
// directory.
var ErrStateDirInUse = errors.New("worker: the state directory is in use by another worker")

// lockStateDir takes the state directory's exclusive lock (flock on
// StateDir/worker.lock), held until the returned file is closed: by
// Shutdown, or by the process's end.
func lockStateDir(dir string) (*os.File, error) {
	f, err := os.OpenFile(filepath.Join(dir, "worker.lock"), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("worker: %w", err)
	}
	for {
		err = unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
		if err != unix.EINTR {
			break
		}
	}
	if err != nil {
		f.Close()
		if err == unix.EWOULDBLOCK {
			return nil, fmt.Errorf("%w: %s", ErrStateDirInUse, dir)
		}
		return nil, fmt.Errorf("worker: lock %s: %w", dir, err)
	}
	return f, nil
}

// DefaultCgroupParent is the cgroup parent of a worker whose
// Config.CgroupParent is empty: "corral-" and the first 12 hex digits of
// the SHA-256 of stateDir (which should be resolved: absolute, without
// symlinks).
func DefaultCgroupParent(stateDir string) string {
	sum := sha256.Sum256([]byte(stateDir))
	return "corral-" + hex.EncodeToString(sum[:6])
}

// markInheritedCloexec makes every descriptor above 2 close-on-exec, so
// that none the worker inherited (Go opens its own with O_CLOEXEC) reaches
// a machine init.
func markInheritedCloexec() {
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return
	}
	for _, e := range ents {
		if fd, err := strconv.Atoi(e.Name()); err == nil && fd > 2 {
			unix.CloseOnExec(fd)
		}
	}
}

func limit(v, def int64) int64 {
	switch {
	case v == 0:
		return def
	case v < 0:
		return 0
	}
	return v
}

// Listen makes the worker's "unixpacket" socket at path, mode 0600
// (replacing a stale socket file a previous worker left), for Serve. See
// wire.Listen.
func Listen(path string) (*net.UnixListener, error) { return wire.Listen(path) }

// Serve accepts connections on ln and serves each until it closes. It
// blocks until ctx is done or ln fails; it then closes ln and every
// connection it accepted (which cancels their sessions) and returns — nil
// when ctx ended, the accept error otherwise. Machines keep running until
// they go idle or Shutdown is called.
func (w *Worker) Serve(ctx context.Context, ln *net.UnixListener) error {
	var wg sync.WaitGroup
	stop := context.AfterFunc(ctx, func() { ln.Close() })
	defer stop()
	var err error
	for {
		var uc *net.UnixConn
		uc, err = ln.AcceptUnix()
		if err != nil {
			break
		}
		c := newConn(w, wire.NewConn(uc))
		w.mu.Lock()
		if w.closed {
			w.mu.Unlock()
			uc.Close()
			continue
		}
		w.conns[c] = struct{}{}
		w.mu.Unlock()
		wg.Add(1)
		go func() {
			defer wg.Done()
			c.serve()
			w.mu.Lock()
			delete(w.conns, c)
			w.mu.Unlock()
		}()
	}
	ln.Close()
	w.mu.Lock()
	for c := range w.conns {
		c.wc.Close()
	}
	w.mu.Unlock()
	wg.Wait()
	if ctx.Err() != nil {
		return nil
	}
	return fmt.Errorf("worker: accept: %w", err)
}

// Serve runs a worker with cfg on ln until ctx ends (for example on
// SIGTERM, with signal.NotifyContext), then stops every machine. It returns
// New's error, Serve's accept error, or nil after a clean stop.
func Serve(ctx context.Context, ln *net.UnixListener, cfg Config) error {
	w, err := New(cfg)
	if err != nil {
		ln.Close()
		return err
	}
	serr := w.Serve(ctx, ln)
	sctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	return errors.Join(serr, w.Shutdown(sctx))
}

// Shutdown closes every connection, stops every machine (killing all their
// processes) and removes their cgroups. It blocks until that is done or ctx
// ends, returning ctx.Err() in the latter case. After Shutdown the worker
// accepts no connection and starts no machine. It is idempotent.
func (w *Worker) Shutdown(ctx context.Context) error {
	w.mu.Lock()
	w.closed = true
	for c := range w.conns {
		c.wc.Close()
	}
	ms := make([]*machine, 0, len(w.machines))
	for id, m := range w.machines {
		ms = append(ms, m)
		delete(w.machines, id)
	}
	w.mu.Unlock()
	for _, m := range ms {
		m.stop("worker shutdown")
	}
	for _, m := range ms {
		select {
		case <-m.dead:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	w.disks.closeAll(w.log)
	w.closeNet.Do(func() { w.hostNet.Close(); w.lock.Close() })
	w.nsMu.Lock()
	for k, f := range w.nsCache {
		f.Close()
		delete(w.nsCache, k)
	}
	w.nsMu.Unlock()
	w.cgroups.RemoveParents()
	return nil
}

// Machines describes the running machines, sorted by project id.
func (w *Worker) Machines() []MachineInfo {
	w.mu.Lock()
	ms := make([]*machine, 0, len(w.machines))
	for _, m := range w.machines {
		ms = append(ms, m)
	}
	w.mu.Unlock()
	var out []MachineInfo
	for _, m := range ms {
		select {
		case <-m.ready:
		default:
			continue
		}
		if m.startErr != nil {
			continue
		}
		m.mu.Lock()
		out = append(out, MachineInfo{
			ProjectID: m.id, Workspace: m.workspace, InitPID: m.initPID, HostUID: m.hostUID,
			Sessions: m.refs, Cgroups: m.cg.Paths(), Idmapped: m.idmapped,
			Image: m.image, ImageID: m.imageID,
		})
		m.mu.Unlock()
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ProjectID < out[j].ProjectID })
	return out
}

// errClosed is returned when a machine is requested after Shutdown.
var errClosed = errors.New("worker: shut down")

// acquire returns the running machine of project id for the requested
// workspace, starting it if needed, and counts one reference on it that
// the caller must release. It fails with a *rejection for a bad or
// mismatched workspace, too many sessions, or a machine that failed to
// start.
//
// A running machine started for the very same requested path is reused
// without resolving the path again: the workspace it mounted was checked
// when it started, and nothing is mounted anew. A running machine is used
// whatever image the request names: a changed image takes effect at the
// machine's next start (once it has been idle for the grace, or after a
// reset).
func (w *Worker) acquire(id int64, requested, img string, session bool, lim machineLimits) (*machine, error) {
	ws := "" // resolved only when no machine runs for requested
	for {
		m, next, err := w.claim(id, requested, ws, img, session, lim)
		switch {
		case err != nil:
			return nil, err
		case m != nil:
			if next.start {
				go m.start()
			}
			return m.await(session)
		case next.resolve:
			if ws, err = w.resolveWorkspace(requested); err != nil {
				return nil, &rejection{wire.CodeBadWorkspace, err.Error()}
			}
		case next.reset != nil:
			<-next.reset
			ws = ""
		default: // a stopping machine was forgotten: afresh
			ws = ""
		}
	}
}

// claimNext is what acquire does with a machine claimed (start it: it is
// new), or, without one, before claiming again: resolve the workspace, or
// wait for a reset to finish (neither: claim afresh).
type claimNext struct {
	start   bool
	resolve bool
	reset   <-chan struct{}
}

// claim takes a reference on project id's machine, under w.mu: the one
// running for requested, else (with ws, the resolved workspace) the one
// running for ws or a new one, started in the background. Without a
// machine to return it says what acquire must do first.
func (w *Worker) claim(id int64, requested, ws, img string, session bool, lim machineLimits) (*machine, claimNext, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	m := w.machines[id]
	switch {
	case m != nil && m.requested == requested:
		return w.hold(m, session)
	case ws == "":
		return nil, claimNext{resolve: true}, nil
	case m != nil && m.workspace != ws:
		m.mu.Lock()
		stopping := m.stopping
		m.mu.Unlock()
		if !stopping {
			return nil, claimNext{}, &rejection{wire.CodeBadWorkspace, fmt.Sprintf("project %d runs with workspace %s", id, m.workspace)}
		}
		return w.hold(m, session)
	case m == nil:
		if done := w.resetting[id]; done != nil && session {
			return nil, claimNext{reset: done}, nil
		}
		m, err := w.startMachine(id, ws, requested, img, session, lim)
		return m, claimNext{start: true}, err
	}
	return w.hold(m, session)
}

// hold takes a reference on m. Called with w.mu held. A stopping machine
// is forgotten instead (nothing returned, nothing to do first): the caller
// claims afresh, resolving the workspace again.
func (w *Worker) hold(m *machine, session bool) (*machine, claimNext, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	switch {
	case m.stopping:
		if w.machines[m.id] == m {
			delete(w.machines, m.id)
		}
		return nil, claimNext{}, nil
	case session && m.sessions >= w.cfg.MaxSessions:
		return nil, claimNext{}, &rejection{wire.CodeTooManySessions, fmt.Sprintf("project %d already has %d sessions", m.id, w.cfg.MaxSessions)}
	}
	m.hold(session)
	return m, claimNext{}, nil
}

// startMachine registers a new machine, holding a reference on it, for
// the caller to start once w.mu is released. Called with w.mu held. Only sessions start
// machines: a net-dial to a project without one fails ("dial-failed"), as
// nothing could be listening there.
func (w *Worker) startMachine(id int64, ws, requested, img string, session bool, lim machineLimits) (*machine, error) {
	if w.closed {
		return nil, errClosed
	}
	if !session {
		return nil, &rejection{wire.CodeDialFailed, fmt.Sprintf("project %d has no running machine", id)}
	}
	slot, err := w.slot(id, ws)
	if err != nil {
		return nil, &rejection{wire.CodeMachineFailed, err.Error()}
	}
	m := w.newMachine(id, ws, requested, img, slot, lim)
	m.prev = w.latest[id]
	w.latest[id] = m
	m.hold(session)
	w.machines[id] = m
	return m, nil
}

// await waits until m has started, dropping the reference if it failed.
func (m *machine) await(session bool) (*machine, error) {
	<-m.ready
	if m.startErr != nil {
		m.release(session)
		return nil, m.startErr
	}
	return m, nil
}

// forget removes m from the machine table if it is still there.
func (w *Worker) forget(m *machine) {
	w.mu.Lock()
	if w.machines[m.id] == m {
		delete(w.machines, m.id)
	}
	w.mu.Unlock()
}

// buried forgets m, which is dead, as the project's latest machine.
func (w *Worker) buried(m *machine) {
	w.mu.Lock()
	if w.latest[m.id] == m {
		delete(w.latest, m.id)
	}
	w.mu.Unlock()
}

// resolveWorkspace checks a requested workspace: absolute, existing, a
// directory, and strictly below the projects root after EvalSymlinks.
func (w *Worker) resolveWorkspace(p string) (string, error) {
	if !filepath.IsAbs(p) {
		return "", fmt.Errorf("workspace %q is not an absolute path", p)
	}
	r, err := filepath.EvalSymlinks(p)
	if err != nil {
		return "", fmt.Errorf("workspace %q: %w", p, unwrapPath(err))
	}
	rel, err := filepath.Rel(w.root, r)
	if err != nil || rel == "." || rel == ".." || len(rel) >= 3 && rel[:3] == "../" {
		return "", fmt.Errorf("workspace %q is not under the projects root %s", p, w.root)
	}
	var st unix.Stat_t
	if err := unix.Stat(r, &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFDIR {
		return "", fmt.Errorf("workspace %q is not a directory", p)
	}
	return r, nil
}

func unwrapPath(err error) error {
	var pe *os.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}

// rejection is a refusal with a wire code.
type rejection struct{ code, msg string }

func (r *rejection) Error() string { return r.code + ": " + r.msg }
