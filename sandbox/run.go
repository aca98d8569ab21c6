package sandbox

import (
	"context"
	"fmt"
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
	if err := o.OutputLimit.Validate(); err != nil {
		return nil, newError(KindPrepare, err, "%v", err)
	}
	o.OutputLimit = o.OutputLimit.WithDefaults()

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

// run is the state of one RunCommand call: a session with a capture.
type run struct {
	c     *Control
	in    ExecInput
	actor Actor
	opts  RunOptions

	s     *Session
	cap   *capture
	feed  *feeder // nil: the command reads an empty input
	ended time.Time
}

func (r *run) record(res *CommandResult, cerr *CommandError) Record {
	rec := Record{
		Domain:  r.c.opts.Domain,
		Actor:   r.actor,
		Input:   r.in,
		Timeout: r.opts.Timeout,
		Limit:   r.opts.OutputLimit,
		Ended:   r.ended,
		Result:  res,
		Err:     cerr,
	}
	if r.s != nil {
		rec.Started = r.s.started
		if r.s.common != nil && r.s.common.Lease != nil {
			rec.LeaseID = r.s.common.Lease.ID()
		}
	}
	if r.cap != nil {
		rec.StdoutBytes, rec.StderrBytes = r.cap.sizes()
	}
	return rec
}

// execute is Open with a capture attached, then the wait.
func (r *run) execute(ctx context.Context) (res *CommandResult, cerr *CommandError) {
	defer func() { r.ended = time.Now() }()
	var (
		entry     *JournalEntry
		journaled bool // the end was recorded with the lease's release
	)
	hooks := &sessionHooks{
		admitted:  true,
		withInput: r.opts.Stdin != nil,
		bounded:   true,
		attach:    r.attach,
		self:      &r.s,
		inline:    true,
	}
	if r.c.opts.Journal != nil {
		entry = r.c.opts.Journal(r.record(nil, nil))
	}
	if entry != nil && entry.Intent != nil {
		ctx = context.WithValue(ctx, journalKey{}, entry.Intent)
	}
	if entry != nil {
		hooks.prepared = func() {
			if entry.Start != nil {
				entry.Start(r.record(nil, nil))
			}
			if entry.Release != nil {
				hooks.release = func(ctx context.Context, l Lease, exit Exit) error {
					if r.cap != nil {
						<-r.cap.done // the sizes are final (the session closed the streams)
					}
					r.ended = time.Now()
					rec := r.record(&CommandResult{Code: exit.Code, Signal: exit.Signal, OOMKilled: exit.OOMKilled}, nil)
					ok, err := entry.Release(ctx, l, rec)
					journaled = ok
					return err
				}
			}
		}
	}
	s, ce := r.c.open(ctx, r.in, r.actor, SessionOptions{Lifetime: r.opts.Timeout, OnStart: r.opts.OnStart}, hooks)
	if entry != nil && entry.Finish != nil {
		defer func() {
			r.ended = time.Now()
			if !journaled {
				entry.Finish(r.record(res, cerr))
			}
		}()
	}
	if ce != nil {
		return nil, ce
	}
	s.settle(ctx)
	exit, err := s.Wait()
	if r.cap != nil {
		// The session closed the streams: the readers end now.
		<-r.cap.done
	}
	stdout, stderr := r.output()
	if err != nil {
		ce := err.(*CommandError)
		ce.Stdout, ce.Stderr = stdout, stderr
		return nil, ce
	}
	res = &CommandResult{Stdout: stdout, Stderr: stderr, Code: exit.Code, Signal: exit.Signal, OOMKilled: exit.OOMKilled}
	if s.cut {
		res.OutputErr = ErrWaitDelay
	}
	return res, nil
}

// attach starts the capture and the input feed on a started process.
func (r *run) attach(proc process) attached {
	var lv *live
	c := r.s.common
	if r.opts.OnOutput != nil {
		lv = &live{fn: r.opts.OnOutput, sanitize: c.Sanitize, hold: c.SanitizeHold}
	}
	r.cap = newCapture(r.opts.OutputLimit, lv)
	r.cap.sanitize, r.cap.hold = c.Sanitize, c.SanitizeHold
	r.cap.start(proc.outputs())
	a := attached{outDone: r.cap.done, overflow: r.cap.overflow, overflowErr: r.overflowError}
	if w := proc.input(); w != nil {
		r.feed = feedInput(w, r.s.preparedInput(), r.opts.Stdin)
		a.inputFailed, a.stopInput = r.feed.failed, r.feed.stop
	}
	return a
}

func (r *run) overflowError() *CommandError {
	l := r.opts.OutputLimit
	if l.Combined > 0 {
		return newError(KindOverflow, nil, "output exceeded the combined limit of %d bytes", l.Combined)
	}
	return newError(KindOverflow, nil, "output exceeded its limit (stdout %d, stderr %d bytes)", l.Stdout, l.Stderr)
}

func (r *run) output() (stdout, stderr string) {
	if r.cap == nil {
		return "", "" // never started
	}
	// The readers are done and the buffers are ours.
	sz := r.s.common.Sanitize
	return r.cap.stdout.result(r.opts.RawOutput, sz), r.cap.stderr.result(r.opts.RawOutput, sz)
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
