// Package confine is corral's confinement of host commands: a helper
// process, and the same restriction applied from a thread of the caller.
//
// A confined host command is started in one of two ways. [Start] forks it
// from an OS thread of the caller on which the restriction is enforced and
// that is discarded afterwards; RunCommand does this, since it costs about
// what a plain start does. Or the caller starts corral's own executable with
// [Arg] as its first argument (see [Command]), and that small helper,
// running in the process that will become the command, restricts itself
// and then execve's the command (or, as root, supervises it); starters
// that only take an argv (a Launch run by someone other than RunCommand)
// use this, at the price of a Go runtime's start. Either way the
// restriction is inherited across execve and by every descendant, and
// cannot be lifted.
//
// What a confined command may do is its [Policy]:
//
//   - Landlock (strict: the kernel must offer ABI [MinABI] or newer, or
//     the command is not run). It may read and execute only beneath the
//     [SystemDirs], the policy's readable roots and its writable roots, and
//     write (create, modify, truncate, remove, rename, link, make
//     directories, fifos, sockets, device nodes, symlinks) only beneath
//     the writable roots and to the harmless devices. From ABI 4 it may
//     neither bind nor connect TCP sockets unless the policy allows the
//     network; from ABI 6 it may neither signal a process outside its
//     Landlock domain nor connect to an abstract Unix socket created
//     outside it. Rights a kernel's ABI lacks are not enforced (best
//     effort beyond MinABI), and file system rights are those of ABI 3 on
//     every kernel, so that a command behaves the same everywhere.
//   - no_new_privs: setuid and file-capability programs gain nothing.
//   - As root, with a [User]: the command runs as that unprivileged user
//     and group with no supplementary groups and no capability in any set
//     (the bounding set is emptied on the forking thread, which Go's own
//     fork path cannot do), in a new pid namespace whose init is corral's
//     own (see [InitArg]) or a minimal one ([Policy.Init]), uid 0 without
//     any capability (the command itself is not the init, so signals
//     behave as usual). Files the user cannot open by their permissions
//     (/etc/shadow, the daemon's state, other users' /proc entries) stay
//     closed, it cannot signal or trace processes it does not own, and
//     killing the namespace's init ([Tree.Kill]) kills everything the
//     command started, whatever session or process group it moved to.
//
// Without a User (corral is not root) the command keeps the caller's user:
// Landlock and no_new_privs are all there is, and what the caller's user
// can read beneath the system directories the command can read too. There
// is then no pid namespace (creating one needs a privilege an ordinary
// user does not have): killing the command's process group is the only
// tree kill, and a descendant that calls setsid escapes it.
//
// The helper protocol (runc style):
//
//	core                                   helper (pid P, own process group)
//	  pipe(status) ─ write end as fd 3 ──►  fcntl(3, FD_CLOEXEC)
//	  close(write end)                      landlock_restrict_self
//	  read(status) ... blocks               lookup argv[0] in $PATH
//	                                        execve(argv) ── success: fd 3 closes
//	  EOF: the command runs as pid P  ◄─────┘   (as root: start it, close fd 3)
//	  "message\n": nothing ran      ◄────── failure: write message to fd 3, exit 127
//
// Core reports a message on fd 3 as a start failure, never as exit code 127.
// The command inherits file descriptors 0-2 only.
package confine

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"runtime"
	"strings"
	"syscall"

	"github.com/landlock-lsm/go-landlock/landlock"
	llsys "github.com/landlock-lsm/go-landlock/landlock/syscall"
	"golang.org/x/sys/unix"
)

// Arg is the first argument that turns corral (or a test binary whose
// TestMain calls [MaybeRun]) into the confinement helper.
const Arg = "__corral-confine"

// MinABI is the oldest Landlock ABI the helper accepts. ABI 3 (Linux 6.2) is
// the first that controls truncation; below it, truncate(2) would write
// outside the roots unchecked.
const MinABI = 3

