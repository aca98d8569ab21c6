// Package worker is corral's privileged worker: a persistent root process
// that serves protocol 2 (package wire) on a Unix socket and runs one
// machine per project.
//
// # Machines
//
// A machine is a Linux sandbox built from user, mount, pid, network, ipc
// and uts namespaces, with guest root mapped to an unprivileged host range
// of RangeSize ids, distinct per project. Its filesystem is the host's
// root read-only (nosuid, nodev; /home, /tmp, /proc, /sys and /dev are not
// the host's), the project workspace read-write at /workspace, a
// per-project home at /home/corral, a tmpfs /tmp, a /proc of each
// session's own (see Session /proc), a fresh read-only sysfs with Docker's
// masks (/sys/firmware, /sys/devices/virtual/powercap and the per-CPU
// thermal_throttle directories under an empty read-only tmpfs) and a
// minimal /dev (null, zero, full, random, urandom, tty, a devpts of its
// own (newinstance) with /dev/ptmx a link to pts/ptmx, so that sessions
// can open terminals, and a tmpfs /dev/shm); /tmp and /dev/shm are
// sized when the worker says so (ctl.Config.TmpSize); its hostname is
// "project-<id>"; its network is a loopback interface only. Each machine
// has a cgroup with memory and pids limits: v2 where /sys/fs/cgroup is
// the unified hierarchy, else the v1 memory and pids hierarchies. PID 1 of
// a machine is corral's own init — this binary re-executed (see
// MaybeRunInit), placed in the machine's cgroup before it may fork — which
// reaps zombies and forks sessions (see Session containment) as the
// unprivileged guest user
// GuestUID/GuestGID, with exactly the three descriptors the client
// attached as 0, 1 and 2 (put in blocking mode) and nothing else open, a
// checked cwd and an environment of PATH and HOME plus the request's.
//
// A machine starts on its project's first exec-start or net-dial, serves
// every later one, and stops once it has had no session for
// Config.IdleGrace; Shutdown stops them all. Stopping kills its init, which
// makes the kernel kill every process of the machine.
//
// # Session containment
//
// Every session runs in a pid namespace of its own, nested in the
// machine's, whose PID 1 is a holder: `env --ignore-signal=CHLD sleep
// infinity` from the host's coreutils (or, where env lacks that option, this
// binary re-executed; see MaybeRunInit) as guest root, with /dev/null as stdio and nothing else
// open, which ignores SIGCHLD (so the kernel releases every orphan
// reparented to it the moment it exits: no zombie is left) and otherwise
// sleeps until killed. The session's main process is an ordinary process
// of that namespace, not its PID 1: the init, on its one locked thread,
// enters the holder's mount namespace and points its pid_ns_for_children
// at the holder's pid namespace (one setns through the holder's pidfd),
// forks and execs the session, and returns to its own namespaces (two
// setns calls; about 4 µs in all, 2 µs more than the pid namespace
// alone). The main process is thus the init's child, which reaps it and
// reports exactly its exit, and it has ordinary signal semantics: kill $$
// and abort(3) kill it as anywhere else. It starts with every signal at its
// default disposition and none blocked.
//
// When the main process has been reaped, the init checks whether anything
// else is left in the namespace: every such process is then either in the
// holder's subtree (the main process's children were reparented to it) or,
// made by clone(CLONE_PARENT), a child of the init: two reads of /proc
// children lists (about 6 µs) tell. If nothing is, the exit is reported at
// once and the holder goes back to the pool for a later session. Otherwise — and on exec-cancel or a closed connection,
// whatever the state — the init SIGKILLs the holder, and the kernel kills
// every process of the namespace, whatever it double-forked or daemonised
// into; the exit is reported only once the holder is reaped, which is
// after that teardown. That is the tree kill: it cannot be escaped from
// inside (the holder runs as guest root, which the session's user cannot
// signal, and nothing leaves a pid namespace), costs no cgroup write on the
// exec path and is the same on cgroup v1 and v2.
//
// A pid namespace whose PID 1 has died accepts no process, so a killed
// holder is replaced. The init keeps two ready holders, spawned by a
// goroutine of its own, off the exec path, and keeps as many as the machine
// admits sessions (Config.MaxSessions, and the two) that sessions gave
// back, so that a burst of concurrent sessions reuses them; a session that
// finds none spawns one on the spot. A sleep holder is one thread and
// well under a megabyte; the Go fallback is this binary's runtime and
// package initialisation, then idle (GOMAXPROCS=1, GOGC=off), about 1.5 MiB
// anonymous and four or five threads, which count against the pids limit.
//
// Sessions have no cgroup of their own. On v1 (this project's CI hosts) a
// process can only join a cgroup after its fork, so a session could fork
// before being placed, and each migration costs about 85 µs per hierarchy
// (measured: the kernel synchronises RCU on every cgroup.procs write);
// two hierarchies would double the cost of a warm exec. Limits are
// per machine, enforced by its cgroup, and RLIMIT_NPROC for the guest user
// keeps a fork bomb 32 tasks below the pids limit (or at half of it), room
// for the init's threads and a few holders, so that the init can still
// create threads and serve the next request.
//
// Seen from inside, a session's parent pid is 0 (its parent, the init, is
// outside its namespace).
//
// # Session /proc
//
// Each holder also has a mount namespace of its own, a copy of the
// machine's taken when it is spawned, in which the machine's /proc is
// detached and replaced by a procfs of the holder's pid namespace. The
// init mounts it from outside, off the exec path, through procfs's pidns
// option (Linux 6.17; fsopen, fsconfig, fsmount, then move_mount from
// inside the holder's mount namespace), so a holder still runs nothing but
// sleep. Where procfs lacks that option, every holder is this binary,
// which mounts its own /proc before it reports ready (a Go start per
// holder, and the Go holder's threads and memory). A session thus sees its own pid namespace: $$, ps, kill and
// /proc/PID agree, /proc/self/fd holds the session's own descriptors, and
// PID 1 is the holder. The machine's /proc (of its pid namespace, mounted
// by the init; the host's is never in a machine) stays in the init's mount
// namespace, which no session process is in.
//
// Every session's /proc has Docker's masks (moby's default MaskedPaths and
// ReadonlyPaths): /proc/asound, acpi, interrupts, kcore, keys,
// latency_stats, timer_list, timer_stats, sched_debug and scsi, where the
// kernel has them, are hidden (a file under /dev/null, a directory under
// an empty read-only tmpfs), and so is /proc/cmdline (the host kernel's
// command line); /proc/bus, fs, irq, sys and sysrq-trigger are read-only
// binds. /proc/meminfo, /proc/stat and /proc/cpuinfo are the host's:
// virtualising them (as lxcfs does) is not done. The machine's /proc is
// detached, not covered: it is in no session's mount table. The masks
// cannot be undone by mounting a new procfs from a user namespace of
// one's own: the kernel mounts one there only where a fully visible
// procfs already is.
//
// A holder's mount namespace (about 15 mounts) costs about 0.2 ms more to
// spawn, off the exec path. Its teardown (about 0.2 ms, an RCU grace
// period) would delay the exit of a killed holder, and so the report of a
// cancelled session or of one that left processes behind: the init holds
// the namespace by a descriptor and drops it on another thread after the
// holder is reaped.
//
// # Workspace ownership
//
// The workspace and the home are idmapped mounts (open_tree and
// mount_setattr with MOUNT_ATTR_IDMAP): the workspace's host owner is the
// guest user inside, and what the guest creates belongs to that owner on
// the host; other host ids show as the overflow id inside. The home
// directory is owned by the workspace's owner on the host. Where a
// filesystem refuses idmapping, the worker logs a warning and falls back:
// the workspace is bind-mounted as it is (files the guest creates then
// belong to the guest user's host id, UIDBase+slot*RangeSize+GuestUID, and
// the owner's files are writable inside only through their "other"
// permission bits), and the home directory is chowned to the guest user's
// host id. MachineInfo.Idmapped says which happened.
//
// As the guest writes as the workspace's owner, possibly root, sessions run
// under a seccomp filter that refuses (EPERM) any mode with S_ISUID or
// S_ISGID in chmod, fchmod, fchmodat(2), open, openat, creat and mknod(at),
// and answers ENOSYS to openat2 and io_uring_setup, whose modes it cannot
// inspect: no set-id file can be planted on the host through a machine.
//
// # Protocol behaviour
//
// The worker handles each connection's frames in order, so a client may
// send exec-attach right behind exec-start without waiting for
// exec-accepted (if the start is rejected, the attach is answered with an
// error "unknown-session" and its descriptors are closed). Beyond what
// package wire pins:
//
//   - exec-start with an empty cwd runs in /workspace; any other cwd must
//     be a clean absolute path inside /workspace or /home/corral.
//   - Session ids are unique among a connection's unfinished sessions; an
//     id is free again after its exec-exit.
//   - exec-cancel of a session never attached ends it with exec-exit
//     {notStarted}; of an unknown or finished session, it does nothing.
//   - If a machine dies under running sessions (its init was killed), each
//     of them ends with an error frame {id, "machine-failed"}: their exits
//     were not observed, so no exec-exit is invented.
//   - A client frame of a type only the worker sends is a protocol error.
//
// The worker imports no corral package but wire.
package worker
