package sandbox

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"
)

// RunCommand runs one bounded command and returns its result.
//
// The actor is the explicit actor if non-nil, else the turn scope of ctx
// (see WithTurn); with neither, RunCommand refuses. opts may be nil; see
// RunOptions for the defaults.
//
// RunCommand follows the same steps for every provider: validate, admit
// (ControlOptions.Admitter, reserving the output limits until RunCommand
// returns: a refusal is a KindPrepare error wrapping ErrBusy), prepare,
// check the returned target, heartbeat the lease (every five seconds),
// refuse an already-cancelled ctx, call OnStart, start, capture stdout and
// stderr into bounded buffers, and settle on the first of: the command's exit,
// the timeout, ctx's cancellation, an output overflow or a lost transport
// (including a failed heartbeat).
//
// If the command exits, RunCommand releases the lease (without cancelling)
// and returns a *CommandResult with exactly one of Code and Signal: a
// nonzero exit is a result. When the main process exits RunCommand kills
// what is left of the command: a host command's process group, and, for a
// command confined as an unprivileged user, its whole pid namespace. If a
// descendant it could not kill (one that left a direct command's process
// group) keeps the output open, RunCommand stops reading after
// ControlOptions.DrainTimeout and the result's OutputErr is ErrWaitDelay:
// the output may be incomplete, but the exit status is the command's, so it
// is still a result, not an error.
//
// Otherwise RunCommand cancels the command's whole process tree, waits (for
// at most ControlOptions.CancelWait) for it to end, releases the lease and
// returns a *CommandError whose Kind says why, with the output captured so
// far. A CommandError never carries an exit code. If the command was never
// started (KindPrepare, or KindStart/KindAbort before starting), there is no
// output. Prepare errors before a lease exists clean nothing up.
//
// Output is decoded as UTF-8 (each invalid byte becomes U+FFFD; NUL bytes and
// newlines are kept; RunOptions.RawOutput keeps the bytes) and passed through
// the provider's Sanitize, for results and partial output alike. The
// command's input is RunOptions.Stdin (streamed), its environment the
// sandbox's defaults with ExecInput.Env over them, and RunOptions.OnOutput
// sees the output as it arrives.
//
// Cleanup failures remain failures: if releasing the lease fails after the
// command completed, RunCommand returns a KindCleanup error carrying the
// output; if cancellation or release fails after another failure, the
// cleanup error is joined into that error's Cleanup field.
func (c *Control) RunCommand(ctx context.Context, in ExecInput, actor *Actor, opts *RunOptions) (*CommandResult, error) {
	var o RunOptions
	if opts != nil {
		o = *opts
	}
	a, err := resolveActor(ctx, actor)
	if err != nil {
		return nil, newError(KindPrepare, err, "%v", err)
	}
	if err := in.Validate(); err != nil {
		return nil, newError(KindPrepare, err, "%v", err)
	}
	if o.Timeout < 0 {
		return nil, newError(KindPrepare, nil, "timeout must not be negative")
	}
	if o.Timeout == 0 {
		o.Timeout = DefaultTimeout
	}
	if err := o.OutputLimit.validate(); err != nil {
		return nil, newError(KindPrepare, err, "%v", err)
	}
	o.OutputLimit = o.OutputLimit.withDefaults()

	release, cerr := c.admit(ctx, Admission{Kind: AdmitCommand, Account: a.AccountUserID, Bytes: reservedBytes(o.OutputLimit)})
	if cerr != nil {
		return nil, cerr
	}
	defer release()
	r := &run{c: c, in: in, actor: a, opts: o}
	res, cerr := r.execute(ctx)
	if c.opts.Observe != nil {
		c.opts.Observe(r.record(res, cerr))
	}
	if cerr != nil {
		return nil, cerr
	}
	return res, nil
}

