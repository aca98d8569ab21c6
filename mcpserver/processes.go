package mcpserver

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/corral-sandbox/corral/client"
	"github.com/corral-sandbox/corral/internal/utf8tail"
)

// StartArgs are start_process' arguments.
type StartArgs struct {
	CommandArgs
	LifetimeSeconds int64 `json:"lifetime_seconds,omitempty" jsonschema:"how long the process may run before it is killed, in seconds (default: the daemon's, 1 hour)"`
}

// ProcessArgs name a background process.
type ProcessArgs struct {
	ProjectArg
	ProcessID string `json:"process_id" jsonschema:"the process's id (from start_process or list_processes)"`
}

// check returns the project of a call naming a process.
func (p ProcessArgs) check(t *tools) (int64, error) {
	return t.projectAnd(p.ProjectArg, "process_id", p.ProcessID, " (start_process and list_processes give it)")
}

// OutputArgs are read_process_output's arguments.
type OutputArgs struct {
	ProcessArgs
	PageArgs
	WaitSeconds int `json:"wait_seconds,omitempty" jsonschema:"keep reading new output for up to this many seconds, until the process ends or max_bytes were read (default 0: return what there is now)"`
}

// SignalArgs are signal_process' arguments.
type SignalArgs struct {
	ProcessArgs
	Signal string `json:"signal" jsonschema:"the signal's name: TERM, INT, KILL, HUP, QUIT, USR1, USR2, …"`
}

// ProcessList is list_processes' result.
type ProcessList struct {
	Processes []client.Process `json:"processes"`
}

// OutputPage is read_process_output's result.
type OutputPage struct {
	Output string `json:"output" jsonschema:"stdout and stderr, interleaved as the process wrote them"`
	Page
	Dropped int64                `json:"dropped,omitempty" jsonschema:"bytes between the offset asked for and offset that the daemon no longer retains"`
	State   string               `json:"state" jsonschema:"running, exited, killed, timedOut, interrupted or failed"`
	Exit    *client.ProcessExit  `json:"exit,omitempty"`
	Error   *client.ProcessError `json:"error,omitempty"`
}

func (t *tools) addProcessTools(s *mcp.Server) {
	add(s, t, "start_process", `Start a background process in the project's machine (a server, a watcher, a long build) and return its id at once. Give command (a shell command line) or argv. It runs until it exits, its lifetime ends (lifetime_seconds, default 1 hour) or it is killed; the daemon retains its newest output (1 MiB by default) for read_process_output, and its outcome for a while after it ends. The daemon bounds how many processes a project and an account may run at once.`,
		func(ctx context.Context, api API, in StartArgs) (*client.Process, error) {
			id, err := t.project(in.ProjectArg)
			if err != nil {
				return nil, err
			}
			argv, err := in.argv()
			if err != nil {
				return nil, err
			}
			if in.LifetimeSeconds < 0 {
				return nil, fmt.Errorf("lifetime_seconds %d is negative", in.LifetimeSeconds)
			}
			return api.StartProcess(ctx, id, client.ProcessRequest{Argv: argv, Env: in.Env, Cwd: in.Cwd, User: in.User, Lifetime: in.LifetimeSeconds})
		})
	add(s, t, "list_processes", "List the project's background processes: running ones, and ended ones the daemon still retains (with their outcome), oldest first.",
		func(ctx context.Context, api API, in ProjectArg) (ProcessList, error) {
			id, err := t.project(in)
			if err != nil {
				return ProcessList{}, err
			}
			ps, err := api.Processes(ctx, id)
			if ps == nil {
				ps = []client.Process{}
			}
			return ProcessList{Processes: ps}, err
		})
	add(s, t, "read_process_output", fmt.Sprintf(`Read a background process's output (stdout and stderr interleaved) from offset: at most max_bytes (default %d, at most %d) bytes. Offsets count bytes of the whole output since the process started; output older than what the daemon retains is gone (dropped says how much). Continue with offset=next_offset while more is true. With wait_seconds (at most %d) it also waits for new output until the process ends, max_bytes were read or the time passed: use it to wait for a process to finish. The result has the process's state, and its exit once it ended.`,
		ResultText, MaxResultText, int(MaxWait/time.Second)),
		t.readProcessOutput)
	add(s, t, "signal_process", "Send a signal to a background process's whole process tree. It does not wait for the process to end: read_process_output with wait_seconds does.",
		func(ctx context.Context, api API, in SignalArgs) (*client.Process, error) {
			id, err := in.check(t)
			if err != nil {
				return nil, err
			}
			if in.Signal == "" {
				return nil, errors.New("signal is required (TERM, INT, KILL, …)")
			}
			return api.SignalProcess(ctx, id, in.ProcessID, in.Signal)
		})
	add(s, t, "kill_process", "Kill a background process's whole process tree, wait for it to end, and forget it (its output can no longer be read). Returns its last state.",
		func(ctx context.Context, api API, in ProcessArgs) (*client.Process, error) {
			id, err := in.check(t)
			if err != nil {
				return nil, err
			}
			return api.KillProcess(ctx, id, in.ProcessID)
		})
}

