package sandbox

import (
	"fmt"
	"io"
	"time"

	"github.com/corral-sandbox/corral/api"
)

// DefaultTimeout bounds a command whose RunOptions.Timeout is zero.
const DefaultTimeout = 10 * time.Second

// DefaultStreamLimit bounds each of stdout and stderr when RunOptions.OutputLimit
// is the zero value.
const DefaultStreamLimit = api.DefaultStreamLimit

// OutputLimit bounds captured output, in bytes; see [api.OutputLimit] for
// its zero value and its rules.
type OutputLimit = api.OutputLimit

// StartInfo is what OnStart learns about a command about to start. It holds
// no credential and no process handle.
type StartInfo struct {
	LeaseID    string
	Project    ProjectRef
	DisplayCwd string
}

// RunOptions tunes one RunCommand call. A nil *RunOptions and the zero
// RunOptions both mean the documented defaults.
type RunOptions struct {
	// Timeout bounds the command from its start to its exit. If Timeout is
	// zero, DefaultTimeout (10 s) applies. A negative Timeout is refused.
	// When it expires the command's whole process tree is cancelled and
	// RunCommand rejects with KindTimeout.
	Timeout time.Duration

	// OutputLimit bounds captured output; see OutputLimit for its zero value.
	OutputLimit OutputLimit

	// OnStart, if non-nil, is called synchronously after preparation,
	// returned-target validation and the initial abort check, immediately
	// before the command starts. If it returns an error the command is not
	// started: RunCommand cancels the preparation, releases the lease and
	// rejects with KindStart wrapping that error. A panic in OnStart is
	// recovered and handled the same way, the error being an
	// *OnStartPanic holding the panic value. If OnStart is nil, execution
	// is unchanged.
	OnStart func(StartInfo) error

	// Stdin, if non-nil, is the command's standard input. If Stdin is nil,
	// the command reads an empty input (EOF at once), after the prepared
	// input of a provider that gave one (LocalPrepared.Stdin,
	// ManagedPrepared.Stdin), which always comes first.
	//
	// Like exec.Cmd.Stdin when it is not an *os.File, the reader is copied
	// on a goroutine of its own, in pieces of at most 32 KiB, as the
	// command consumes it: it is streamed, never buffered whole. The
	// command's input is closed (it reads EOF) when Stdin reaches io.EOF.
	// The copy ends at EOF, when the command closes its input or ends
	// (what it did not read is dropped, as in a shell pipeline), or when
	// the command is cancelled. RunCommand does not wait for a Read that
	// is still blocked when the command has ended: that Read's data is
	// dropped, and the goroutine returns as soon as Read does. A Read
	// error other than io.EOF ends the command: it is cancelled and
	// RunCommand rejects with KindTransport (its input was lost) wrapping
	// that error.
	Stdin io.Reader

	// OnOutput, if non-nil, receives the command's output as it arrives,
	// in addition to (never instead of) the captured result. It is called
	// from the goroutine that reads stream s, once per chunk read, so
	// calls for one stream are in order and never concurrent, while calls
	// for stdout and stderr may run concurrently. p is valid only during
	// the call. OnOutput is never called after RunCommand returned.
	//
	// The bytes are raw (not decoded as UTF-8: a chunk may end inside a
	// multi-byte sequence) but sanitized like the result: chunks pass
	// through the provider's Sanitize, and bytes at a chunk's end that may
	// begin text Sanitize would rewrite once more output follows (a prefix
	// of a host path, see PreparedCommon.SanitizeHold) are held back and
	// delivered with the next chunk, or when the stream ends. Live chunks
	// therefore never show what the result hides; they may differ from
	// the result where a replacement depends on bytes that had not yet
	// arrived. A provider with a Sanitize but no SanitizeHold gets its
	// output delivered once, when the stream ends.
	//
	// Limits apply: bytes beyond OutputLimit are never delivered (the
	// command fails with KindOverflow as usual). OnOutput should return
	// promptly: while it runs, its stream is not read, and a command that
	// fills the stream's buffer waits (its timeout still runs).
	OnOutput func(s Stream, p []byte)

	// RawOutput, if true, makes the result's and a CommandError's Stdout
	// and Stderr the bytes the command wrote (sanitized, but not decoded:
	// they need not be valid UTF-8). If false, output is decoded as UTF-8
	// (each invalid byte becomes U+FFFD).
	RawOutput bool
}

// Stream names one of a command's output streams.
type Stream int

// The output streams.
const (
	Stdout Stream = 1
	Stderr Stream = 2
)

func (s Stream) String() string {
	switch s {
	case Stdout:
		return "stdout"
	case Stderr:
		return "stderr"
	}
	return fmt.Sprintf("Stream(%d)", int(s))
}

// CommandResult is a command that ran to completion; see
// [api.CommandResult] for its fields and its JSON form.
type CommandResult = api.CommandResult

// Exit is how a session's main process ended; see [api.Exit].
type Exit = api.Exit

// ExitCode returns an Exit with code c.
func ExitCode(c int) Exit { return api.ExitCode(c) }

// ExitSignal returns an Exit ended by the named signal.
func ExitSignal(name string) Exit { return api.ExitSignal(name) }
