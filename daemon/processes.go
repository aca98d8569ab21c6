package daemon

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/corral-sandbox/corral/api"
	"github.com/corral-sandbox/corral/internal/redact"
	"github.com/corral-sandbox/corral/plugin"
	"github.com/corral-sandbox/corral/sandbox"
	"github.com/corral-sandbox/corral/store"
)

// Background processes: a command the daemon starts and holds, detached
// from any client.
//
//	POST   /v1/projects/{id}/processes                 start one (201)
//	GET    /v1/projects/{id}/processes                 list them
//	GET    /v1/projects/{id}/processes/{pid}           one, with its outcome once ended
//	GET    /v1/projects/{id}/processes/{pid}/output    replay and follow its output
//	POST   /v1/projects/{id}/processes/{pid}/signal    signal its whole tree
//	DELETE /v1/projects/{id}/processes/{pid}           kill its tree and forget it
//
// A process is a sandbox.Session (Control.Open, lease kind "process",
// kept alive by core while it runs) whose streams the daemon drains; it
// runs until it
// exits, its lifetime ends (ProcessRequest.Lifetime: it is killed and
// reported "timedOut", kind "timeout"), it is killed (DELETE), the token
// that started it is revoked or its account leaves the project (killed,
// within the session checker's interval: see follow.go), its lease
// can no longer be kept alive or its machine is lost ("interrupted", kind
// "transport"), or the daemon stops ("interrupted", kind "abort"). When
// its main process exits, whatever it left running is killed, as for a
// command. No client holds it: a client that goes away changes nothing. Its output is
// always drained into a ring of ProcessRequest.OutputBuffer bytes, which
// keeps the newest output; readers replay it from an offset and follow it.
//
// Ids are random (128 bits) and belong to their project: every route
// checks membership of the project in the path first (401, 403, as for
// every project route) and then looks the id up in that project only (404
// otherwise). Processes live in the daemon's memory: a daemon that stops
// ends them, and its journal records each one (lease kind "process": its
// start, and its outcome, or "interrupted" when the daemon died before it
// could write one — the lease reconciler closes such entries when their
// lease expires).
//
// An ended process is kept, with its output, for AppOptions.ProcessRetention
// (10 min), then forgotten (404). Live processes are bounded per project
// (AppOptions.MaxProcessesPerProject) and per account
// (MaxProcessesPerAccount): a start beyond either is 429 "busy"; of the
// ended ones a project keeps at most MaxProcessesPerProject, the oldest
// forgotten first.

// Defaults of AppOptions' process fields.
const (
	DefaultProcessLifetime        = time.Hour
	DefaultMaxProcessLifetime     = 24 * time.Hour
	DefaultProcessOutputBuffer    = 1 << 20
	DefaultMaxProcessOutputBuffer = 16 << 20
	DefaultProcessRetention       = 10 * time.Minute
	DefaultMaxProcessesPerProject = 16
	DefaultMaxProcessesPerAccount = 64
)

// processDefaults fills o's zero process fields with their defaults.
func (o *AppOptions) processDefaults() {
	if o.ProcessLifetime <= 0 {
		o.ProcessLifetime = DefaultProcessLifetime
	}
	if o.MaxProcessLifetime <= 0 {
		o.MaxProcessLifetime = DefaultMaxProcessLifetime
	}
	o.ProcessLifetime = min(o.ProcessLifetime, o.MaxProcessLifetime)
	if o.ProcessOutputBuffer <= 0 {
		o.ProcessOutputBuffer = DefaultProcessOutputBuffer
	}
	if o.MaxProcessOutputBuffer <= 0 {
		o.MaxProcessOutputBuffer = DefaultMaxProcessOutputBuffer
	}
	o.ProcessOutputBuffer = min(o.ProcessOutputBuffer, o.MaxProcessOutputBuffer)
	if o.ProcessRetention <= 0 {
		o.ProcessRetention = DefaultProcessRetention
	}
	if o.MaxProcessesPerProject <= 0 {
		o.MaxProcessesPerProject = DefaultMaxProcessesPerProject
	}
	if o.MaxProcessesPerAccount <= 0 {
		o.MaxProcessesPerAccount = DefaultMaxProcessesPerAccount
	}
}

