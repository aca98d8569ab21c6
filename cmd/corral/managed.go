package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/corral-sandbox/corral/internal/workerproc"
	"github.com/corral-sandbox/corral/machine"
)

// The shared worker of a state directory.
//
// Every `corral run --project` (and exec, cp) on one state directory uses
// one worker, STATE/worker.sock, serving every project: the first run
// starts it, detached (a session of its own: Ctrl-C in a terminal does not
// reach it), later runs connect to it, and it exits once no run has used
// it for --worker-idle. Two lock files order this, without a daemon:
//
//	STATE/worker-users.lock  every run holds it shared (LOCK_SH) from
//	                         before it looks for the worker until it ends;
//	                         the idle worker takes it exclusively
//	                         (LOCK_EX|LOCK_NB), so it exits only when no run
//	                         is in progress, and runs that arrive meanwhile
//	                         wait until it is gone, then start a new one.
//	STATE/worker-start.lock  exclusive while a run checks for the worker
//	                         and starts it: one start at a time.
//
// A run touches the users lock when it ends: its modification time is when
// the worker was last used. The worker's logs go to STATE/worker.log
// (truncated at each start), its pid to STATE/worker.pid.
const (
	sharedSocket    = "worker.sock"
	sharedUsersLock = "worker-users.lock"
	sharedStartLock = "worker-start.lock"
	sharedLog       = "worker.log"
	sharedPid       = "worker.pid"
	// DefaultWorkerIdle is how long the shared worker stays without runs
	// before it exits (and, with it, the machines it kept warm).
	DefaultWorkerIdle = time.Minute
	// lockPoll is how often a run waiting for a lock tries again.
	lockPoll = 10 * time.Millisecond
)

// startManagedTransport returns the transport for a --project run: the
// given --worker-socket, or the state directory's shared worker (started
// if none answers), which release lets go of.
func startManagedTransport(ctx context.Context, f *runFlags, state string) (machine.PrivilegedTransport, func(), error) {
	if f.workerSocket != "" {
		return machine.SocketTransport{Path: f.workerSocket}, func() {}, nil
	}
	if os.Geteuid() != 0 {
		return nil, nil, errors.New("managed projects need the privileged worker: run as root, or pass --worker-socket")
	}
	idle := f.workerIdle
	if idle <= 0 {
		idle = DefaultWorkerIdle
	}
	sock, release, err := useSharedWorker(ctx, state, idle)
	if err != nil {
		return nil, nil, err
	}
	return machine.SocketTransport{Path: sock}, release, nil
}

// useSharedWorker makes sure the shared worker of state runs and holds it
// in use until release is called; it returns its socket.
func useSharedWorker(ctx context.Context, state string, idle time.Duration) (sock string, release func(), err error) {
	sock = filepath.Join(state, sharedSocket)
	if len(sock) >= len(unix.RawSockaddrUnix{}.Path) {
		return "", nil, fmt.Errorf("state directory %s: its path is too long for the worker's socket (use a shorter --state)", state)
	}
	users, err := lockFile(ctx, filepath.Join(state, sharedUsersLock), unix.LOCK_SH)
	if err != nil {
		return "", nil, err
	}
	release = func() {
		now := time.Now()
		_ = os.Chtimes(users.Name(), now, now) // the worker's last use
		users.Close()
	}
	start, err := lockFile(ctx, filepath.Join(state, sharedStartLock), unix.LOCK_EX)
	if err != nil {
		release()
		return "", nil, err
	}
	defer start.Close()
	if answers(ctx, sock) {
		return sock, release, nil
	}
	if err := startSharedWorker(ctx, state, sock, idle); err != nil {
		release()
		return "", nil, err
	}
	return sock, release, nil
}

// startSharedWorker starts the shared worker, detached, and waits until it
// answers.
func startSharedWorker(ctx context.Context, state, sock string, idle time.Duration) error {
	self, err := os.Executable()
	if err != nil {
		return err
	}
	logPath := filepath.Join(state, sharedLog)
	logf, err := os.OpenFile(logPath, os.O_WRONLY|os.O_CREATE|os.O_TRUNC|os.O_APPEND|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return fmt.Errorf("worker log: %w", err)
	}
	defer logf.Close()
	// Every project's workspace is accepted (--projects-root /): only root
	// reaches the socket (mode 0600 in a root-owned state directory), and
	// root can name any directory to corral run anyway. Images beside the
	// worker's state (STATE/images, where `corral image import --state
	// STATE` puts them). Not --own-workspaces: a workspace is the user's
	// own checkout.
	p, err := workerproc.Start(ctx, workerproc.Options{
		Exe: self,
		Args: workerproc.Args{Socket: sock, ProjectsRoot: "/", State: filepath.Join(state, "worker"),
			Images: filepath.Join(state, "images"), GrantWorkspaces: true, AllowUID: -1, ExitIdle: idle,
			IdleLock: filepath.Join(state, sharedUsersLock)}.Argv(),
		Socket: sock,
		Stdout: logf,
		Stderr: logf,
		Setsid: true,
		Dir:    "/", // it outlives this run: it must not hold its directory busy
	})
	if err != nil {
		return fmt.Errorf("%w%s", err, logTail(logPath))
	}
	return os.WriteFile(filepath.Join(state, sharedPid), []byte(strconv.Itoa(p.Pid)+"\n"), 0o600)
}

// answers reports whether a worker completes a handshake on sock.
func answers(ctx context.Context, sock string) bool {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	return machine.Handshake(ctx, sock) == nil
}

// lockFile opens (creating) path and takes a flock of kind how on it,
// waiting until it is granted or ctx ends. The lock is held until the file
// is closed.
func lockFile(ctx context.Context, path string, how int) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return nil, err
	}
	for {
		err := unix.Flock(int(f.Fd()), how|unix.LOCK_NB)
		switch {
		case err == nil:
			return f, nil
		case err != unix.EWOULDBLOCK && err != unix.EINTR:
			f.Close()
			return nil, fmt.Errorf("lock %s: %w", path, err)
		}
		select {
		case <-ctx.Done():
			f.Close()
			return nil, fmt.Errorf("waiting for the shared worker: %w", ctx.Err())
		case <-time.After(lockPoll):
		}
	}
}

// logTail is ": " and the last lines of the worker's log, or "".
func logTail(path string) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	const max = 2048
	if fi, err := f.Stat(); err == nil && fi.Size() > max {
		_, _ = f.Seek(-max, io.SeekEnd)
	}
	b, _ := io.ReadAll(f)
	s := strings.TrimSpace(string(b))
	if s == "" {
		return ""
	}
	return ": " + s
}

// exitWhenIdle is the shared worker's side of the users lock: it returns
// once nothing has used the worker for idle (the lock's modification time,
// or a run seen holding it) and no run holds it, with the lock taken
// exclusively, to be held until the process exits; or when ctx ends, with
// nil.
func exitWhenIdle(ctx context.Context, lockPath string, idle time.Duration) *os.File {
	f, err := os.OpenFile(lockPath, os.O_RDWR|os.O_CREATE|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return nil
	}
	poll := min(idle/4, time.Second)
	last := time.Now()
	for {
		select {
		case <-ctx.Done():
			f.Close()
			return nil
		case <-time.After(poll):
		}
		if fi, err := f.Stat(); err == nil && fi.ModTime().After(last) {
			last = fi.ModTime()
		}
		if unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB) != nil {
			last = time.Now() // in use
			continue
		}
		if time.Since(last) >= idle {
			return f
		}
		_ = unix.Flock(int(f.Fd()), unix.LOCK_UN)
	}
}
