package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"

	"github.com/corral-sandbox/corral/client"
	"github.com/corral-sandbox/corral/sandbox"
)

// runViaDaemon runs argv in the daemon's project f.projectID through the
// API, as the account of f.token (default $CORRAL_TOKEN). Every outcome
// that is not a completed command is returned as a *sandbox.CommandError,
// so that report applies the pinned contract unchanged: an API error keeps
// its kind when it is a sandbox kind (timeout → 124) and its partial
// output; the daemon's own refusals (401, 403, 404, 503, …) and an
// unreachable daemon are "prepare" failures (nothing was started); a
// signal aborts the request, which aborts the command ("abort").
//
// The command's input (-i) is read whole, at most the daemon's default
// MaxStdin, and sent in the request; live output (opts.OnOutput) comes
// from the streamed answer, as raw bytes (encoding base64).
func runViaDaemon(ctx context.Context, f *runFlags, argv []string, env map[string]string, opts *sandbox.RunOptions) (*sandbox.CommandResult, error) {
	c, err := daemonClient(f.daemon, f.token)
	if err != nil {
		return nil, &sandbox.CommandError{Kind: sandbox.KindPrepare, Message: err.Error(), Cause: err}
	}
	req := client.CommandRequest{
		Command:   sandbox.Command{Type: sandbox.CommandTypeArgv, File: argv[0], Args: argv[1:]},
		Cwd:       f.cwd,
		User:      f.user,
		LeaseKind: sandbox.LeaseKind(f.leaseKind),
		Env:       env,
	}
	var onStdout, onStderr func([]byte)
	if opts != nil {
		req.TimeoutMs = opts.Timeout.Milliseconds()
		req.OutputLimit = opts.OutputLimit
		if opts.Stdin != nil {
			data, err := io.ReadAll(io.LimitReader(opts.Stdin, daemonStdinMax+1))
			if err != nil {
				return nil, &sandbox.CommandError{Kind: sandbox.KindPrepare, Message: "reading stdin: " + err.Error(), Cause: err}
			}
			if len(data) > daemonStdinMax {
				return nil, &sandbox.CommandError{Kind: sandbox.KindPrepare, Message: fmt.Sprintf("stdin is larger than %d bytes (the daemon's limit)", daemonStdinMax)}
			}
			req.Stdin = data
		}
		if on := opts.OnOutput; on != nil {
			req.Encoding = client.EncodingBase64
			onStdout = func(p []byte) { on(sandbox.Stdout, p) }
			onStderr = func(p []byte) { on(sandbox.Stderr, p) }
		}
	}
	res, err := c.StreamCommand(ctx, f.projectID, req, onStdout, onStderr)
	if err == nil {
		return res, nil
	}
	return nil, daemonCommandError(ctx, err)
}

// daemonStdinMax is the most input -i sends through a daemon: its default
// limit (daemon.DefaultMaxStdin).
const daemonStdinMax = 16 << 20

// daemonCommandError translates a client error into the CLI's error type.
func daemonCommandError(ctx context.Context, err error) *sandbox.CommandError {
	var ae *client.Error
	if errors.As(err, &ae) {
		kind := sandbox.ErrorKind(ae.Kind)
		switch kind {
		case sandbox.KindPrepare, sandbox.KindStart, sandbox.KindTimeout, sandbox.KindAbort,
			sandbox.KindOverflow, sandbox.KindTransport, sandbox.KindCleanup:
			return &sandbox.CommandError{Kind: kind, Message: ae.Message, Stdout: ae.Stdout, Stderr: ae.Stderr, Reason: sandbox.StartReason(ae.Reason), Cause: err}
		}
		return &sandbox.CommandError{Kind: sandbox.KindPrepare, Message: fmt.Sprintf("daemon refused (%d %s): %s", ae.Status, ae.Kind, ae.Message), Cause: err}
	}
	if ctx.Err() != nil {
		return &sandbox.CommandError{Kind: sandbox.KindAbort, Message: fmt.Sprintf("aborted: %v", ctx.Err()), Cause: err}
	}
	var oe *net.OpError
	if errors.As(err, &oe) && oe.Op == "dial" {
		return &sandbox.CommandError{Kind: sandbox.KindPrepare, Message: "cannot reach the daemon: " + err.Error(), Cause: err}
	}
	return &sandbox.CommandError{Kind: sandbox.KindTransport, Message: err.Error(), Cause: err}
}
