// Package worker is corral's privileged worker: a persistent root process
// that serves protocol 2 (package wire) on a Unix socket and runs one
// machine per project.
//
// # Machines
//
// A machine is a Linux sandbox built from user, mount, pid, network, ipc
// and uts namespaces, with guest root mapped to an unprivileged host range
// of RangeSize ids, distinct per project and between workers: each worker
// claims a block of Config.MaxProjects ranges for its state directory in
// the host-wide registry of package internal/idrange, and records each
// project's slot in StateDir/id-slots.json, so that a project keeps its
// range across restarts until ForgetProject frees it. Its hostname is
// "project-<id>"; its network is a loopback interface only. PID 1 of a
// machine is corral's own init — this binary re-executed (see
// MaybeRunInit), placed in the machine's cgroup before it may fork — which
// reaps zombies and forks sessions (see Session containment) as the
// session's user (see Privilege; by default the image's), with exactly the
// three descriptors the client attached as 0, 1 and 2 (put in blocking
// mode) — or, for a terminal session (wire.FeatureTTY), the slave of a pty
// the init allocated from the machine's devpts (/dev/pts/ptmx, checked to
// be a devpts, not the /dev/ptmx link guest root may replace), its
// controlling terminal, whose master goes to the client in exec-tty and of
// which neither the init nor the worker keeps a copy — and nothing else
// open, a checked cwd and an environment of PATH and
// HOME (the user's), the image's variables, then the request's.
//
// # Root filesystem
//
// A machine sees nothing of the host but what it is given. Its root is an
// overlay (mounted by the init inside the machine's user namespace, with
// userxattr): the layers of the project's image from the image store
// (package image; Config.ImagesDir) below, each an idmapped detached mount
// the worker makes (open_tree and mount_setattr MOUNT_ATTR_IDMAP, mapping
// the store's id block onto the machine's range, so that the image's root
// is guest root), and the project's upper directory above
// (StateDir/uppers/<id>, owned by the machine's guest root, in a 0700
// directory no host user reaches), so that guest root can install
// packages and what it changes persists across commands and machine
// restarts. On top: the workspace read-write at /workspace, the
// per-project home at /home/corral, the image's host binds read-only,
// nosuid and nodev (base: the host's /usr), a tmpfs /tmp, a /proc of each
// session's own (see Session /proc), a fresh read-only sysfs with Docker's
// masks (/sys/firmware, /sys/devices/virtual/powercap and the per-CPU
// thermal_throttle directories under an empty read-only tmpfs) and a
// minimal /dev (null, zero, full, random, urandom, tty, a devpts of its
// own (newinstance) with /dev/ptmx a link to pts/ptmx, so that sessions
// can open terminals, and a tmpfs /dev/shm); /tmp and /dev/shm are sized
// when the worker says so (ctl.Config.TmpSize). The default image is
// "base": a generated /etc (root and the guest user "user", no host
// account, no shadow) with the host's /usr. Nothing else of the host —
// not /etc, /opt, /srv, /var, /run, other workspaces, the worker's state,
// host sockets — exists inside. Mount points the image lacks are made in
// the upper layer, never through a symlink of the image.
//
// An exec-start's project may name its image (wire.FeatureMachineSpec);
// an unknown one is exec-rejected "bad-image". The image is resolved when
// the machine starts: a running machine keeps its image until it stops
// (idle, or a reset), and a machine started over an upper layer made for
// another image discards that layer first. machine-reset
// (wire.FeatureMachineReset; Reset) stops a machine without sessions and
// deletes its upper layer; with sessions it is refused "busy". The image's
// Env is the base of every session's environment (a request's PATH equal
// to DefaultPath keeps the image's PATH), its WorkingDir the cwd of a
// start without one (else /workspace), its User the sessions' default user
// (empty: root).
//
// # Limits
//
// Each machine has a cgroup with memory, pids and CPU limits: v2 where /sys/fs/cgroup
// is the unified hierarchy, else the v1 memory, pids and cpu (CFS quota)
// hierarchies, below the worker's own cgroup parent (Config.CgroupParent).
// The limits are the worker's defaults (Config.Limits) overridden by the
// request's project limits (wire.Limits) field by field; a request with
// other limits changes a running machine's memory, pids and CPU limits at
// once. /tmp and /dev/shm are tmpfs of Limits.Tmp bytes each, charged to
// the memory limit of the process that writes them. The init and its
// pid namespace holders have oom_score_adj -1000 (the OOM killer spares
// them), sessions 0 (see package guest). The machine's user namespace is
// owned by its guest root's host id, so that what it creates (inotify
// instances, namespaces: the kernel's per-user counts) is charged to the
// machine, never to host root.
//
// A net-listen (announced feature "net-listen") returns a TCP socket
// listening on 127.0.0.1:port inside a running machine's network namespace,
// made as net-dial's socket is; the worker keeps no copy and starts no
// machine for it. Once the machine stops nothing can connect to it; closing
// it is the client's business.
//
// A file request (announced feature "files", files.go) resolves a guest
// path inside the machine as a session user and answers with metadata or
// passes the descriptor it opened (a file to read, a temporary file to
// write and rename, an inotify descriptor); the client moves the bytes.
// The path is resolved by openat2 with RESOLVE_IN_ROOT and
// RESOLVE_NO_MAGICLINKS against the init's root (/proc/<pid>/root: the
// machine's mount tree seen from the worker) on a thread of its own whose
// real, effective and filesystem ids and groups are the user's host ids (an
// inotify instance is charged to the machine's user, never to host root)
// and which has no capability (package internal/fsop); procfs, sysfs and
// cgroupfs are refused. Guest root is tried so first and, when refused for
// permission, again with CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH and
// CAP_FOWNER on files owned by the machine's ids only: what its
// capabilities inside the user namespace reach. A file request holds the
// machine like a session while it runs (starting it if none runs).
//
// A machine starts on its project's first exec-start or net-dial, serves
// every later one, and stops once it has had no session for
// Config.IdleGrace; Shutdown stops them all. Stopping kills its init, which
// makes the kernel kill every process of the machine.
//
// # Disk
//
// A machine with a disk limit (Limits.Disk, a request's wire.Limits.Disk)
// has its home and its upper layer (see Root filesystem) on a disk of its
// own: an ext4 filesystem (package internal/datafs) in a sparse image
// file of exactly the limit, StateDir/disks/<id>.img, loop-mounted
// (nosuid, nodev; the loop device with autoclear) at StateDir/disks/<id>
// while a machine of the project runs (home/, layer/), and unmounted when
// the last one stops. A write past the limit — the guest user's in its
// home, root's anywhere in the image's tree — fails with ENOSPC inside
// the machine, never elsewhere; the host filesystem holding the image
// grows by at most the limit (the image takes only the blocks written;
// deleted files' blocks stay allocated in the image file, which no
// discard punches back), and other projects' disks are unaffected. The
// limit counts ext4's metadata: a 64 MiB disk offers about 55 MiB. The
// disk is sized to the limit at each machine start (e2fsck -f and
// resize2fs when it changed; a limit the data does not fit keeps the
// larger size, logged); a running machine keeps its size until it stops.
// A disk, once made, stays the project's even when its limit is removed
// (then kept at its size). Its first start moves the project's existing
// host home (HomesRoot/<id>) and upper layer (StateDir/uppers/<id>) onto
// it (cp -a, then the host copies are removed); what does not fit fails
// the start and stays where it was. A reset while the disk is unmounted
// leaves a mark (StateDir/disks/<id>.img.reset) that its next mount acts
// on. Machines without a limit and without a disk keep their home and
// upper layer on the host filesystem, unlimited.
//
// The worker does not reserve host space for the disks: the limits of
// all projects together may exceed what the host filesystem has free, and
// projects filling their disks then fill it (each by at most its limit).
//
// Not covered: the workspace, which is the user's host directory (corral
// run --project DIR) or the daemon's under its projects root, both on the
// host filesystem and unlimited.
//
// Project quotas on one shared filesystem would cost one mount per worker
// instead of one per running machine, but need the kernel's quota formats
// (ext4's CONFIG_QFMT_V2, CONFIG_XFS_QUOTA), which the hosts corral runs
// on lack. Cost of a disk, measured (go test -bench ColdExecDisk, 2-core
// VM at a load of 6, p50 of 40 cold starts of `true`): 19 ms without, 27
// ms with an existing disk (a loop device and an ext4 mount; unmounting,
// about 20 ms, happens after the machine stopped, off any request), 40 ms
// at a project's first start (mkfs.ext4 of a 256 MiB image, lazy inode
// tables: about 15 ms and 400 KiB). Nothing on the exec path of a running
// machine changes. A worker's Shutdown unmounts every disk; a new worker
// unmounts those a crashed one left mounted. Mount namespaces made while a
// disk was mounted (other workers' machines) keep its loop device until
// they end.
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
// finds none has that goroutine's thread spawn one at once. A sleep holder is one thread and
// well under a megabyte; the Go fallback is this binary's runtime and
// package initialisation, then idle (GOMAXPROCS=1, GOGC=off), about 1.5 MiB
// anonymous and four or five threads, which count against the pids limit.
//
// On v2, each session can also have a cgroup of its own, "s-<sid>" below
// its machine's (delegated to the machine's guest root): the init forks the
// main process straight into it (CLONE_INTO_CGROUP, no migration), kills
// it with cgroup.kill beside the holder on cancel, and removes it when
// the exit is reported. CLONE_INTO_CGROUP needs clone3, which the
// sessions' syscall policy (inherited from the forking threads) refuses
// with ENOSYS like Docker's; while it does, the init does not try (see
// package guest) and sessions have no group of their own on v2 either. On
// v1 (this project's CI hosts) they have none: a process can only join a cgroup after its fork,
// so a session could fork before being placed, and each migration costs
// about 85 µs per hierarchy (measured: the kernel synchronises RCU on
// every cgroup.procs write); two hierarchies would double the cost of a
// warm exec. Limits are
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
// No guest id writes as host root, nor as any host id outside its machine's range but
// the workspace's own unprivileged owner. A workspace owned by a host user
// U other than root is an idmapped mount (open_tree and mount_setattr with
// MOUNT_ATTR_IDMAP) showing U as the guest user inside: what the guest
// user creates belongs to U on the host; every other id of the machine's
// range maps to itself, so that guest root and the image's other users
// write the workspace too, their files belonging on the host to their own
// unprivileged ids of the machine; other host ids (root's among them) show
// as the overflow id inside and no guest write can produce them. A workspace owned by root is not idmapped (that would make the
// guest's files root's: a file capability or a git hook written there
// would run as host root): it is bound as it is, root's files show as the
// overflow id and are writable only through their "other" permission
// bits, and what the guest creates belongs to the guest user's host id,
// the range start + GuestUID. With Config.OwnWorkspaces (the daemon's
// workspaces) the worker first gives a root-owned workspace to that host
// id, recursively and without following symlinks. Where a filesystem
// refuses idmapping, the workspace is bound as is and the worker logs it;
// MachineInfo.Idmapped says which happened. The home and the upper layer
// belong to the machine's ids (the guest user's and guest root's host
// ids).
//
// The syscall policy (see Privilege) refuses (EPERM) any mode with S_ISUID or
// S_ISGID in chmod, fchmod, fchmodat(2), open, openat, creat and mknod(at),
// and answers ENOSYS to openat2 and io_uring, whose modes it cannot
// inspect; and no session can write a file capability (no CAP_SETFCAP, no
// nested user namespace): no set-id or capability-carrying file can be
// planted on the host through a machine.
//
// # Privilege
//
// Sessions run as the machine's default user (the image's; GuestUID and
// GuestGID for base) or as the user exec-start names (the "user"
// feature, announced in the worker's hello): a name or numeric uid,
// optionally ":group", resolved by the init against the machine's own
// /etc/passwd and /etc/group (supplementary groups from /etc/group; a
// numeric uid need not be in passwd). For any other user than root or a
// bare mapped uid, which every machine knows, the worker asks the init
// before it accepts the session (a lookup on the control channel, one
// round trip); an unknown user, or an id outside the machine's mapping, is
// exec-rejected "bad-user". HOME, unless the request sets it,
// is the guest home for the default non-root user and the passwd entry's
// for others (/root for root).
//
// Guest root holds Docker's default capabilities without CAP_SETFCAP
// (CHOWN, DAC_OVERRIDE, FSETID, FOWNER, MKNOD, NET_RAW, SETGID, SETUID,
// SETPCAP, NET_BIND_SERVICE, SYS_CHROOT, KILL, AUDIT_WRITE) as its
// effective, permitted and bounding sets; every other user holds none,
// not even in its bounding set; ambient and inheritable sets are empty and
// no_new_privs is set for all (set-id binaries and file capabilities in an
// image elevate nothing). As capabilities are per thread and Go cannot
// drop a bounding set between fork and exec, the init forks sessions of
// the default user's class (root or not) from its loop's thread and the
// others from a second locked thread, each with its class's bounding set,
// no_new_privs and the syscall policy installed, all inherited by what it
// forks; the loop hands a fork of the other class to that thread over a
// channel. A re-exec trampoline would have cost a Go start per command.
// The default user's warm exec is unchanged: go test -bench WarmExec,
// before against after, five interleaved runs on a loaded 2-core host,
// median p50s 865 against 688 µs sequential, 754 against 737 µs pipelined
// (the spread between runs is ±20%). Root costs the other thread's
// wake-up and a read of /etc/passwd and /etc/group at the start
// (sequential-root: p50 692, 1098, 874 µs against the default user's 575,
// 713, 844 in three runs at a load of 15); a user by name also costs the
// lookup round trip before exec-accepted.
//
// The syscall policy is Docker's default seccomp profile (see
// internal/guest's seccomp.go for the differences): default deny with
// EPERM, no new user namespace (unshare, clone; clone3 answers ENOSYS so
// that libc falls back to clone), no mount API, keyctl, bpf,
// perf_event_open, userfaultfd, kernel modules, clock setting, io_uring
// (ENOSYS), personality beyond Docker's values. ptrace is allowed, as in
// Docker: a session sees only its own pid namespace, and the kernel's
// checks (same uid, a capability subset, no CAP_SYS_PTRACE for anyone)
// leave a session the processes of its own user there. Holders are
// spawned by the pool's thread only, never by a forking thread, so they
// hold all of the machine's capabilities: no session, root's included,
// can attach to one. The 32-bit ABIs are refused.
//
// Each machine has limits of its own: before it builds the filesystem,
// the init sets its user namespace's /proc/sys/user limits — no user, network, ipc, uts, cgroup or time namespaces at all;
// pid and mount namespaces enough for its holders; 32 inotify instances
// and 32768 watches, 16 fanotify groups per user. While a machine's user
// namespace belongs to host root, these counts are also charged to host
// root's own quotas (fs.inotify.max_user_instances), so the per-machine
// limits are what keeps a machine's default user from exhausting them;
// guest root, which can switch to many uids, can still take several
// users' worth until machines' user namespaces belong to host users of
// their own.
//
// # Protocol behaviour
//
// The worker handles each connection's frames in order, so a client may
// send exec-attach right behind exec-start without waiting for
// exec-accepted (if the start is rejected, the attach is answered with an
// error "unknown-session" and its descriptors are closed). It announces
// wire.FeatureExecRun: an exec-run frame is an exec-start and its attach in
// one, handled in the same order, answered exec-started (no exec-accepted)
// or exec-rejected (its descriptors closed); package machine sends it, so
// a command is three frames. Beyond what package wire pins:
//
//   - The descriptors of exec-attach and exec-run (but a terminal
//     session's, which are closed unused) must each be a Unix socket, a
//     pipe or the null device: anything else (a directory, an O_PATH
//     descriptor, a host file or device, a memfd, a pidfd, a network
//     socket) would reach outside the machine. exec-run is then
//     exec-rejected "bad-field", exec-attach ends the session with
//     exec-exit notStarted; the descriptors are closed.
//   - exec-start with an empty cwd runs in the image's WorkingDir, else in
//     /workspace; any other cwd must be a clean absolute path inside
//     /workspace or /home/corral.
//   - Session ids are unique among a connection's unfinished sessions; an
//     id is free again after its exec-exit.
//   - exec-cancel of a session never attached ends it with exec-exit
//     {notStarted}; of an unknown or finished session, it does nothing.
//   - If a machine dies under running sessions (its init was killed, its
//     cgroup removed), each of them ends with an error frame {id,
//     "machine-failed"}: their exits were not observed, so no exec-exit is
//     invented. A session passed to the init whose start was not yet
//     reported gets exec-started first (its program may have run: its
//     outcome is unknown, it was not refused). Clients (package machine)
//     end such a session with ErrMachineFailed, a transport failure.
//   - A client frame of a type only the worker sends is a protocol error.
//
// The worker imports no corral package but wire and image (and the
// internal idrange).
package worker
