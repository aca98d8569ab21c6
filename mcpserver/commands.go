package mcpserver

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/corral-sandbox/corral/client"
	"github.com/corral-sandbox/corral/sandbox"
)

// CommandArgs say what to run: a shell command line or an argv, in a
// directory, with environment variables, as a user. run_command and
// start_process take them.
type CommandArgs struct {
	ProjectArg
	Command string            `json:"command,omitempty" jsonschema:"a shell command line, run with sh -c (give this or argv)"`
	Argv    []string          `json:"argv,omitempty" jsonschema:"the program and its arguments, run without a shell (give this or command)"`
	Cwd     string            `json:"cwd,omitempty" jsonschema:"the working directory (default: the workspace, /workspace)"`
	Env     map[string]string `json:"env,omitempty" jsonschema:"environment variables to set"`
	User    string            `json:"user,omitempty" jsonschema:"the machine's user to run as, a name or uid (default: the image's user)"`
}

// argv returns the command to run.
func (c CommandArgs) argv() ([]string, error) {
	switch {
	case c.Command != "" && len(c.Argv) > 0:
		return nil, errors.New("give command (a shell command line) or argv (a program and its arguments), not both")
	case c.Command != "":
		return []string{"sh", "-c", c.Command}, nil
	case len(c.Argv) == 0:
		return nil, errors.New("give command (a shell command line) or argv (a program and its arguments)")
	case c.Argv[0] == "":
		return nil, errors.New("argv[0], the program, is empty")
	}
	return c.Argv, nil
}

// RunArgs are run_command's arguments.
type RunArgs struct {
	CommandArgs
	Stdin          string `json:"stdin,omitempty" jsonschema:"text given to the command as its standard input (default: none)"`
	TimeoutSeconds int    `json:"timeout_seconds,omitempty" jsonschema:"how long the command may run before it is killed, in seconds"`
}

// RunResult is run_command's result. Exactly one of Code, Signal and
// Error is set: Error when the command did not complete (it never
// started, timed out, wrote too much, …), with whatever output it wrote.
type RunResult struct {
	Code      *int   `json:"code,omitempty" jsonschema:"the exit code, when the command exited"`
	Signal    string `json:"signal,omitempty" jsonschema:"the signal that ended the command"`
	OOMKilled bool   `json:"oom_killed,omitempty" jsonschema:"the machine's memory limit was reached and the kernel killed the command"`
	Error     string `json:"error,omitempty" jsonschema:"why the command did not complete: kind and message"`
	Stdout    string `json:"stdout"`
	Stderr    string `json:"stderr"`
	Truncated bool   `json:"truncated" jsonschema:"the output shown was cut (a marker in it says where and how to read all of it)"`
}

func (r RunResult) failed() bool { return r.Error != "" }

// readRestOfRun says how to read a command's whole output.
const readRestOfRun = "to read all of it, run the command again with its output redirected to a file and page through the file with read_file and offset, or run it with start_process and page through read_process_output with offset"

func (t *tools) addCommandTools(s *mcp.Server) {
	add(s, t, "run_command", fmt.Sprintf(`Run a command in the project's machine and wait for it to end. Give command (a shell command line) or argv. A nonzero exit is a result (code), not an error. It runs at most timeout_seconds (default %d, at most %d) and may write at most %s to each of stdout and stderr: beyond either it is killed and the result is an error with the output so far. The result shows at most %s of each stream: the start and the end, with a marker where the middle was cut. stdin: at most %s. For servers and other long-running programs use start_process.`,
		int(DefaultRunTimeout/time.Second), int(MaxRunTimeout/time.Second), size(RunOutputLimit), size(ResultText), size(MaxWrite)),
		t.runCommand)
}

func (t *tools) runCommand(ctx context.Context, api API, in RunArgs) (RunResult, error) {
	id, err := t.project(in.ProjectArg)
	if err != nil {
		return RunResult{}, err
	}
	argv, err := in.argv()
	if err != nil {
		return RunResult{}, err
	}
	timeout := DefaultRunTimeout
	switch {
	case in.TimeoutSeconds < 0 || time.Duration(in.TimeoutSeconds)*time.Second > MaxRunTimeout:
		return RunResult{}, fmt.Errorf("timeout_seconds %d is not between 1 and %d", in.TimeoutSeconds, int(MaxRunTimeout/time.Second))
	case in.TimeoutSeconds > 0:
		timeout = time.Duration(in.TimeoutSeconds) * time.Second
	}
	if len(in.Stdin) > MaxWrite {
		return RunResult{}, fmt.Errorf("stdin has %d bytes, more than %d", len(in.Stdin), MaxWrite)
	}
	req := client.CommandRequest{
		Command:     sandbox.Command{Type: sandbox.CommandTypeArgv, File: argv[0], Args: argv[1:]},
		Cwd:         in.Cwd,
		User:        in.User,
		Env:         in.Env,
		TimeoutMs:   timeout.Milliseconds(),
		OutputLimit: sandbox.OutputLimit{Stdout: RunOutputLimit, Stderr: RunOutputLimit},
	}
	if in.Stdin != "" {
		req.Stdin = []byte(in.Stdin)
	}
	res, err := api.RunCommand(ctx, id, req)
	var out RunResult
	var ae *client.Error
	switch {
	case err == nil:
		out = RunResult{Code: res.Code, Signal: res.Signal, OOMKilled: res.OOMKilled, Stdout: res.Stdout, Stderr: res.Stderr}
	case errors.As(err, &ae) && isCommandKind(ae.Kind):
		// The command did not complete: its partial output is worth
		// showing.
		out = RunResult{Error: ae.Kind + ": " + ae.Message, Stdout: ae.Stdout, Stderr: ae.Stderr}
	default:
		return RunResult{}, err
	}
	var cut1, cut2 bool
	out.Stdout, cut1 = headTail(out.Stdout, ResultText, "stdout", readRestOfRun)
	out.Stderr, cut2 = headTail(out.Stderr, ResultText, "stderr", readRestOfRun)
	out.Truncated = cut1 || cut2
	return out, nil
}

// isCommandKind reports whether kind is one of a command that did not
// complete (the sandbox's kinds), as opposed to a refusal of the daemon's.
func isCommandKind(kind string) bool {
	switch sandbox.ErrorKind(kind) {
	case sandbox.KindPrepare, sandbox.KindStart, sandbox.KindTimeout, sandbox.KindAbort,
		sandbox.KindOverflow, sandbox.KindTransport, sandbox.KindCleanup:
		return true
	}
	return false
}
