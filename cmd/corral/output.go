package main

import (
	"errors"
	"fmt"
	"io"

	"golang.org/x/sys/unix"

	"github.com/corral-sandbox/corral/sandbox"
)

// Exit statuses of `corral run` (pinned): the command's own exit code, or
// 128+N for a death by signal N; 124 for a timeout; 125 for every other
// failure of corral's. Added as Docker has them: 126 for a start error
// whose program is not executable, 127 for one whose program was not
// found, and 128+N for a run that signal N (SIGINT: 130) aborted.
const (
	exitTimeout       = 124
	exitFailure       = 125
	exitNotExecutable = 126
	exitNotFound      = 127
)

// failureStatus is corral's exit status for a command that did not
// complete.
func failureStatus(ce *sandbox.CommandError) int {
	switch {
	case ce.Kind == sandbox.KindTimeout:
		return exitTimeout
	case ce.Kind == sandbox.KindStart && ce.Reason == sandbox.ReasonNotFound:
		return exitNotFound
	case ce.Kind == sandbox.KindStart && ce.Reason == sandbox.ReasonNotExecutable:
		return exitNotExecutable
	}
	return exitFailure
}

// reportTo writes the outcome of a run per the pinned contract and returns
// corral's exit status: the command's output to outStdout and outStderr
// (io.Discard when it was written as it arrived), corral's own to stdout and
// stderr.
func reportTo(stdout, stderr, outStdout, outStderr io.Writer, asJSON bool, res *sandbox.CommandResult, err error) int {
	if err != nil {
		ce := asCommandError(err)
		status := failureStatus(ce)
		if asJSON {
			// The pinned body, streamed: no copy of the output.
			_ = ce.WriteJSON(stdout, false)
			_, _ = io.WriteString(stdout, "\n")
			return status
		}
		_, _ = io.WriteString(outStdout, ce.Stdout)
		_, _ = io.WriteString(outStderr, ce.Stderr)
		fmt.Fprintf(stderr, "corral: %s: %s\n", ce.Kind, ce.Message)
		return status
	}
	if asJSON {
		_ = res.WriteJSON(stdout, true)
		_, _ = io.WriteString(stdout, "\n")
	} else {
		_, _ = io.WriteString(outStdout, res.Stdout)
		_, _ = io.WriteString(outStderr, res.Stderr)
	}
	return exitStatus(res)
}

// exitStatus maps a result to corral's exit status.
func exitStatus(res *sandbox.CommandResult) int {
	if res.Code != nil {
		return *res.Code
	}
	if n := unix.SignalNum(res.Signal); n != 0 {
		return 128 + int(n)
	}
	return exitFailure
}

// asCommandError returns err's CommandError, or wraps a failure of corral's
// own set-up (bad flags, unusable state directory) as a prepare error:
// nothing was started.
func asCommandError(err error) *sandbox.CommandError {
	var ce *sandbox.CommandError
	if errors.As(err, &ce) {
		return ce
	}
	return &sandbox.CommandError{Kind: sandbox.KindPrepare, Message: err.Error(), Cause: err}
}
