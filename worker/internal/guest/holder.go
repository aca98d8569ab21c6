package guest

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime"
	"strconv"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Every session runs in a pid namespace of its own, whose PID 1 is a
// holder: this binary re-executed (see Holder) as guest root, with its
// stdio on /dev/null and nothing else open. The session's main process is
// an ordinary process of that namespace, forked by the init after it
// pointed its thread's pid_ns_for_children at the holder's namespace and
// entered the holder's mount namespace, whose /proc is the holder's pid
// namespace's (see procfs.go), so that it keeps the init as its parent
// (which reaps it and reports its real exit) and ordinary signal
// semantics. Killing the holder makes the kernel kill every process of
// the namespace: the tree kill.
//
// A session that leaves nothing behind (see pid1.nsEmpty) returns its
// holder to the pool; one that does, or is cancelled, has its holder
// killed, and a pid namespace whose PID 1 has died accepts no new process.
// The init keeps up to poolSize holders ready, spawned by a goroutine of
// their own off the exec path: one more when the last ready one is taken,
// and a replacement for every one killed.

// HolderArg is the argument with which the init re-executes its binary as
// a holder; the binary's main must then call Holder (see worker's
// MaybeRunInit).
const HolderArg = "__corral-ns-holder"

// poolSize is how many ready holders a machine spawns ahead of need.
const poolSize = 2

// defaultRetain is how many unused holders a machine keeps when sessions
// give them back, unless the worker says how many sessions it admits (see
// retainFor): after a burst of concurrent sessions, the next burst reuses
// them instead of re-executing a holder per session (each costs a process
// start). An idle holder (sleep) costs well under 1 MB and one task of the
// pids limit.
const defaultRetain = 64

// retainFor returns how many unused holders to keep for a machine that
// admits maxSessions sessions (0: unknown): that many and the
// ahead-of-need few. With less, a steady load at the limit churns: the
// pool runs dry when every holder is in use, a holder is ordered, and the
// one too many is discarded when the sessions give theirs back.
func retainFor(maxSessions int) int {
	if maxSessions <= 0 {
		return defaultRetain
	}
	return maxSessions + poolSize
}

// holderEnv keeps a holder's Go runtime small and silent: one P (fewer
// threads, each of which counts against the machine's pids limit) and no
// periodic garbage collection (it allocates nothing after startup).
var holderEnv = []string{"GOMAXPROCS=1", "GOGC=off"}

// Holder is the main of a holder. It never returns.
//
// Ignoring SIGCHLD makes the kernel release every child reparented to it
// (every orphan of the session) as soon as it exits: no zombie is ever
// left, without the holder waking up. Zombies from before the disposition
// was set (the runtime starts with a handler) are reaped once. The holder
// then blocks until it is killed. Signals from the session cannot reach
// it: it runs as guest root and the session as the guest user.
//
// Started with holderMountArg, it first replaces its mount namespace's
// /proc by its own pid namespace's (ownProc) and reports holderMounted, or
// the error, on descriptor 3, which it then closes.
func Holder() {
	if len(os.Args) > 2 && os.Args[2] == holderMountArg {
		if err := ownProc(); err != nil {
			_, _ = unix.Write(3, []byte(err.Error()))
			os.Exit(1)
		}
		_, _ = unix.Write(3, []byte(holderMounted))
		unix.Close(3)
	}
	signal.Ignore(syscall.SIGCHLD)
	for {
		pid, err := unix.Wait4(-1, nil, unix.WNOHANG, nil)
		if err == unix.EINTR {
			continue
		}
		if err != nil || pid <= 0 {
			break
		}
	}
	for {
		_, _ = unix.Ppoll(nil, nil, nil)
	}
}

// holder is the PID 1 of a session's pid namespace, as the init sees it.
type holder struct {
	pid int
	// pidfd also names its pid namespace for setns (one descriptor less
	// per holder in the init's table, which every fork copies and every
	// exec then closes).
	pidfd  int
	childs int // its /proc children file, read with pread
	// mntns holds its mount namespace, so that the namespace's teardown
	// (its mounts, its /proc) is not part of the holder's exit, which a
	// session's exit report may wait for, but of close, after the report,
	// on another thread.
	mntns  int
	killed bool
}