// bgProcess is one background process.
type bgProcess struct {
	id, cwd, user string
	leaseID       string
	project       int64
	account       int64
	argv          []string
	tty           bool
	started       time.Time
	deadline      time.Time
	out           *outputRing
	sess          procSession
	kill          chan struct{} // closed by DELETE
	killOnce      sync.Once
	done          chan struct{} // closed once the outcome is set

	mu       sync.Mutex
	state    string
	ended    time.Time
	exit     *api.ProcessExit
	err      *api.ProcessError
	forgotAt *time.Timer
}

func (p *bgProcess) info() api.Process {
	st := p.out.state()
	p.mu.Lock()
	defer p.mu.Unlock()
	in := api.Process{
		ID: p.id, ProjectID: p.project, State: p.state, Argv: p.argv, Cwd: p.cwd, User: p.user, TTY: p.tty,
		LeaseID: p.leaseID, Started: p.started, Deadline: p.deadline, Exit: p.exit, Error: p.err,
		Output: api.ProcessOutput{StdoutBytes: st.Stdout, StderrBytes: st.Stderr, Start: st.Start, End: st.End, BufferBytes: p.out.size},
	}
	if !p.ended.IsZero() {
		e := p.ended
		in.Ended = &e
	}
	return in
}

func (p *bgProcess) running() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.state == api.ProcessRunning
}

// processTable holds an App's processes.
type processTable struct {
	mu        sync.Mutex
	byID      map[string]*bgProcess
	live      map[int64]int // running per project
	liveAcct  map[int64]int // running per account
	endedProj map[int64][]*bgProcess
}

func newProcessTable() *processTable {
	return &processTable{byID: map[string]*bgProcess{}, live: map[int64]int{}, liveAcct: map[int64]int{}, endedProj: map[int64][]*bgProcess{}}
}

// reserve counts a process about to start against its project's and its
// account's bounds; the returned function gives the place back (once).
func (t *processTable) reserve(project, account int64, perProject, perAccount int) (func(), error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.live[project] >= perProject {
		return nil, apiErr(http.StatusTooManyRequests, KindBusy, "project %d already runs %d background processes (the most it may)", project, perProject)
	}
	if t.liveAcct[account] >= perAccount {
		return nil, apiErr(http.StatusTooManyRequests, KindBusy, "account %d already runs %d background processes (the most it may)", account, perAccount)
	}
	t.live[project]++
	t.liveAcct[account]++
	var once sync.Once
	return func() {
		once.Do(func() {
			t.mu.Lock()
			defer t.mu.Unlock()
			if t.live[project]--; t.live[project] <= 0 {
				delete(t.live, project)
			}
			if t.liveAcct[account]--; t.liveAcct[account] <= 0 {
				delete(t.liveAcct, account)
			}
		})
	}, nil
}

// get returns project's process id.
func (t *processTable) get(project int64, id string) *bgProcess {
	t.mu.Lock()
	defer t.mu.Unlock()
	if p := t.byID[id]; p != nil && p.project == project {
		return p
	}
	return nil
}

// list returns project's processes, oldest first.
func (t *processTable) list(project int64) []*bgProcess {
	t.mu.Lock()
	var out []*bgProcess
	for _, p := range t.byID {
		if p.project == project {
			out = append(out, p)
		}
	}
	t.mu.Unlock()
	sort.Slice(out, func(i, j int) bool {
		if !out[i].started.Equal(out[j].started) {
			return out[i].started.Before(out[j].started)
		}
		return out[i].id < out[j].id
	})
	return out
}

