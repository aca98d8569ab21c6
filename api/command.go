package api

import (
	"encoding/json"
	"fmt"
)

// LeaseKind says what a lease covers. Only the kinds declared here are
// accepted; any other is refused before a provider is contacted.
type LeaseKind string

// The lease kinds corral knows.
const (
	LeaseEditor   LeaseKind = "editor"
	LeaseFiles    LeaseKind = "files"
	LeaseTerminal LeaseKind = "terminal"
	LeaseGitHub   LeaseKind = "github"
	LeaseLSP      LeaseKind = "lsp"
	LeaseRunner   LeaseKind = "runner"
	// LeaseProcess covers a background process the daemon holds (POST
	// /v1/projects/{id}/processes) for as long as it runs.
	LeaseProcess LeaseKind = "process"
)

// Valid reports whether k is one of the declared lease kinds.
func (k LeaseKind) Valid() bool {
	switch k {
	case LeaseEditor, LeaseFiles, LeaseTerminal, LeaseGitHub, LeaseLSP, LeaseRunner, LeaseProcess:
		return true
	}
	return false
}

// CommandTypeArgv is the only command type: an executable and its arguments,
// never interpreted by a shell.
const CommandTypeArgv = "argv"

// Command is what to run. Type must be [CommandTypeArgv]. File is the program
// (looked up in the sandbox's PATH when it contains no slash); Args are its
// arguments, not including the program name.
type Command struct {
	Type string   `json:"type"`
	File string   `json:"file"`
	Args []string `json:"args"`
}

// Argv returns File followed by Args.
func (c Command) Argv() []string {
	return append([]string{c.File}, c.Args...)
}

// TTYSize is a terminal's size in character cells.
type TTYSize struct {
	Rows uint16 `json:"rows"`
	Cols uint16 `json:"cols"`
}

// DefaultStreamLimit bounds each of stdout and stderr when an OutputLimit
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
// (the default, see the sandbox's RunOptions.RawOutput) replaces each
// invalid byte with U+FFFD, three bytes, so a result or partial output of
// binary data may be up to three times its limit (and a host path the
// provider's Sanitize shows by a longer display path may grow it too).
// With RawOutput the returned bytes are exactly those counted, apart from
// Sanitize.
type OutputLimit struct {
	Stdout   int64 `json:"stdout,omitempty"`
	Stderr   int64 `json:"stderr,omitempty"`
	Combined int64 `json:"combined,omitempty"`
}

// Validate refuses negative limits and a combined limit with a
// per-stream one.
func (l OutputLimit) Validate() error {
	if l.Stdout < 0 || l.Stderr < 0 || l.Combined < 0 {
		return fmt.Errorf("output limits must not be negative")
	}
	if l.Combined > 0 && (l.Stdout > 0 || l.Stderr > 0) {
		return fmt.Errorf("a combined output limit excludes per-stream limits")
	}
	return nil
}

// WithDefaults returns l with [DefaultStreamLimit] for each zero
// per-stream limit (l itself when it has a combined limit).
func (l OutputLimit) WithDefaults() OutputLimit {
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

// CommandResult is a command that ran to completion: it exited with a code
// or was ended by a signal it was not sent by corral. Exactly one of Code and
// Signal is set. A nonzero Code is a result, not an error.
//
// Its JSON form is {"stdout":S,"stderr":S,"code":N|null,"signal":S|null},
// with "oomKilled":true added when OOMKilled is set (OutputErr is not part
// of it: a decoded result's OutputErr is nil).
type CommandResult struct {
	Stdout string
	Stderr string
	Code   *int
	Signal string
	// OutputErr is nil when Stdout and Stderr are complete: every process
	// holding them had closed them when the sandbox's RunCommand stopped
	// reading. It is the sandbox's ErrWaitDelay when the main process
	// ended but something it left behind (a descendant RunCommand could
	// not kill: one that left a direct host command's process group) still
	// held them open after its drain timeout: the output was cut there,
	// and whatever that process wrote later is missing. As with os/exec's
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

// Valid reports whether exactly one of e's Code and Signal is set.
func (e Exit) Valid() bool { return (e.Code == nil) != (e.Signal == "") }

// CommandRequest is the body of POST /v1/projects/{id}/commands: one
// bounded command.
//
//   - Command: what to run (type "argv").
//   - Cwd: a host path inside a host project's root, a guest path in a
//     managed project; empty means the project's root.
//   - User: who the command runs as in a managed project's machine (a
//     user name or uid, optionally ":group"); empty means the machine's
//     default user; refused for host projects.
//   - LeaseKind: empty means LeaseTerminal.
//   - TimeoutMs: zero means 10 s; at most the daemon's maximum.
//   - OutputLimit: see OutputLimit for its zero value; at most the
//     daemon's maximum.
//   - Env: merged over the sandbox's defaults (see the sandbox's
//     ExecInput.Env).
//   - Stdin: the command's standard input, base64 (standard alphabet,
//     padded) on the wire: encoding/json's form of a []byte; empty means
//     an empty input. Decoded, it may hold at most
//     the daemon's limit (16 MiB by default; 413 KindRequestTooLarge
//     beyond).
//   - Encoding: "" (the default) answers stdout and stderr as UTF-8 text
//     (invalid bytes become U+FFFD); EncodingBase64 answers them as the
//     base64 of the bytes the command wrote, in the result, in the error
//     body's partial output and in streamed chunks.
type CommandRequest struct {
	Command     Command           `json:"command"`
	Cwd         string            `json:"cwd,omitempty"`
	User        string            `json:"user,omitempty"`
	LeaseKind   LeaseKind         `json:"leaseKind,omitempty"`
	TimeoutMs   int64             `json:"timeoutMs,omitempty"`
	OutputLimit OutputLimit       `json:"outputLimit"`
	Env         map[string]string `json:"env,omitempty"`
	Stdin       []byte            `json:"stdin,omitempty"`
	Encoding    string            `json:"encoding,omitempty"`
}

// EncodingBase64 is CommandRequest.Encoding for binary-safe output.
const EncodingBase64 = "base64"

// MediaNDJSON is the media type of a streamed command answer (asked for
// with Accept): OutputChunk lines, then exactly one CommandResult or
// ErrorBody line.
const MediaNDJSON = "application/x-ndjson"

// OutputChunk is a line of a streamed command answer before the last: a
// chunk of one stream as it arrived (base64 with EncodingBase64). Exactly
// one of Stdout and Stderr is present.
type OutputChunk struct {
	Stdout *string `json:"stdout,omitempty"`
	Stderr *string `json:"stderr,omitempty"`
}