// ExitFailure is the helper's exit status when it could not execute the
// command. It is only ever seen together with a message on the status
// descriptor; core never reports it as the command's exit code.
const ExitFailure = 127

// statusFD is the descriptor on which the helper reports why it could not
// execute the command (sandbox.Launch.ExecStatus).
const statusFD = 3

// handled is the set of filesystem rights the helper restricts: exactly
// those of ABI 3, whatever newer ABI the kernel offers, so that a confined
// command behaves the same on every kernel corral accepts. (Networking and
// IPC scopes, which newer ABIs add, are restricted separately: see
// ruleset.)
var handled = landlock.V3.HandledAccessFS

// readExec is granted beneath the system directories and the roots.
const readExec = llsys.AccessFSExecute | llsys.AccessFSReadFile | llsys.AccessFSReadDir

// devices may be opened for writing (and truncated) anywhere: writing to
// them stores nothing on disk. /dev/null, /dev/zero and /dev/full discard or
// refuse what is written; /dev/tty is the controlling terminal, if any.
// Shells open them with O_TRUNC for redirections ("2>/dev/null"), which
// needs the truncate right too.
var devices = []string{"/dev/null", "/dev/zero", "/dev/full", "/dev/tty"}

// Command returns how to launch argv confined by p: path is the executable
// to start (self, corral's own executable, normally os.Executable()) and
// args its full argument vector, args[0] included. The launched process
// must get the write end of a pipe as file descriptor 3 (see the package
// documentation); its environment is the command's, and argv[0] is looked
// up in that environment's PATH when it has no slash.
//
// The roots in p should be absolute, existing directories; the helper
// refuses to run the command otherwise. With p.User (the launching process
// must be root) the helper does not execve the command but supervises it:
// it starts it as [Start] does, in a new pid namespace as p.User, forwards
// the usual termination and job-control signals to it, exits as it exited
// (its code, or by the same signal), and kills the namespace, so that
// nothing the command left behind survives it. Killing the helper's
// process group with SIGKILL kills the namespace too (its init stays in
// that group).
func Command(self string, p Policy, argv []string) (path string, args []string) {
	args = make([]string, 0, 6+2*len(p.Writable)+2*len(p.Readable)+len(argv))
	args = append(args, self, Arg)
	for _, w := range p.Writable {
		args = append(args, "-w", w)
	}
	for _, r := range p.Readable {
		args = append(args, "-r", r)
	}
	if p.Network {
		args = append(args, "-n")
	}
	if p.User != nil {
		args = append(args, "-u", fmt.Sprintf("%d:%d", p.User.UID, p.User.GID))
		if p.Init != "" {
			args = append(args, "-i", p.Init)
		}
	}
	args = append(args, "--")
	args = append(args, argv...)
	return self, args
}

// MaybeRun runs the helper if this process was launched as one
// (os.Args[1] == Arg), or the init of a confined command's pid namespace
// (os.Args[1] == InitArg), and otherwise returns at once. As either it
// never returns: the helper execve's the command (or supervises it, see
// [Command]), or reports why it could not on fd 3 and exits with
// [ExitFailure]; the init runs until it is killed.
//
// Call it first thing in main, and in TestMain of any package whose tests
// use the test binary as the helper or start confined commands as a
// [User].
func MaybeRun() {
	if len(os.Args) < 2 {
		return
	}
	switch os.Args[1] {
	case InitArg:
		runInit()
	case Arg:
	default:
		return
	}
	// The restriction and the execve must happen on one thread: Landlock
	// domains are per thread. Never unlocked.
	runtime.LockOSThread()
	status := statusWriter()
	err := run(os.Args[2:], status)
	// run returns only on failure.
	msg := strings.ReplaceAll(err.Error(), "\n", " ")
	fmt.Fprintf(status, "%s\n", msg)
	os.Exit(ExitFailure)
}

