package confine

import (
	"errors"
	"os/exec"
	"runtime"

	"golang.org/x/sys/unix"
)

// Start starts cmd like cmd.Start, confined exactly as the helper confines
// a command, but without a helper process: cmd is forked from a dedicated
// OS thread on which the Landlock domain (and no_new_privs) is enforced,
// and that the runtime discards afterwards. The calling process and its
// other threads stay unconfined. It saves the helper's own start (a Go
// runtime, its package initialisation and a second execve: a few
// milliseconds per command).
//
// On error nothing was started: an error matching ErrUnavailable if the
// kernel cannot confine, a ruleset error (a relative or missing root), or
// cmd.Start's error (for instance the program could not be executed). On
// success the caller owns the process as after cmd.Start and must Wait for
// it.
//
// Unlike the helper, Start cannot close descriptors the calling process
// holds without close-on-exec: the command inherits them, as with
// cmd.Start. If cmd.SysProcAttr.Pdeathsig is set, the thread stays parked
// until the process has exited, because the kernel sends the parent-death
// signal when the forking thread ends.
func Start(cmd *exec.Cmd, writable []string) error {
	fd, err := ruleset(writable)
	if err != nil {
		return err
	}
	started := make(chan error, 1)
	go startOnConfinedThread(cmd, fd, started)
	return <-started
}

func startOnConfinedThread(cmd *exec.Cmd, fd int, started chan<- error) {
	// Never unlocked: when this goroutine returns, the runtime ends the
	// thread and its Landlock domain with it. (Threads the runtime needs
	// meanwhile are not cloned from a locked thread but from its template
	// thread, so the domain spreads to nothing but cmd. Should this
	// goroutine run on the main thread, the runtime parks that thread for
	// good instead of ending it: it runs nothing else either.)
	runtime.LockOSThread()
	err := restrictThread(fd)
	unix.Close(fd)
	if err == nil {
		err = cmd.Start()
	}
	if err != nil {
		started <- err
		return
	}
	if cmd.SysProcAttr == nil || cmd.SysProcAttr.Pdeathsig == 0 {
		started <- nil
		return
	}
	pid := cmd.Process.Pid
	// Opened before the caller can Wait: the process cannot have been
	// reaped yet, so the pidfd refers to it even if it already exited.
	pidfd, perr := unix.PidfdOpen(pid, 0)
	started <- nil
	if perr != nil {
		// Without a pidfd, wait for the exit without reaping it (the
		// caller's Wait does that).
		var info unix.Siginfo
		for {
			err := unix.Waitid(unix.P_PID, pid, &info, unix.WEXITED|unix.WNOWAIT, nil)
			if !errors.Is(err, unix.EINTR) {
				return
			}
		}
	}
	defer unix.Close(pidfd)
	fds := []unix.PollFd{{Fd: int32(pidfd), Events: unix.POLLIN}}
	for {
		// A pidfd becomes readable when its process exits.
		if _, err := unix.Poll(fds, -1); !errors.Is(err, unix.EINTR) {
			return
		}
	}
}