// run is the state of one RunCommand call.
type run struct {
	c     *Control
	in    ExecInput
	actor Actor
	opts  RunOptions

	prep    Prepared
	common  *PreparedCommon
	cap     *capture
	feed    *feeder // nil: the command reads an empty input
	started time.Time
	ended   time.Time

	stopHeartbeat func()
	heartbeatErr  chan error
}

func (r *run) record(res *CommandResult, cerr *CommandError) Record {
	rec := Record{
		Domain:  r.c.opts.Domain,
		Actor:   r.actor,
		Input:   r.in,
		Timeout: r.opts.Timeout,
		Limit:   r.opts.OutputLimit,
		Started: r.started,
		Ended:   r.ended,
		Result:  res,
		Err:     cerr,
	}
	if r.common != nil && r.common.Lease != nil {
		rec.LeaseID = r.common.Lease.ID()
	}
	if r.cap != nil {
		rec.StdoutBytes, rec.StderrBytes = r.cap.sizes()
	}
	return rec
}

func (r *run) execute(ctx context.Context) (res *CommandResult, cerr *CommandError) {
	defer func() { r.ended = time.Now() }()
	prep, err := r.c.provider.PrepareExecution(ctx, r.in, r.actor)
	if err != nil {
		return nil, newError(KindPrepare, err, "preparation refused: %v", err)
	}
	if err := CheckTarget(r.in, r.actor, prep); err != nil {
		ce := newError(KindPrepare, err, "%v", err)
		if prep != nil && prep.Common().Lease != nil {
			ce.Cleanup = releaseLease(ctx, prep.Common().Lease)
		}
		return nil, ce
	}
	r.prep, r.common = prep, prep.Common()
	if r.c.opts.Journal != nil {
		if finish := r.c.opts.Journal(r.record(nil, nil)); finish != nil {
			defer func() {
				r.ended = time.Now()
				finish(r.record(res, cerr))
			}()
		}
	}
	r.startHeartbeat(ctx)

	if err := ctx.Err(); err != nil {
		return nil, r.failUnstarted(ctx, newError(KindAbort, err, "aborted before start"))
	}
	if r.opts.OnStart != nil {
		info := StartInfo{LeaseID: r.common.Lease.ID(), Project: r.common.Project, DisplayCwd: r.common.DisplayCwd}
		if err := callOnStart(r.opts.OnStart, info); err != nil {
			return nil, r.failUnstarted(ctx, newError(KindStart, err, "onStart: %v", err))
		}
	}

	timer := time.NewTimer(r.opts.Timeout)
	defer timer.Stop()
	r.started = time.Now()
	// The start counts against the timeout, and the caller may abort it.
	startCtx, cancelStart := context.WithTimeout(ctx, r.opts.Timeout)
	proc, err := r.start(startCtx)
	startErr := startCtx.Err()
	cancelStart()
	if err != nil {
		switch {
		case ctx.Err() != nil:
			return nil, r.failUnstarted(ctx, newError(KindAbort, ctx.Err(), "aborted while starting: %v", err))
		case errors.Is(startErr, context.DeadlineExceeded):
			return nil, r.failUnstarted(ctx, newError(KindTimeout, context.DeadlineExceeded, "command timed out after %v while starting", r.opts.Timeout))
		case errors.Is(err, ErrTransport):
			return nil, r.failUnstarted(ctx, newError(KindTransport, err, "start %s: %v", r.in.Command.File, err))
		}
		return nil, r.failUnstarted(ctx, newError(KindStart, err, "start %s: %v", r.in.Command.File, err))
	}
	var lv *live
	if r.opts.OnOutput != nil {
		lv = &live{fn: r.opts.OnOutput, sanitize: r.common.Sanitize, hold: r.common.SanitizeHold}
	}
	r.cap = newCapture(r.opts.OutputLimit, lv)
	r.cap.sanitize, r.cap.hold = r.common.Sanitize, r.common.SanitizeHold
	r.cap.start(proc.outputs())
	var inputFailed <-chan error
	if w := proc.input(); w != nil {
		r.feed = feedInput(w, r.preparedInput(), r.opts.Stdin)
		inputFailed = r.feed.failed
	}

	var failure *CommandError
	select {
	case <-proc.done():
	case <-timer.C:
		failure = newError(KindTimeout, context.DeadlineExceeded, "command timed out after %v", r.opts.Timeout)
	case <-ctx.Done():
		failure = newError(KindAbort, ctx.Err(), "aborted: %v", ctx.Err())
	case <-r.cap.overflow:
		failure = r.overflowError()
	case err := <-r.heartbeatErr:
		failure = newError(KindTransport, err, "lease heartbeat failed: %v", err)
	case err := <-inputFailed:
		failure = newError(KindTransport, err, "reading the command's input: %v", err)
	}
	if r.feed != nil {
		// The copy stops with the command (or its failure).
		r.feed.stop()
	}

	if failure == nil {
		// The main process ended. Leave nothing running, then drain —
		// unless the session was lost: then its streams may stay open
		// until a slow teardown, and the failure path drains briefly.
		proc.ended()
		exit, err := proc.exit()
		cut := false
		if err == nil || errors.Is(err, ErrNotStarted) {
			cut = r.drain(proc)
		}
		switch {
		case r.cap.overflowed():
			failure = r.overflowError()
		case err != nil && errors.Is(err, ErrNotStarted):
			failure = newError(KindStart, err, "start %s: %v", r.in.Command.File, err)
		case err != nil:
			failure = newError(KindTransport, err, "%v", err)
		case !exit.valid():
			failure = newError(KindTransport, nil, "provider reported an exit with neither code nor signal")
		default:
			r.stopHeartbeat()
			stdout, stderr := r.output()
			res := &CommandResult{Stdout: stdout, Stderr: stderr, Code: exit.Code, Signal: exit.Signal, OOMKilled: exit.OOMKilled && exit.Signal != ""}
			if cut {
				res.OutputErr = ErrWaitDelay
			}
			if err := releaseLease(ctx, r.common.Lease); err != nil {
				return nil, &CommandError{Kind: KindCleanup, Message: err.Error(), Stdout: stdout, Stderr: stderr, Cleanup: err}
			}
			return res, nil
		}
	}

	// Failure: cancel the tree, wait for it (bounded), drain, release.
	r.stopHeartbeat()
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.c.opts.CancelWait)
	defer cancel()
	var cleanup []error
	if err := proc.cancel(cctx); err != nil {
		cleanup = append(cleanup, fmt.Errorf("cancel: %w", err))
	}
	select {
	case <-proc.done():
	case <-cctx.Done():
		cleanup = append(cleanup, fmt.Errorf("command did not end within %v of cancellation", r.c.opts.CancelWait))
	}
	// A cancelled tree closes its streams at once; a lost transport may
	// leave them to a slow teardown. Either way the caller learns of the
	// failure promptly, with what was read.
	r.drainFor(proc, min(r.c.opts.DrainTimeout, failureDrain))
	if err := releaseLease(ctx, r.common.Lease); err != nil {
		cleanup = append(cleanup, err)
	}
	failure.Stdout, failure.Stderr = r.output()
	failure.Cleanup = errors.Join(cleanup...)
	return nil, failure
}