// statusWriter marks fd 3 close-on-exec, so that a successful execve closes
// it, and returns it; if fd 3 is not a pipe (the helper was started by hand),
// messages go to stderr instead.
func statusWriter() *os.File {
	var st unix.Stat_t
	if err := unix.Fstat(statusFD, &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFIFO {
		return os.Stderr
	}
	if _, err := unix.FcntlInt(statusFD, unix.F_SETFD, unix.FD_CLOEXEC); err != nil {
		return os.Stderr
	}
	return os.NewFile(statusFD, "exec-status")
}

// parseArgs parses the helper's arguments (see Command).
func parseArgs(args []string) (Policy, []string, error) {
	var p Policy
	for len(args) > 0 && args[0] != "--" {
		flag := args[0]
		if flag == "-n" {
			p.Network = true
			args = args[1:]
			continue
		}
		if len(args) < 2 {
			return p, nil, fmt.Errorf("confine: bad helper arguments at %q", flag)
		}
		v := args[1]
		switch flag {
		case "-w":
			p.Writable = append(p.Writable, v)
		case "-r":
			p.Readable = append(p.Readable, v)
		case "-i":
			p.Init = v
		case "-u":
			var u User
			if _, err := fmt.Sscanf(v, "%d:%d", &u.UID, &u.GID); err != nil {
				return p, nil, fmt.Errorf("confine: bad helper user %q", v)
			}
			p.User = &u
		default:
			return p, nil, fmt.Errorf("confine: bad helper arguments at %q", flag)
		}
		args = args[2:]
	}
	if len(args) < 2 {
		return p, nil, errors.New("confine: bad helper arguments: no command")
	}
	return p, args[1:], nil
}

// run parses the helper's arguments, confines the process and execs (or
// supervises) the command. It returns only on failure.
func run(args []string, status *os.File) error {
	p, argv, err := parseArgs(args)
	if err != nil {
		return err
	}
	fd, err := ruleset(p)
	if err != nil {
		return err
	}
	path, err := exec.LookPath(argv[0])
	if err != nil {
		unix.Close(fd)
		return fmt.Errorf("confine: exec %s: %w", argv[0], unwrapExecError(err))
	}
	// The command gets fds 0-2 and nothing else: neither the status pipe
	// nor whatever descriptors corral itself inherited without
	// close-on-exec (from a service manager, a shell).
	if err := unix.CloseRange(statusFD, ^uint(0), unix.CLOSE_RANGE_CLOEXEC); err != nil {
		unix.Close(fd)
		return fmt.Errorf("confine: close_range: %w", err)
	}
	if p.User != nil {
		return supervise(p, fd, path, argv, status)
	}
	// Only this (locked) thread is restricted, and it is the one that
	// execve's; the helper's other threads end with the execve.
	err = restrictThread(fd)
	unix.Close(fd)
	if err != nil {
		return err
	}
	err = unix.Exec(path, argv, os.Environ())
	return fmt.Errorf("confine: exec %s: %w", argv[0], err)
}

// forwarded are the signals the supervising helper passes on to its
// command.
var forwarded = []os.Signal{unix.SIGHUP, unix.SIGINT, unix.SIGQUIT, unix.SIGTERM, unix.SIGUSR1, unix.SIGUSR2,
	unix.SIGWINCH, unix.SIGCONT, unix.SIGTSTP, unix.SIGTTIN, unix.SIGTTOU}

// supervise starts the command as Start does and exits as it exited. It
// returns only if the command could not be started.
func supervise(p Policy, fdRuleset int, path string, argv []string, status *os.File) error {
	// The command reopens its streams by name (/dev/stdout is
	// /proc/self/fd/1): a pipe's inode must be its own for that, not the
	// starter's (mode 0600).
	for fd := 0; fd <= 2; fd++ {
		var st unix.Stat_t
		if unix.Fstat(fd, &st) == nil && st.Mode&unix.S_IFMT == unix.S_IFIFO {
			if err := unix.Fchown(fd, int(p.User.UID), int(p.User.GID)); err != nil {
				unix.Close(fdRuleset)
				return fmt.Errorf("confine: chown standard stream %d: %w", fd, err)
			}
		}
	}
	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, forwarded...)
	cmd := &exec.Cmd{
		Path: path, Args: argv, Env: os.Environ(),
		Stdin: os.Stdin, Stdout: os.Stdout, Stderr: os.Stderr,
		SysProcAttr: &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL},
	}
	tree, err := startWith(cmd, p, fdRuleset)
	if err != nil {
		return fmt.Errorf("confine: exec %s: %w", argv[0], unwrapExecError(err))
	}
	// Started: the starter reads EOF.
	if status != os.Stderr {
		status.Close()
	}
	go func() {
		for s := range sigs {
			_ = cmd.Process.Signal(s)
		}
	}()
	werr := cmd.Wait()
	_ = tree.Kill()
	<-tree.Done()
	ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus)
	if werr != nil && !ok {
		os.Exit(ExitFailure)
	}
	if ws.Signaled() {
		sig := ws.Signal()
		signal.Reset(sig)
		_ = unix.Kill(os.Getpid(), sig)
		os.Exit(128 + int(sig))
	}
	os.Exit(ws.ExitStatus())
	return nil
}