// ended records that p ended: it is kept (at most keep per project, the
// oldest forgotten first) and forgotten after retain.
func (t *processTable) ended(p *bgProcess, keep int, retain time.Duration) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.byID[p.id] != p {
		return // DELETE forgot it already
	}
	l := append(t.endedProj[p.project], p)
	for len(l) > keep {
		t.forgetLocked(l[0])
		l = l[1:]
	}
	t.endedProj[p.project] = l
	p.mu.Lock()
	p.forgotAt = time.AfterFunc(retain, func() { t.forget(p) })
	p.mu.Unlock()
}

func (t *processTable) forget(p *bgProcess) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.forgetLocked(p)
}

func (t *processTable) forgetLocked(p *bgProcess) {
	if t.byID[p.id] == p {
		delete(t.byID, p.id)
	}
	l := t.endedProj[p.project]
	for i, q := range l {
		if q == p {
			l = append(l[:i:i], l[i+1:]...)
			break
		}
	}
	if len(l) == 0 {
		delete(t.endedProj, p.project)
	} else {
		t.endedProj[p.project] = l
	}
	p.mu.Lock()
	if p.forgotAt != nil {
		p.forgotAt.Stop()
	}
	p.mu.Unlock()
}

// processID returns the id of the process whose lease is leaseID: the
// first 128 bits of a hash of the lease's id (random: a UUIDv7 has 74
// random bits, and the id is looked up in its project only), so that
// another replica, which shares the store but not this table, can tell
// whose process an id names (see foreignProcess).
func processID(leaseID string) string {
	h := sha256.Sum256([]byte("corral process " + leaseID))
	return "proc_" + hex.EncodeToString(h[:16])
}