func (r *run) overflowError() *CommandError {
	l := r.opts.OutputLimit
	if l.Combined > 0 {
		return newError(KindOverflow, nil, "output exceeded the combined limit of %d bytes", l.Combined)
	}
	return newError(KindOverflow, nil, "output exceeded its limit (stdout %d, stderr %d bytes)", l.Stdout, l.Stderr)
}

func (r *run) start(ctx context.Context) (process, error) {
	withInput := r.opts.Stdin != nil || len(r.preparedInput()) > 0
	switch p := r.prep.(type) {
	case *LocalPrepared:
		return startLocal(p, withInput)
	case *ManagedPrepared:
		return startManaged(ctx, p, withInput)
	}
	return nil, fmt.Errorf("unknown prepared type %T", r.prep)
}

// preparedInput is the provider's prepared input, if any.
func (r *run) preparedInput() []byte {
	switch p := r.prep.(type) {
	case *LocalPrepared:
		return p.Stdin
	case *ManagedPrepared:
		return p.Stdin
	}
	return nil
}

// failUnstarted cancels a preparation whose command never ran and releases
// its lease.
func (r *run) failUnstarted(ctx context.Context, ce *CommandError) *CommandError {
	r.stopHeartbeat()
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.c.opts.CancelWait)
	defer cancel()
	var cleanup []error
	var cancelFn func(context.Context) error
	switch p := r.prep.(type) {
	case *LocalPrepared:
		cancelFn = p.Cancel
	case *ManagedPrepared:
		cancelFn = p.Cancel
	}
	if cancelFn != nil {
		if err := cancelFn(cctx); err != nil {
			cleanup = append(cleanup, fmt.Errorf("cancel: %w", err))
		}
	}
	if err := releaseLease(ctx, r.common.Lease); err != nil {
		cleanup = append(cleanup, err)
	}
	ce.Cleanup = errors.Join(cleanup...)
	return ce
}

