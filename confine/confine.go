// Package confine is corral's Landlock confinement: a helper process, and
// the same restriction applied from a thread of the caller.
//
// A confined host command is started in one of two ways. [Start] forks it
// from an OS thread of the caller on which the restriction is enforced and
// that is discarded afterwards; RunCommand does this, since it costs about
// what a plain start does. Or the caller starts corral's own executable with
// [Arg] as its first argument (see [Command]), and that small helper,
// running in the process that will become the command, restricts itself
// with Landlock and then execve's the command; starters that only take an
// argv (a Launch run by someone other than RunCommand) use this, at the
// price of a Go runtime's start. Either way the restriction is inherited
// across execve and by every descendant, and cannot be lifted.
//
// Under confinement a command may read and execute everything, and may write
// (create, modify, truncate, remove, rename, link, make directories, fifos,
// sockets, device nodes, symlinks) only beneath the writable roots it was
// given. The helper is strict: if the kernel does not offer Landlock ABI
// [MinABI] or newer, or the restriction cannot be applied in full, the
// command is not run.
//
// The helper protocol (runc style):
//
//	core                                   helper (pid P, own process group)
//	  pipe(status) ─ write end as fd 3 ──►  fcntl(3, FD_CLOEXEC)
//	  close(write end)                      landlock_restrict_self
//	  read(status) ... blocks               lookup argv[0] in $PATH
//	                                        execve(argv) ── success: fd 3 closes
//	  EOF: the command runs as pid P  ◄─────┘
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
	"runtime"
	"strings"

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
// command behaves the same on every kernel corral accepts. Rights that only
// newer ABIs know (ioctl on devices, connecting to Unix sockets, networking,
// IPC scopes) are left alone: they are not writes to the filesystem.
var handled = landlock.V3.HandledAccessFS

// readExec is granted on the whole filesystem.
const readExec = llsys.AccessFSExecute | llsys.AccessFSReadFile | llsys.AccessFSReadDir

// devices may be opened for writing (and truncated) anywhere: writing to
// them stores nothing on disk. /dev/null, /dev/zero and /dev/full discard or
// refuse what is written; /dev/tty is the controlling terminal, if any.
// Shells open them with O_TRUNC for redirections ("2>/dev/null"), which
// needs the truncate right too.
var devices = []string{"/dev/null", "/dev/zero", "/dev/full", "/dev/tty"}

// Command returns how to launch argv confined to writable: path is the
// executable to start (self, corral's own executable, normally
// os.Executable()) and args its full argument vector, args[0] included.
// The launched process must get the write end of a pipe as file descriptor
// 3 (see the package documentation); its environment is the command's, and
// argv[0] is looked up in that environment's PATH when it has no slash.
//
// writable should hold absolute, existing directories; the helper refuses
// to run the command otherwise.
func Command(self string, writable []string, argv []string) (path string, args []string) {
	args = make([]string, 0, 3+2*len(writable)+len(argv))
	args = append(args, self, Arg)
	for _, w := range writable {
		args = append(args, "-w", w)
	}
	args = append(args, "--")
	args = append(args, argv...)
	return self, args
}

// MaybeRun runs the helper if this process was launched as one
// (os.Args[1] == Arg), and otherwise returns at once. As the helper it never
// returns: it execve's the command, or reports why it could not on fd 3 and
// exits with [ExitFailure].
//
// Call it first thing in main, and in TestMain of any package whose tests
// use the test binary as the helper.
func MaybeRun() {
	if len(os.Args) < 2 || os.Args[1] != Arg {
		return
	}
	// The restriction and the execve must happen on one thread: Landlock
	// domains are per thread. Never unlocked.
	runtime.LockOSThread()
	status := statusWriter()
	err := run(os.Args[2:])
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

// run parses the helper's arguments, confines the process and execs the
// command. It returns only on failure.
func run(args []string) error {
	var writable []string
	for len(args) > 0 && args[0] != "--" {
		if args[0] != "-w" || len(args) < 2 {
			return fmt.Errorf("confine: bad helper arguments at %q", args[0])
		}
		writable = append(writable, args[1])
		args = args[2:]
	}
	if len(args) < 2 {
		return errors.New("confine: bad helper arguments: no command")
	}
	argv := args[1:]
	fd, err := ruleset(writable)
	if err != nil {
		return err
	}
	// Only this (locked) thread is restricted, and it is the one that
	// execve's; the helper's other threads end with the execve.
	err = restrictThread(fd)
	unix.Close(fd)
	if err != nil {
		return err
	}
	path, err := exec.LookPath(argv[0])
	if err != nil {
		return fmt.Errorf("confine: exec %s: %w", argv[0], unwrapExecError(err))
	}
	// The command gets fds 0-2 and nothing else: neither the status pipe
	// nor whatever descriptors corral itself inherited without
	// close-on-exec (from a service manager, a shell).
	if err := unix.CloseRange(statusFD, ^uint(0), unix.CLOSE_RANGE_CLOEXEC); err != nil {
		return fmt.Errorf("confine: close_range: %w", err)
	}
	err = unix.Exec(path, argv, os.Environ())
	return fmt.Errorf("confine: exec %s: %w", argv[0], err)
}

// unwrapExecError drops exec.Error's own "exec: %q:" prefix.
func unwrapExecError(err error) error {
	var ee *exec.Error
	if errors.As(err, &ee) {
		return ee.Err
	}
	return err
}

// ruleset builds the Landlock ruleset: read and execute everywhere, write
// beneath writable and to the harmless devices. Strict: a kernel below
// MinABI, a relative or missing root, any rule the kernel refuses is an
// error. The returned descriptor is close-on-exec; the caller closes it.
func ruleset(writable []string) (int, error) {
	if _, err := Available(); err != nil {
		return -1, fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	for _, w := range writable {
		if !strings.HasPrefix(w, "/") {
			return -1, fmt.Errorf("confine: writable root %q is not absolute", w)
		}
	}
	cfg := landlock.Config{HandledAccessFS: handled}
	fd, _, err := cfg.NewRulesetFD(
		landlock.PathAccess(readExec, "/"),
		landlock.PathAccess(handled, writable...),
		landlock.PathAccess(handled&accessFile, devices...).IgnoreIfMissing(),
	)
	if err != nil {
		return -1, fmt.Errorf("confine: landlock: %w", err)
	}
	if fd < 0 {
		// Only best-effort configurations may enforce nothing.
		return -1, errors.New("confine: landlock: no ruleset to enforce")
	}
	return fd, nil
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
