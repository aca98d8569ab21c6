package sandbox

import (
	"encoding/json"
	"fmt"
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
