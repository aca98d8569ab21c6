package sandbox

import (
	"encoding/json"
	"fmt"
	"io"
	"time"
)

// DefaultTimeout bounds a command whose RunOptions.Timeout is zero.
const DefaultTimeout = 10 * time.Second

// DefaultStreamLimit bounds each of stdout and stderr when RunOptions.OutputLimit
// is the zero value.
const DefaultStreamLimit = 1 << 20

// OutputLimit bounds captured output, in bytes.
//
// Either set Combined, which bounds stdout and stderr together, or set
// Stdout and Stderr, which bound each stream alone; setting Combined with
// either of the others is refused. A zero per-stream limit means
// [DefaultStreamLimit] for that stream. The zero OutputLimit therefore means
// 1 MiB per stream. A command that writes more than its limit is cancelled
// and rejected with [KindOverflow]; the output up to the limit is kept as
// partial output.
//
// Limits count the bytes the command wrote, before decoding: decoded text
// (the default, see RunOptions.RawOutput) replaces each invalid byte with
// U+FFFD, three bytes, so a result or partial output of binary data may be
// up to three times its limit (and a host path the provider's Sanitize
// shows by a longer display path may grow it too). With RawOutput the
// returned bytes are exactly those counted, apart from Sanitize.
type OutputLimit struct {
	Stdout   int64 `json:"stdout,omitempty"`
	Stderr   int64 `json:"stderr,omitempty"`
	Combined int64 `json:"combined,omitempty"`
}

func (l OutputLimit) validate() error {
	if l.Stdout < 0 || l.Stderr < 0 || l.Combined < 0 {
		return fmt.Errorf("output limits must not be negative")
	}
	if l.Combined > 0 && (l.Stdout > 0 || l.Stderr > 0) {
		return fmt.Errorf("a combined output limit excludes per-stream limits")
	}
	return nil
}

func (l OutputLimit) withDefaults() OutputLimit {
	if l.Combined > 0 {
		return l
	}
	if l.Stdout == 0 {
		l.Stdout = DefaultStreamLimit
	}
	if l.Stderr == 0 {
		l.Stderr = DefaultStreamLimit
	}
	return l
}

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

// CommandResult is a command that ran to completion: it exited with a code
// or was ended by a signal it was not sent by corral. Exactly one of Code and
// Signal is set. A nonzero Code is a result, not an error.
//
// Its JSON form is {"stdout":S,"stderr":S,"code":N|null,"signal":S|null},
// with "oomKilled":true added when OOMKilled is set (OutputErr is not part
// of it).
type CommandResult struct {
	Stdout string
	Stderr string
	Code   *int
	Signal string
	// OutputErr is nil when Stdout and Stderr are complete: every process
	// holding them had closed them when RunCommand stopped reading. It is
	// ErrWaitDelay when the main process ended but something it left
	// behind (a descendant RunCommand could not kill: one that left a
	// direct host command's process group) still held them open after
	// ControlOptions.DrainTimeout: the output was cut there, and whatever
	// that process wrote later is missing. As with os/exec's
	// ErrWaitDelay, the exit status is still the command's: the result is
	// returned, not an error.
	OutputErr error
	// OOMKilled accompanies Signal "SIGKILL" when the kernel's OOM killer
	// killed the command (its machine's memory limit was reached); the
	// providers that can tell report it (managed machines).
	OOMKilled bool
}

// MarshalJSON encodes r with null for the absent one of code and signal.
func (r CommandResult) MarshalJSON() ([]byte, error) {
	var sig *string
	if r.Signal != "" {
		sig = &r.Signal
	}
	return json.Marshal(struct {
		Stdout    string  `json:"stdout"`
		Stderr    string  `json:"stderr"`
		Code      *int    `json:"code"`
		Signal    *string `json:"signal"`
		OOMKilled bool    `json:"oomKilled,omitempty"`
	}{r.Stdout, r.Stderr, r.Code, sig, r.OOMKilled && sig != nil})
}

// UnmarshalJSON decodes the form MarshalJSON writes.
func (r *CommandResult) UnmarshalJSON(b []byte) error {
	var v struct {
		Stdout    string  `json:"stdout"`
		Stderr    string  `json:"stderr"`
		Code      *int    `json:"code"`
		Signal    *string `json:"signal"`
		OOMKilled bool    `json:"oomKilled"`
	}
	if err := json.Unmarshal(b, &v); err != nil {
		return err
	}
	*r = CommandResult{Stdout: v.Stdout, Stderr: v.Stderr, Code: v.Code}
	if v.Signal != nil {
		r.Signal, r.OOMKilled = *v.Signal, v.OOMKilled
	}
	return nil
}

// Exit is how a session's main process ended: exactly one of Code and
// Signal (a name such as "SIGKILL") is set. OOMKilled accompanies Signal
// when the kernel's OOM killer killed it.
type Exit struct {
	Code      *int
	Signal    string
	OOMKilled bool
}

// ExitCode returns an Exit with code c.
func ExitCode(c int) Exit { return Exit{Code: &c} }

// ExitSignal returns an Exit ended by the named signal.
func ExitSignal(name string) Exit { return Exit{Signal: name} }

func (e Exit) valid() bool { return (e.Code == nil) != (e.Signal == "") }