// startProcess serves POST /v1/projects/{id}/processes.
func (a *App) startProcess(w http.ResponseWriter, r *http.Request) error {
	acct, proj, _, err := a.projectMember(r)
	if err != nil {
		return err
	}
	var req api.ProcessRequest
	if err := a.decodeBody(w, r, &req); err != nil {
		return err
	}
	if len(req.Argv) == 0 || req.Argv[0] == "" {
		return apiErr(http.StatusBadRequest, KindInvalid, "argv needs at least the program")
	}
	lifetime := a.opts.ProcessLifetime
	switch {
	case req.Lifetime < 0:
		return apiErr(http.StatusBadRequest, KindInvalid, "lifetime must not be negative")
	case req.Lifetime > int64(a.opts.MaxProcessLifetime/time.Second):
		return apiErr(http.StatusBadRequest, KindInvalid, "lifetime must not exceed %d seconds", int64(a.opts.MaxProcessLifetime/time.Second))
	case req.Lifetime > 0:
		lifetime = time.Duration(req.Lifetime) * time.Second
	}
	size := a.opts.ProcessOutputBuffer
	switch {
	case req.OutputBuffer < 0:
		return apiErr(http.StatusBadRequest, KindInvalid, "outputBuffer must not be negative")
	case req.OutputBuffer > a.opts.MaxProcessOutputBuffer:
		return apiErr(http.StatusBadRequest, KindInvalid, "outputBuffer must not exceed %d bytes", a.opts.MaxProcessOutputBuffer)
	case req.OutputBuffer > 0:
		size = req.OutputBuffer
	}
	if req.TTY != nil && (req.TTY.Rows == 0 || req.TTY.Cols == 0) {
		return apiErr(http.StatusBadRequest, KindInvalid, "tty needs rows and cols from 1 to 65535")
	}
	ctl, err := a.core.Sandbox()
	if err != nil {
		return err
	}
	unreserve, err := a.procs.reserve(proj.ID, acct.ID, a.opts.MaxProcessesPerProject, a.opts.MaxProcessesPerAccount)
	if err != nil {
		return err
	}
	if !a.enterSession() {
		unreserve()
		return apiErr(http.StatusServiceUnavailable, KindUnavailable, "the daemon is shutting down")
	}
	in := sandbox.ExecInput{
		Command:   sandbox.Command{Type: sandbox.CommandTypeArgv, File: req.Argv[0], Args: req.Argv[1:]},
		Cwd:       req.Cwd,
		User:      req.User,
		Env:       req.Env,
		TTY:       req.TTY,
		LeaseKind: sandbox.LeaseProcess,
		Project:   projectRef(proj),
	}
	sess, err := a.startProcSession(r.Context(), ctl, in, &sandbox.Actor{AccountUserID: acct.ID})
	if err != nil {
		unreserve()
		a.wg.Done()
		return err // a program that could not be started is 422 "start"
	}
	now := time.Now()
	p := &bgProcess{
		id: processID(sess.LeaseID()), project: proj.ID, account: acct.ID, argv: req.Argv, cwd: req.Cwd, user: req.User, tty: req.TTY != nil,
		started: now, deadline: now.Add(lifetime), out: newOutputRing(size), sess: sess, leaseID: sess.LeaseID(),
		kill: make(chan struct{}), done: make(chan struct{}), state: api.ProcessRunning,
	}
	a.procs.mu.Lock()
	a.procs.byID[p.id] = p
	a.procs.mu.Unlock()
	jctx, jcancel := context.WithTimeout(context.Background(), 5*time.Second)
	jid, jerr := a.store.JournalStart(jctx, store.JournalCommand{
		Account: acct.ID, Project: proj.ID, Domain: string(plugin.DomainSandbox), Lease: sess.LeaseID(),
		LeaseKind: string(sandbox.LeaseProcess), Argv: redact.Argv(req.Argv),
		Limits: store.Limits{TimeoutMS: lifetime.Milliseconds()},
	})
	jcancel()
	if jerr != nil {
		a.log.Warn("process: journal start", "process", p.id, "err", jerr)
		jid = 0
	}
	// The process is a use of the token that started it: the session
	// checker ends it when the token is revoked or its account leaves the
	// project (it would otherwise run on in another owner's project, and
	// its lease keep that project from being deleted).
	auth, untrack := a.trackSession(context.Background(), r, proj.ID)
	go func() {
		defer a.wg.Done()
		defer untrack()
		a.runProcess(p, lifetime, jid, unreserve, auth)
	}()
	writeJSON(w, http.StatusCreated, p.info())
	return nil
}

