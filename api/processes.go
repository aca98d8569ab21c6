package api

import "time"

// Process states.
const (
	ProcessRunning     = "running"     // it runs
	ProcessExited      = "exited"      // it ended by itself, or by a signal it was sent (Exit says how)
	ProcessKilled      = "killed"      // DELETE killed it
	ProcessTimedOut    = "timedOut"    // its lifetime ended: it was killed
	ProcessInterrupted = "interrupted" // the daemon stopped, or its lease or machine was lost
	ProcessFailed      = "failed"      // it ended, but how cannot be known (Error says why)
)

// ProcessRequest is the body of POST /v1/projects/{id}/processes: a
// background process the daemon holds.
//
// Argv is the command line (at least the program). Env, Cwd and User mean
// what they mean for a command (CommandRequest). TTY, if set, runs it on a
// terminal of that size (every output is then stdout). Lifetime bounds how
// long it may run, in seconds: zero means the daemon's default (1 h), at
// most its maximum (24 h). OutputBuffer is how many bytes of its newest
// output are retained: zero means the daemon's default (1 MiB), at most
// its maximum (16 MiB).
type ProcessRequest struct {
	Argv         []string          `json:"argv"`
	Env          map[string]string `json:"env,omitempty"`
	Cwd          string            `json:"cwd,omitempty"`
	User         string            `json:"user,omitempty"`
	TTY          *TTYSize          `json:"tty,omitempty"`
	Lifetime     int64             `json:"lifetime,omitempty"`
	OutputBuffer int64             `json:"outputBuffer,omitempty"`
}

// Process is a background process.
type Process struct {
	ID        string `json:"id"`
	ProjectID int64  `json:"projectId"`
	// State is one of the Process* states.
	State   string    `json:"state"`
	Argv    []string  `json:"argv"`
	Cwd     string    `json:"cwd"`
	User    string    `json:"user"`
	TTY     bool      `json:"tty"`
	LeaseID string    `json:"leaseId"`
	Started time.Time `json:"started"`
	// Ended is null while it runs.
	Ended *time.Time `json:"ended"`
	// Deadline is when its lifetime ends.
	Deadline time.Time     `json:"deadline"`
	Output   ProcessOutput `json:"output"`
	// Exit is how its main process ended, once observed (null otherwise):
	// exactly one of code and signal, with oomKilled when the kernel's OOM
	// killer killed it — the shape of a session's exit.
	Exit *ProcessExit `json:"exit"`
	// Error says why it was ended, or why its end is unknown (null for
	// "running" and "exited"): kind "timeout" (timedOut), "abort" (killed,
	// or the daemon stopped), "transport" (lease or machine lost), "start".
	Error *ProcessError `json:"error"`
}

// ProcessOutput describes a process's output: bytes written per stream,
// the offsets of what is retained ([Start, End) of the combined output),
// and the ring's size. Start > 0 means older output fell off (its
// overflow point).
type ProcessOutput struct {
	StdoutBytes int64 `json:"stdoutBytes"`
	StderrBytes int64 `json:"stderrBytes"`
	Start       int64 `json:"start"`
	End         int64 `json:"end"`
	BufferBytes int64 `json:"bufferBytes"`
}

// ProcessExit is an observed end of a main process: exactly one of Code
// and Signal.
type ProcessExit struct {
	Code      *int    `json:"code"`
	Signal    *string `json:"signal"`
	OOMKilled bool    `json:"oomKilled,omitempty"`
}

// ProcessError is why a process was ended or its end is unknown.
type ProcessError struct {
	Kind    string `json:"kind"`
	Message string `json:"message"`
}

// SignalRequest is the body of POST …/processes/{pid}/signal: a signal
// name with or without "SIG" ("TERM", "SIGINT", "KILL", …).
type SignalRequest struct {
	Signal string `json:"signal"`
}

// ProcessOutputChunk is a line of a process's output answer before the
// last: the bytes of Stream ("stdout" or "stderr") from Offset in the
// combined output (base64 with encoding=base64).
type ProcessOutputChunk struct {
	Stream string `json:"stream"`
	Offset int64  `json:"offset"`
	Data   string `json:"data"`
}

// ProcessOutputEnd is the last line of a process's output answer: where a
// reader continues (Offset), and the process's state then (with its
// outcome once ended).
type ProcessOutputEnd struct {
	Offset int64         `json:"offset"`
	State  string        `json:"state"`
	Exit   *ProcessExit  `json:"exit"`
	Error  *ProcessError `json:"error"`
}
