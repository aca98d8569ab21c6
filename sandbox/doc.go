// Package sandbox is the seam between corral's consumers and its sandbox
// providers.
//
// Consumers (the HTTP API, the CLI, editor Git reads, GitHub export, runner
// jobs) run one-shot commands through [Control.RunCommand], the one bounded
// runner, which core owns: it captures output into bounded buffers, enforces
// the timeout and output limits, heartbeats the lease every five seconds,
// cancels the whole process tree on timeout, abort, overflow or transport
// failure, releases the lease, and reports the outcome as a [CommandResult] or
// a typed [*CommandError] carrying sanitized partial output. It never invents
// an exit code. A command may be given environment variables
// (ExecInput.Env, merged over the sandbox's defaults), an input streamed
// from a reader (RunOptions.Stdin), and a callback that sees its output as
// it arrives, sanitized (RunOptions.OnOutput); RunOptions.RawOutput keeps
// output as bytes.
//
// Providers implement [Provider.PrepareExecution] only: they check tenancy and
// confinement, mint a [Lease], and describe what to run as a [Prepared]: a
// [*LocalPrepared] for a host project (direct or confined), or a
// [*ManagedPrepared] for a managed project, whose Start opens a
// [ManagedExecutionSession] inside the project's machine. Providers never run
// commands themselves.
//
// Long-lived sessions — the daemon's WebSocket sessions and terminals,
// language servers, corral exec — use [Control.Open]: the same lifecycle
// (validate, admit, prepare, check the target, heartbeat, start, settle,
// cancel, drain, release), without the capture. It returns a [*Session]
// whose Stdin, Stdout and Stderr belong to the caller, optionally on a
// terminal (SessionOptions.TTY, Session.Resize), with Wait (the same
// CommandError kinds as RunCommand, never an invented exit code) and Close
// (cancel, bounded wait, release; idempotent). RunCommand is Open with a
// bounded capture attached. A host project's session starts exactly as its
// one-shot commands do: there is one host launcher. [Control.PrepareExecution]
// remains for consumers that drive a prepared execution themselves.
//
// A Control with an [Admitter] (such as a [Limiter]: global and per-account
// budgets of captured bytes, commands and sessions) refuses work over budget
// before anything is prepared, with a KindPrepare error wrapping [ErrBusy]:
// RunCommand admits a command, Open and PrepareExecution a session.
//
// [CommandError] and [CommandResult] write their own pinned JSON
// ([ErrorBody], WriteJSON streams it without copying the output).
//
// This package imports no other corral package but the host confinement
// (package confine) and internal/pdeath.
package sandbox