// errPageFull stops reading output once a page is full.
var errPageFull = errors.New("page full")

func (t *tools) readProcessOutput(ctx context.Context, api API, in OutputArgs) (OutputPage, error) {
	id, err := in.check(t)
	if err != nil {
		return OutputPage{}, err
	}
	limit, err := pageSize(in.MaxBytes)
	if err != nil {
		return OutputPage{}, err
	}
	switch {
	case in.Offset < 0:
		return OutputPage{}, fmt.Errorf("offset %d is negative", in.Offset)
	case in.WaitSeconds < 0 || time.Duration(in.WaitSeconds)*time.Second > MaxWait:
		return OutputPage{}, fmt.Errorf("wait_seconds %d is not between 0 and %d", in.WaitSeconds, int(MaxWait/time.Second))
	}
	rctx := ctx
	if in.WaitSeconds > 0 {
		var cancel context.CancelFunc
		rctx, cancel = context.WithTimeout(ctx, time.Duration(in.WaitSeconds)*time.Second)
		defer cancel()
	}
	out := OutputPage{Page: Page{Offset: in.Offset, NextOffset: in.Offset}}
	var buf []byte
	end, err := api.ProcessOutput(rctx, id, in.ProcessID, client.OutputOptions{From: in.Offset, Follow: in.WaitSeconds > 0}, func(c client.OutputChunk) error {
		if len(buf) == 0 && c.Offset > out.Offset {
			out.Offset, out.Dropped = c.Offset, c.Offset-in.Offset
		}
		take := c.Data[:min(len(c.Data), limit-len(buf))]
		buf = append(buf, take...)
		out.NextOffset = c.Offset + int64(len(take))
		if len(buf) >= limit {
			return errPageFull
		}
		return nil
	})
	full := errors.Is(err, errPageFull)
	switch {
	case err == nil:
		out.State, out.Exit, out.Error = end.State, end.Exit, end.Error
		out.More = end.Offset > out.NextOffset
	case full || (rctx.Err() != nil && ctx.Err() == nil):
		// Cut short by the page or the wait: the process's state now.
		p, err := api.Process(ctx, id, in.ProcessID)
		if err != nil {
			return OutputPage{}, err
		}
		out.State, out.Exit, out.Error = p.State, p.Exit, p.Error
		out.More = p.Output.End > out.NextOffset
	default:
		return OutputPage{}, err
	}
	if n := utf8tail.Incomplete(buf); n > 0 && n < len(buf) && (full || out.State == "running") {
		// A character the next page completes.
		buf = buf[:len(buf)-n]
		out.NextOffset -= int64(n)
		out.More = true
	}
	out.Output = strings.ToValidUTF8(string(buf), "\uFFFD")
	switch {
	case out.More:
		out.Note = fmt.Sprintf("[corral: the output continues at offset %d: call read_process_output with offset %d]", out.NextOffset, out.NextOffset)
	case out.State == "running":
		out.Note = fmt.Sprintf("[corral: the process is still running: new output will start at offset %d (read_process_output with offset %d and wait_seconds waits for it)]", out.NextOffset, out.NextOffset)
	}
	return out, nil
}