// holderCommand is what a holder runs. Where the machine has GNU env and
// sleep (from the host's /, which every machine sees), it is
// `env --ignore-signal=CHLD sleep infinity`: SIGCHLD ignored survives the
// exec, so the kernel releases every orphan reparented to the holder as it
// exits; and a one-thread C program costs a fraction of a Go start (about
// 4 ms of CPU for this binary, whose packages' initialisation runs at every
// start) and one task of the pids limit instead of four or five. Whether
// env knows --ignore-signal (coreutils ≥ 8.31) is read off its binary, once
// (starting it to ask would race with the init's reaping). Otherwise a
// holder is this binary again (Holder), through the magic link: its host
// path is not visible in the machine.
var goHolderArgv = []string{"corral-ns-holder", HolderArg}

// holderMountArg makes a Go holder mount its own /proc and report
// holderMounted, or an error (see Holder).
const (
	holderMountArg = "mount-proc"
	holderMounted  = "ok"
)

var holderCommand = sync.OnceValues(func() (string, []string) {
	self := goHolderArgv
	env, sleep := "/usr/bin/env", "/bin/sleep"
	for _, p := range []string{env, sleep} {
		if err := unix.Access(p, unix.X_OK); err != nil {
			return "/proc/self/exe", self
		}
	}
	if b, err := os.ReadFile(env); err != nil || !bytes.Contains(b, []byte("ignore-signal")) {
		return "/proc/self/exe", self
	}
	return env, []string{"corral-ns-holder", "--ignore-signal=CHLD", sleep, "infinity"}
})

