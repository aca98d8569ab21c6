package runner

import (
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/corral-sandbox/corral/sandbox"
)

// MaxJobBytes bounds the JSON job a runner reads from stdin.
const MaxJobBytes = 16 << 20

// Job is what a runner is asked to do: run Commands in order, in Project,
// on behalf of Actor. Its JSON form is
//
//	{"actor":{"accountUserId":N,"roots":[...]},
//	 "project":{"kind":"managed"|"host","projectId":N},
//	 "commands":[{"command":{"type":"argv","file":F,"args":[...]},
//	              "cwd":S,"timeoutMs":N,"outputLimit":{"stdout":N,"stderr":N,"combined":N}}]}
//
// Unknown fields are refused. The actor is explicit: it passes
// preparation's tenancy and confinement rules like any other, so naming an
// actor grants nothing by itself.
type Job struct {
	Actor    sandbox.Actor      `json:"actor"`
	Project  sandbox.ProjectRef `json:"project"`
	Commands []JobCommand       `json:"commands"`
}

// JobCommand is one command of a Job.
type JobCommand struct {
	Command sandbox.Command `json:"command"`
	// Cwd is the working directory (see sandbox.ExecInput.Cwd); empty means
	// the project's root.
	Cwd string `json:"cwd,omitempty"`
	// TimeoutMs bounds the command in milliseconds; zero means
	// sandbox.DefaultTimeout. A negative value is refused (a "prepare"
	// error result).
	TimeoutMs int64 `json:"timeoutMs,omitempty"`
	// OutputLimit bounds captured output; the zero value means 1 MiB per
	// stream.
	OutputLimit sandbox.OutputLimit `json:"outputLimit"`
}

// input returns the sandbox input of c in job j.
func (j *Job) input(c JobCommand) sandbox.ExecInput {
	return sandbox.ExecInput{
		Command:   c.Command,
		Cwd:       c.Cwd,
		LeaseKind: sandbox.LeaseRunner,
		Project:   j.Project,
	}
}

// options returns the run options of c.
func (c JobCommand) options() *sandbox.RunOptions {
	return &sandbox.RunOptions{
		Timeout:     time.Duration(c.TimeoutMs) * time.Millisecond,
		OutputLimit: c.OutputLimit,
	}
}

// Result is one command's outcome as a runner reports it: exactly one of
// Result (the command completed, whatever its exit code) and Err (it did
// not) is set. Err carries only what crosses the process boundary: Kind,
// Message, Stdout and Stderr.
//
// Its JSON form is the pinned one: the CommandResult form
// {"stdout":S,"stderr":S,"code":N|null,"signal":S|null}, or
// {"error":{"kind":K,"message":S,"stdout":S,"stderr":S}}.
type Result struct {
	Result *sandbox.CommandResult
	Err    *sandbox.CommandError
}

// resultOf makes the Result of a RunCommand call.
func resultOf(res *sandbox.CommandResult, err error) Result {
	if err == nil {
		return Result{Result: res}
	}
	var ce *sandbox.CommandError
	if !errors.As(err, &ce) {
		// RunCommand reports every failure as a CommandError; anything else
		// is a failure before anything started.
		ce = &sandbox.CommandError{Kind: sandbox.KindPrepare, Message: err.Error(), Cause: err}
	}
	return Result{Err: &sandbox.CommandError{Kind: ce.Kind, Message: ce.Message, Stdout: ce.Stdout, Stderr: ce.Stderr}}
}

// MarshalJSON encodes r in its pinned form. A Result with neither or both
// of Result and Err set is an error.
func (r Result) MarshalJSON() ([]byte, error) {
	switch {
	case r.Result != nil && r.Err == nil:
		return json.Marshal(r.Result)
	case r.Err != nil && r.Result == nil:
		return r.Err.MarshalJSON()
	}
	return nil, errors.New("runner: a Result needs exactly one of Result and Err")
}

// UnmarshalJSON decodes the pinned form: an object with an "error" member
// is an error, any other object a result.
func (r *Result) UnmarshalJSON(b []byte) error {
	var probe map[string]json.RawMessage
	if err := json.Unmarshal(b, &probe); err != nil {
		return fmt.Errorf("runner: result: %w", err)
	}
	if _, ok := probe["error"]; ok {
		var ce sandbox.CommandError
		if err := ce.UnmarshalJSON(b); err != nil {
			return fmt.Errorf("runner: error result: %w", err)
		}
		*r = Result{Err: &ce}
		return nil
	}
	var res sandbox.CommandResult
	if err := json.Unmarshal(b, &res); err != nil {
		return fmt.Errorf("runner: result: %w", err)
	}
	if (res.Code == nil) == (res.Signal == "") {
		return errors.New("runner: result needs exactly one of code and signal")
	}
	*r = Result{Result: &res}
	return nil
}