// runProcess drains p's output until it ends, ends it when its lifetime
// ends, it is killed, auth ends (its authorization was lost) or the daemon
// stops, then records its outcome.
// Its place in the admission bounds is given back (unreserve) before the
// outcome is published.
func (a *App) runProcess(p *bgProcess, lifetime time.Duration, journalID int64, unreserve func(), auth context.Context) {
	log := a.log.With("process", p.id, "project", p.project, "lease", p.leaseID)
	var pumps sync.WaitGroup
	pump := func(stream byte, r io.Reader) {
		defer pumps.Done()
		pumpOutput(p.out, stream, r)
	}
	pumps.Add(2)
	go pump(StreamStdout, p.sess.Stdout())
	go pump(StreamStderr, p.sess.Stderr())
	pumpsDone := make(chan struct{})
	go func() { pumps.Wait(); close(pumpsDone) }()

	timer := time.NewTimer(lifetime)
	defer timer.Stop()
	var reason *api.ProcessError
	state := api.ProcessExited
	select {
	case <-p.sess.Done():
	case <-timer.C:
		state, reason = api.ProcessTimedOut, &api.ProcessError{Kind: string(sandbox.KindTimeout), Message: fmt.Sprintf("its lifetime of %s ended", lifetime)}
	case <-p.kill:
		state, reason = api.ProcessKilled, &api.ProcessError{Kind: string(sandbox.KindAbort), Message: "killed (KILL or DELETE)"}
	case <-auth.Done():
		msg := context.Cause(auth).Error()
		if se, ok := context.Cause(auth).(*sessionEnded); ok {
			msg = se.reason
		}
		state, reason = api.ProcessKilled, &api.ProcessError{Kind: string(sandbox.KindAbort), Message: "ended: " + msg}
	case <-a.ctx.Done():
		state, reason = api.ProcessInterrupted, &api.ProcessError{Kind: string(sandbox.KindAbort), Message: "the daemon stopped"}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	// The session settles once the output was drained (bounded) and the
	// lease released; Close first kills the tree if it still runs.
	cerr := p.sess.Close(ctx)
	<-pumpsDone // the session closed the streams
	p.out.close()
	exit, werr := p.sess.Wait()
	if cerr != nil {
		log.Warn("process: close", "err", cerr)
	}
	var pexit *api.ProcessExit
	if werr == nil {
		pexit = &api.ProcessExit{Code: exit.Code, OOMKilled: exit.OOMKilled && exit.Signal != ""}
		if exit.Signal != "" {
			s := exit.Signal
			pexit.Signal = &s
		}
	}
	if reason == nil && werr != nil {
		kind := sandbox.KindTransport
		var ce *sandbox.CommandError
		switch {
		case errors.As(werr, &ce):
			kind = ce.Kind
		case errors.Is(werr, sandbox.ErrNotStarted):
			kind = sandbox.KindStart
		}
		state = api.ProcessFailed
		if kind == sandbox.KindTransport {
			state = api.ProcessInterrupted // its lease or its machine was lost
		}
		reason = &api.ProcessError{Kind: string(kind), Message: werr.Error()}
	}
	p.mu.Lock()
	p.state, p.ended, p.exit, p.err = state, time.Now(), pexit, reason
	p.mu.Unlock()
	unreserve()
	close(p.done)
	a.journalProcessEnd(log, journalID, p)
	a.procs.ended(p, a.opts.MaxProcessesPerProject, a.opts.ProcessRetention)
}

// journalProcessEnd records p's outcome in the journal.
func (a *App) journalProcessEnd(log *slog.Logger, id int64, p *bgProcess) {
	if id == 0 {
		return
	}
	in := p.info()
	e := store.JournalEnd{StdoutBytes: in.Output.StdoutBytes, StderrBytes: in.Output.StderrBytes}
	switch {
	case in.State == api.ProcessInterrupted:
		e.Outcome, e.Message = store.OutcomeInterrupted, in.Error.Message
	case in.Error != nil:
		e.Outcome, e.ErrorKind, e.Message = store.OutcomeError, in.Error.Kind, in.Error.Message
	case in.Exit != nil && in.Exit.Code != nil:
		e.Outcome, e.Code = store.OutcomeExit, in.Exit.Code
	case in.Exit != nil:
		e.Outcome, e.Signal, e.OOMKilled = store.OutcomeSignal, *in.Exit.Signal, in.Exit.OOMKilled
	default:
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	// An entry already closed as interrupted (its lease expired) keeps
	// that outcome.
	if err := a.store.JournalFinish(ctx, id, e); err != nil && !errors.Is(err, store.ErrNotFound) {
		log.Warn("process: journal finish", "err", err)
	}
}

// projectProcess resolves {id} (membership first) and {pid}.
func (a *App) projectProcess(r *http.Request) (store.Project, *bgProcess, error) {
	_, proj, _, err := a.projectMember(r)
	if err != nil {
		return store.Project{}, nil, err
	}
	p := a.procs.get(proj.ID, r.PathValue("pid"))
	if p == nil {
		return proj, nil, a.foreignProcess(r.Context(), proj.ID, r.PathValue("pid"))
	}
	return proj, p, nil
}

// foreignProcess is the answer for a process id this daemon does not
// hold: 409 "conflict" naming the replica that runs it when another
// daemon on the same store (a replica) holds the live lease it was named
// after, else 404. Processes live in the memory of the daemon that
// started them; a replica answers for them without proxying: the client
// (or its load balancer) sends the process's requests to its owner.
func (a *App) foreignProcess(ctx context.Context, project int64, id string) error {
	notFound := apiErr(http.StatusNotFound, KindNotFound, "no process %q in project %d", id, project)
	if !strings.HasPrefix(id, "proc_") {
		return notFound
	}
	live, err := a.store.ListLeases(ctx, store.LeaseFilter{Project: project, State: store.LeaseLive})
	if err != nil {
		return err
	}
	for _, l := range live {
		if l.Kind == string(sandbox.LeaseProcess) && processID(l.ID) == id && l.Holder != a.core.Leases().Holder() {
			return apiErr(http.StatusConflict, KindConflict, "process %s runs on another replica of this daemon, %q (the one that started it): send its requests there", id, l.Holder)
		}
	}
	return notFound
}

// listProcesses serves GET /v1/projects/{id}/processes.
func (a *App) listProcesses(w http.ResponseWriter, r *http.Request) error {
	_, proj, _, err := a.projectMember(r)
	if err != nil {
		return err
	}
	out := []api.Process{}
	for _, p := range a.procs.list(proj.ID) {
		out = append(out, p.info())
	}
	writeJSON(w, http.StatusOK, map[string]any{"processes": out})
	return nil
}

// getProcess serves GET /v1/projects/{id}/processes/{pid}.
func (a *App) getProcess(w http.ResponseWriter, r *http.Request) error {
	_, p, err := a.projectProcess(r)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, p.info())
	return nil
}

// parseSignal returns the signal named s.
func parseSignal(s string) (syscall.Signal, error) {
	name := strings.ToUpper(strings.TrimSpace(s))
	if !strings.HasPrefix(name, "SIG") {
		name = "SIG" + name
	}
	sig := unix.SignalNum(name)
	if sig == 0 {
		return 0, apiErr(http.StatusBadRequest, KindInvalid, "unknown signal %q", s)
	}
	return sig, nil
}

// signalProcess serves POST /v1/projects/{id}/processes/{pid}/signal.
func (a *App) signalProcess(w http.ResponseWriter, r *http.Request) error {
	_, p, err := a.projectProcess(r)
	if err != nil {
		return err
	}
	var req api.SignalRequest
	if err := a.decodeBody(w, r, &req); err != nil {
		return err
	}
	sig, err := parseSignal(req.Signal)
	if err != nil {
		return err
	}
	if !p.running() {
		return apiErr(http.StatusConflict, KindConflict, "process %s has ended", p.id)
	}
	if sig == syscall.SIGKILL {
		// Killed as by DELETE (race-free, whatever the provider can
		// signal), but kept: state "killed".
		p.killOnce.Do(func() { close(p.kill) })
		writeJSON(w, http.StatusOK, p.info())
		return nil
	}
	if err := p.sess.Signal(sig); err != nil {
		if errors.Is(err, errors.ErrUnsupported) {
			return &APIError{Status: http.StatusNotImplemented, Kind: KindUnsupported, Message: err.Error(), Cause: err}
		}
		return err
	}
	writeJSON(w, http.StatusOK, p.info())
	return nil
}

// deleteProcess serves DELETE /v1/projects/{id}/processes/{pid}: it kills
// the process's tree if it runs, waits for it to end, forgets it and
// answers its last state.
func (a *App) deleteProcess(w http.ResponseWriter, r *http.Request) error {
	_, p, err := a.projectProcess(r)
	if err != nil {
		return err
	}
	p.killOnce.Do(func() { close(p.kill) })
	select {
	case <-p.done:
	case <-r.Context().Done():
		return r.Context().Err()
	}
	a.procs.forget(p)
	writeJSON(w, http.StatusOK, p.info())
	return nil
}