// spawn starts a holder in a new pid namespace and a new mount namespace,
// whose /proc it replaces by one of the holder's pid namespace
// (sessionProc). p.null is given to it as stdio; every other descriptor
// of the init is close-on-exec. It must run on a locked thread that has
// unshared its fs (unshareFS), in the init's namespaces, without the
// sessions' restrictions: the pool's spawner (see spawnNow).
func (p *holderPool) spawn() (*holder, error) {
	pidfd := -1
	attr := &syscall.ProcAttr{
		Dir:   "/",
		Env:   holderEnv,
		Files: []uintptr{uintptr(p.null), uintptr(p.null), uintptr(p.null)},
		Sys: &syscall.SysProcAttr{
			Cloneflags: syscall.CLONE_NEWPID | syscall.CLONE_NEWNS,
			PidFD:      &pidfd,
		},
	}
	path, argv := holderCommand()
	if p.goHolder {
		path, argv = "/proc/self/exe", goHolderArgv
	}
	// A self-mounting holder reports on a pipe (see Holder).
	var report, w *os.File
	if p.selfMount {
		var err error
		if report, w, err = os.Pipe(); err != nil {
			return nil, fmt.Errorf("spawn pid namespace holder: %w", err)
		}
		defer report.Close()
		path, argv = "/proc/self/exe", append(goHolderArgv[:len(goHolderArgv):len(goHolderArgv)], holderMountArg)
		attr.Files = append(attr.Files, w.Fd())
	}
	if path != "/proc/self/exe" {
		attr.Env = nil
	}
	pid, err := syscall.ForkExec(path, argv, attr)
	if w != nil {
		w.Close()
	}
	if err != nil {
		return nil, fmt.Errorf("spawn pid namespace holder: %w", err)
	}
	protectHolder(pid)
	h := &holder{pid: pid, pidfd: pidfd, childs: -1, mntns: -1}
	// Opened now, off the exec path. The holder is an unreaped child: its
	// pid cannot name another process.
	h.childs, err = openChildren(pid, pid)
	if err == nil {
		h.mntns, err = unix.Open("/proc/"+strconv.Itoa(pid)+"/ns/mnt", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	}
	if err != nil {
		h.discard()
		return nil, fmt.Errorf("pid namespace holder: %w", err)
	}
	if report != nil {
		err = holderReport(report)
	} else {
		err = sessionProc(h, p.home, p.fail)
	}
	if err != nil {
		h.discard()
		return nil, fmt.Errorf("pid namespace holder's /proc: %w", err)
	}
	// Per-holder settings made from outside (such as oom_score_adj, which
	// the limits of a machine may set on its holders) belong here: the
	// holder is not yet in the pool, and no session is in its namespace.
	return h, nil
}

// holderReport waits for a self-mounting holder's report on r.
func holderReport(r *os.File) error {
	b, err := io.ReadAll(r)
	switch {
	case err != nil:
		return err
	case string(b) != holderMounted:
		if len(b) == 0 {
			return errors.New("holder exited before it mounted its /proc")
		}
		return errors.New(string(b))
	}
	return nil
}

// alive reports whether h has not exited (a holder of the pool may have
// been killed, by the OOM killer for instance; its namespace is then
// dead).
func (h *holder) alive() bool {
	fds := []unix.PollFd{{Fd: int32(h.pidfd), Events: unix.POLLIN}}
	for {
		n, err := unix.Poll(fds, 0)
		if err == unix.EINTR {
			continue
		}
		return err == nil && n == 0
	}
}

// kill SIGKILLs h, which makes the kernel kill every process of its
// namespace. The pidfd makes it immune to pid reuse.
func (h *holder) kill() {
	h.killed = true
	_ = unix.PidfdSendSignal(h.pidfd, unix.SIGKILL, nil, 0)
}

// discard kills h and forgets it; the init's reaper collects it.
func (h *holder) discard() {
	h.kill()
	h.close()
}

// close closes h's descriptors. The last reference to a dead holder's
// mount namespace is dropped by another goroutine, so that its teardown
// (an RCU grace period, about 0.1 ms) does not hold up the caller.
func (h *holder) close() {
	for _, fd := range []int{h.pidfd, h.childs} {
		if fd >= 0 {
			unix.Close(fd)
		}
	}
	if h.mntns >= 0 {
		go unix.Close(h.mntns)
	}
}

// holderPool keeps ready holders. Its methods are called by the init's
// loop; spawning runs in a goroutine of its own, on another thread, so that
// a fork and an exec of the init's binary stay off the exec path.
type holderPool struct {
	null int
	home nsHome      // the init's namespaces, to return to after a spawn
	fail func(error) // reports a fatal error before the init exits
	// goHolder makes every holder this binary (Config.GoHolder).
	goHolder bool
	// selfMount makes every holder this binary, mounting its own /proc:
	// where procfs lacks the pidns option (pidnsOption), the mount must be
	// made from inside the pid namespace. It costs a Go start per holder
	// and the Go holder's threads and memory.
	selfMount bool
	retain    int           // unused holders kept (retainFor)
	retry     time.Duration // wait after a failed spawn (at the pids limit)
	wake      chan struct{} // wakes the spawner; capacity 1
	// now asks the spawner for a holder at once (spawnNow).
	now chan chan spawnResult

	mu      sync.Mutex
	ready   []*holder
	pending int // spawns ordered and not yet delivered
}

// newHolderPool starts a pool and its spawner, and orders poolSize
// holders. It fails if the spawner's thread cannot be made ready to enter
// holders' mount namespaces.
func newHolderPool(null int, home nsHome, fail func(error), goHolder bool, retain int) (*holderPool, error) {
	p := &holderPool{null: null, home: home, fail: fail, goHolder: goHolder, selfMount: !pidnsOption(), retain: retain, retry: 100 * time.Millisecond, wake: make(chan struct{}, 1), now: make(chan chan spawnResult)}
	ready := make(chan error, 1)
	go p.run(ready)
	if err := <-ready; err != nil {
		return nil, err
	}
	p.mu.Lock()
	p.orderLocked(poolSize)
	p.mu.Unlock()
	return p, nil
}

// orderLocked orders n more holders. Called with p.mu held.
func (p *holderPool) orderLocked(n int) {
	if n <= 0 {
		return
	}
	p.pending += n
	select {
	case p.wake <- struct{}{}:
	default:
	}
}

// run is the spawner. Its thread stays locked (and so is never reused by
// the runtime): spawning enters holders' mount namespaces.
func (p *holderPool) run(ready chan<- error) {
	runtime.LockOSThread()
	if err := unshareFS(); err != nil {
		ready <- err
		return
	}
	ready <- nil
	serve := func(reply chan spawnResult) {
		h, err := p.spawn()
		reply <- spawnResult{h, err}
	}
	for {
		select {
		case reply := <-p.now:
			serve(reply)
			continue
		case <-p.wake:
		}
		for {
			select {
			case reply := <-p.now:
				serve(reply)
				continue
			default:
			}
			p.mu.Lock()
			n := p.pending
			p.mu.Unlock()
			if n == 0 {
				break
			}
			h, err := p.spawn()
			if err != nil {
				select {
				case reply := <-p.now:
					serve(reply)
				case <-time.After(p.retry):
				}
				continue
			}
			p.mu.Lock()
			p.pending--
			// Kept as any returned holder is: under steady concurrency the
			// pool touches empty now and then, and a holder discarded
			// because sessions gave theirs back meanwhile was a wasted
			// spawn, repeated at the next touch.
			if len(p.ready) < p.retain {
				p.ready, h = append(p.ready, h), nil
			}
			p.mu.Unlock()
			if h != nil {
				h.discard()
			}
		}
	}
}

// get returns a holder: a ready one, or else one spawned on the spot
// (spawnNow; spawned is then true).
// When it takes the last ready holder and none is on its way, it orders
// one. A ready holder is not checked (a poll per session): one that died
// in the pool fails the fork into its namespace, and the caller discards
// it, purges the pool and tries again.
func (p *holderPool) get() (h *holder, spawned bool, err error) {
	p.mu.Lock()
	if n := len(p.ready); n > 0 {
		h, p.ready = p.ready[n-1], p.ready[:n-1]
	}
	if len(p.ready)+p.pending == 0 {
		p.orderLocked(1)
	}
	p.mu.Unlock()
	if h == nil {
		h, err = p.spawnNow()
		return h, err == nil, err
	}
	return h, false, nil
}

// fresh spawns a holder for the caller alone, bypassing the pool (whose
// ready holders may all be dead or dying), with spawnNow.
func (p *holderPool) fresh() (*holder, error) {
	return p.spawnNow()
}

// spawnResult is a spawn's outcome.
type spawnResult struct {
	h   *holder
	err error
}

// spawnNow has the spawner's thread spawn a holder at once and waits for
// it. Holders are never spawned by the threads that fork sessions: those
// run under the sessions' syscall policy and bounding set (see caps.go),
// under which a holder's /proc cannot be mounted, and a holder spawned
// there would hold no more capabilities than guest root (which could then
// attach to it). The spawner's thread has neither restriction; its
// holders are children of that thread.
func (p *holderPool) spawnNow() (*holder, error) {
	reply := make(chan spawnResult, 1)
	p.now <- reply
	r := <-reply
	return r.h, r.err
}

// purge discards every ready holder that has died and orders
// replacements.
func (p *holderPool) purge() {
	p.mu.Lock()
	var dead []*holder
	live := p.ready[:0]
	for _, h := range p.ready {
		if h.alive() {
			live = append(live, h)
		} else {
			dead = append(dead, h)
		}
	}
	clear(p.ready[len(live):])
	p.ready = live
	p.orderLocked(poolSize - len(p.ready) - p.pending)
	p.mu.Unlock()
	for _, h := range dead {
		h.discard()
	}
}

// put returns an unused holder (its namespace empty) to the pool, or
// discards it if the pool already keeps p.retain.
func (p *holderPool) put(h *holder) {
	p.mu.Lock()
	if len(p.ready) < p.retain {
		p.ready, h = append(p.ready, h), nil
	}
	p.mu.Unlock()
	if h != nil {
		h.discard()
	}
}

// replenish tops the pool up after a holder was used up (killed).
func (p *holderPool) replenish() {
	p.mu.Lock()
	p.orderLocked(poolSize - len(p.ready) - p.pending)
	p.mu.Unlock()
}

// openChildren opens the /proc file listing the children of thread tid of
// process pid, to be read with readAt.
func openChildren(pid, tid int) (int, error) {
	path := "/proc/" + strconv.Itoa(pid) + "/task/" + strconv.Itoa(tid) + "/children"
	return unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
}

// readAt reads the whole of the file open as fd, from its start, into buf
// (which must be large enough) and returns its contents. A /proc file is
// generated anew by a read at offset 0.
func readAt(fd int, buf []byte) ([]byte, error) {
	n := 0
	for {
		if n == len(buf) {
			return nil, fmt.Errorf("larger than %d bytes", len(buf))
		}
		m, err := unix.Pread(fd, buf[n:], int64(n))
		switch {
		case err == unix.EINTR:
			continue
		case err != nil:
			return nil, err
		case m == 0:
			return buf[:n], nil
		}
		n += m
	}
}

// openNull opens /dev/null for the holders' stdio.
func openNull() (int, error) {
	fd, err := unix.Open(os.DevNull, unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, fmt.Errorf("open %s: %w", os.DevNull, err)
	}
	return fd, nil
}