// failureDrain bounds the drain after a failure.
const failureDrain = 250 * time.Millisecond

// drain waits for the output readers to finish, at most DrainTimeout, then
// closes the streams so no reader is left behind. It reports whether the
// bound cut the output (the streams were still open).
func (r *run) drain(proc process) bool { return r.drainFor(proc, r.c.opts.DrainTimeout) }

// drainFor is drain with bound d.
func (r *run) drainFor(proc process, d time.Duration) (cut bool) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-r.cap.done:
	case <-r.cap.overflow:
	case <-t.C:
		cut = true
	}
	proc.closeOutputs()
	<-r.cap.done
	return cut
}

func (r *run) output() (stdout, stderr string) {
	// drain has returned: the readers are done and the buffers are ours.
	return r.cap.stdout.result(r.opts.RawOutput, r.common.Sanitize), r.cap.stderr.result(r.opts.RawOutput, r.common.Sanitize)
}

func (r *run) startHeartbeat(ctx context.Context) {
	r.heartbeatErr = make(chan error, 1)
	if ka, ok := r.common.Lease.(KeepAliver); ok {
		id := r.common.Lease.ID()
		stop := ka.KeepAlive(r.c.opts.HeartbeatInterval, func(err error) {
			select {
			case r.heartbeatErr <- fmt.Errorf("lease %s: %w", id, err):
			default:
			}
		})
		var once sync.Once
		r.stopHeartbeat = func() { once.Do(stop) }
		return
	}
	hctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	done := make(chan struct{})
	lease := r.common.Lease
	interval := r.c.opts.HeartbeatInterval
	go func() {
		defer close(done)
		t := time.NewTicker(interval)
		defer t.Stop()
		for {
			select {
			case <-hctx.Done():
				return
			case <-t.C:
				if err := lease.Heartbeat(hctx); err != nil {
					if hctx.Err() != nil {
						return
					}
					r.heartbeatErr <- fmt.Errorf("lease %s: %w", lease.ID(), err)
					return
				}
			}
		}
	}()
	var stopped bool
	r.stopHeartbeat = func() {
		if stopped {
			return
		}
		stopped = true
		cancel()
		<-done
	}
}

// OnStartPanic is the error of an OnStart callback that panicked: the
// command is treated as if OnStart had returned it (not started, the
// preparation cancelled, the lease released, KindStart).
type OnStartPanic struct {
	// Value is what OnStart panicked with.
	Value any
}

func (e *OnStartPanic) Error() string { return fmt.Sprintf("panic: %v", e.Value) }

// callOnStart calls f, turning a panic into an *OnStartPanic.
func callOnStart(f func(StartInfo) error, info StartInfo) (err error) {
	defer func() {
		if v := recover(); v != nil {
			err = &OnStartPanic{Value: v}
		}
	}()
	return f(info)
}