// unwrapExecError drops exec.Error's own "exec: %q:" prefix.
func unwrapExecError(err error) error {
	var ee *exec.Error
	if errors.As(err, &ee) {
		return ee.Err
	}
	return err
}

// restrictThread enforces ruleset fd on the calling OS thread, which must be
// locked (runtime.LockOSThread) and never unlocked afterwards: the runtime
// then ends the thread, with its domain, when its goroutine returns.
// no_new_privs is set on the thread first: Landlock requires it of a thread
// without CAP_SYS_ADMIN, and it keeps setuid and file-capability programs
// the command runs from gaining privileges.
func restrictThread(fd int) error {
	if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
		return fmt.Errorf("confine: prctl(PR_SET_NO_NEW_PRIVS): %w", err)
	}
	if err := llsys.LandlockRestrictSelf(fd, 0); err != nil {
		return fmt.Errorf("confine: landlock_restrict_self: %w", err)
	}
	return nil
}

// accessFile is the subset of rights that apply to files (not directories).
const accessFile = llsys.AccessFSExecute | llsys.AccessFSWriteFile | llsys.AccessFSReadFile | llsys.AccessFSTruncate

// ErrUnavailable is wrapped by Available's errors (and the helper's) when
// the kernel cannot confine: Landlock is absent, disabled, or older than
// MinABI.
var ErrUnavailable = errors.New("landlock unavailable")

// unavailable is an error that matches ErrUnavailable without repeating its
// text, so callers can phrase their own refusal around it.
type unavailable struct{ reason string }

func (e *unavailable) Error() string        { return "confine: " + e.reason }
func (e *unavailable) Is(target error) bool { return target == ErrUnavailable }

// Available reports the Landlock ABI version of the running kernel. It
// returns an error matching ErrUnavailable if Landlock is absent or disabled,
// or older than MinABI: then the helper cannot confine anything and callers
// must not run commands that need confinement.
func Available() (abi int, err error) {
	r, _, errno := unix.Syscall(unix.SYS_LANDLOCK_CREATE_RULESET, 0, 0, unix.LANDLOCK_CREATE_RULESET_VERSION)
	switch errno {
	case 0:
	case unix.ENOSYS:
		return 0, &unavailable{"the kernel has no Landlock support (ENOSYS)"}
	case unix.EOPNOTSUPP:
		return 0, &unavailable{"Landlock is disabled at boot (EOPNOTSUPP)"}
	default:
		return 0, &unavailable{fmt.Sprintf("landlock_create_ruleset: %v", errno)}
	}
	abi = int(r)
	if abi < MinABI {
		return abi, &unavailable{fmt.Sprintf("kernel Landlock ABI %d is older than the required ABI %d", abi, MinABI)}
	}
	return abi, nil
}
