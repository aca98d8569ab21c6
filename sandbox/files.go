package sandbox

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"time"
)

// Files of a project, through the same lifecycle as a session:
//
//	validate → prepare (provider: tenancy, the lease, the files target) →
//	check the target → heartbeat the lease → the calls → Close: journal
//	the outcome, stop the heartbeat, release the lease.
//
// OpenFiles returns a *Files holding a lease of kind "files" (stamped, as
// every lease of the provider, with its domain); every call runs under
// the Files' context, which ends when its lease's heartbeat fails: no
// transfer outlives its lease.

// FilesInput is one request for a project's files (Control.OpenFiles).
type FilesInput struct {
	// Project is the project whose files are reached.
	Project ProjectRef
	// User is whom a managed project's files are reached as: a user name
	// or numeric uid of its machine; empty is the machine's default user.
	// A host project's files are reached as the project's own user: a
	// non-empty User is refused.
	User string
	// Journal, if not nil, is what the journal records of the call, as a
	// command's argv (a write: "files", "put", "/workspace/x"); nil
	// records nothing (reads).
	Journal []string
}

// MaxFilesUser bounds FilesInput.User.
const MaxFilesUser = 256

// Validate checks the input's shape; it does not check tenancy.
func (in FilesInput) Validate() error {
	switch in.Project.Kind {
	case ProjectManaged, ProjectHost:
	default:
		return fmt.Errorf("project kind %q is not supported", in.Project.Kind)
	}
	if in.Project.ProjectID <= 0 {
		return fmt.Errorf("project id %d is not valid", in.Project.ProjectID)
	}
	if len(in.User) > MaxFilesUser || strings.ContainsAny(in.User, "\x00\n/:") {
		return fmt.Errorf("user %.40q is not a user name or uid", in.User)
	}
	return nil
}

// FileInfo describes a file of a project.
type FileInfo struct {
	// Name is the last component of Path, the file's guest path
	// (/workspace/…; a host project's too).
	Name, Path string
	// Type is "file", "dir", "symlink" or "other".
	Type  string
	Size  int64
	Mode  uint32 // permission, set-id and sticky bits
	MTime time.Time
	// Target is a symlink's target, as stored.
	Target string
	// WD is a watched directory's inotify watch descriptor (Watch).
	WD int
}

// FileSystem is a project's files as a provider reaches them, as one user.
// Paths are clean guest paths (/workspace/x, /home/corral/y in a machine)
// or relative to the workspace; none leads out of the project.
//
// Errors are classified (a Class method, see ErrUnavailable): "notFound",
// "forbidden", "conflict" (exists, not empty), "invalid" (a refused path or
// user, a directory where a file is needed) or "noSpace" (the project's
// disk is full); others are failures.
type FileSystem interface {
	// Open opens a regular file for reading (a final symlink followed
	// inside the project) and describes it.
	Open(ctx context.Context, p string) (*os.File, FileInfo, error)
	// Write replaces the file at p atomically with what src yields, with
	// mode (0: 0644; only the permission bits count), and returns the
	// bytes written. On failure p is unchanged.
	Write(ctx context.Context, p string, mode uint32, src io.Reader) (int64, error)
	// Stat describes p without following a final symlink.
	Stat(ctx context.Context, p string) (FileInfo, error)
	// List describes directory p and its entries to depth levels, at most
	// limit of them; truncated reports that more were left out.
	List(ctx context.Context, p string, depth, limit int) (dir FileInfo, entries []FileInfo, truncated bool, err error)
	// Mkdir makes directory p with mode (0: 0755); with parents, missing
	// parents too, and an existing directory is no error.
	Mkdir(ctx context.Context, p string, mode uint32, parents bool) (FileInfo, error)
	// Remove removes p; a non-empty directory only with recursive.
	Remove(ctx context.Context, p string, recursive bool) error
	// Rename renames from to to (rename(2)'s rules).
	Rename(ctx context.Context, from, to string) error
	// Watch returns a non-blocking inotify descriptor watching directory
	// p (and, with recursive, the directories below it), with each
	// watch's descriptor (FileInfo.WD) and path.
	Watch(ctx context.Context, p string, recursive bool) (*os.File, []FileInfo, error)
	// AddWatch adds watches for directory p and below it to ino, a
	// descriptor Watch returned.
	AddWatch(ctx context.Context, ino *os.File, p string) ([]FileInfo, error)
}

// PreparedFiles is a provider's preparation of a files call: the lease
// covering it and the target.
type PreparedFiles struct {
	// Project must equal the requested one.
	Project ProjectRef
	// Lease covers the call; it must belong to the actor and have kind
	// LeaseFiles.
	Lease Lease
	// FS is the project's files as FilesInput.User.
	FS FileSystem
}

// FilesPreparer is implemented by providers that serve projects' files.
type FilesPreparer interface {
	// PrepareFiles checks tenancy (as PrepareExecution does), mints a lease
	// of kind LeaseFiles and returns the project's files. A refusal is an
	// error, and no lease was minted.
	PrepareFiles(ctx context.Context, in FilesInput, actor Actor) (*PreparedFiles, error)
}

// kindFiles is the kind the journal records a failed files call with (a
// Record's only: no CommandError of this kind is ever returned).
const kindFiles ErrorKind = "files"

// Files is a project's files under a lease: what Control.OpenFiles
// returns. Its methods are FileSystem's, run under Context; they are safe
// for concurrent use. Close ends it.
type Files struct {
	fs      FileSystem
	lease   Lease
	ctx     context.Context
	cancel  context.CancelCauseFunc
	journal *JournalEntry
	rec     Record
	stop    func() // the heartbeat's

	releaseOnce sync.Once
	releaseErr  error
	closeOnce   sync.Once
	closeErr    error
}

// OpenFiles prepares a files call for actor (explicit, else the turn
// scope): the provider checks tenancy and mints a lease of kind "files",
// which the returned Files heartbeats every ControlOptions.HeartbeatInterval
// until Close. A call with FilesInput.Journal is recorded by
// ControlOptions.Journal like a command (its start with the lease, its end
// at Close).
//
// It fails with an error wrapping ErrNoActor (no actor), ErrUnavailable
// (the provider serves no files), or the provider's refusal (ErrNotFound,
// ErrDenied, …); then nothing is held. The Files' context is ctx's, ended
// also when the lease's heartbeat fails (its cause wraps ErrHeartbeat) and
// by Close.
func (c *Control) OpenFiles(ctx context.Context, in FilesInput, actor *Actor) (*Files, error) {
	a, err := resolveActor(ctx, actor)
	if err != nil {
		return nil, err
	}
	if err := in.Validate(); err != nil {
		return nil, fmt.Errorf("sandbox: files: %w", err)
	}
	fp, ok := c.provider.(FilesPreparer)
	if !ok {
		return nil, fmt.Errorf("%w: the sandbox provider serves no files", ErrUnavailable)
	}
	f := &Files{rec: Record{Domain: c.opts.Domain, Actor: a, Input: ExecInput{
		Command:   Command{Type: CommandTypeArgv, File: "files"},
		LeaseKind: LeaseFiles,
		Project:   in.Project,
	}}}
	pctx := ctx
	if len(in.Journal) > 0 && c.opts.Journal != nil {
		f.rec.Input.Command = Command{Type: CommandTypeArgv, File: in.Journal[0], Args: in.Journal[1:]}
		if f.journal = c.opts.Journal(f.rec); f.journal != nil && f.journal.Intent != nil {
			pctx = context.WithValue(ctx, journalKey{}, f.journal.Intent)
		}
	}
	prep, err := fp.PrepareFiles(pctx, in, a)
	if err == nil {
		err = checkFiles(in, a, prep)
		if err != nil && prep != nil && prep.Lease != nil {
			err = errors.Join(err, releaseLease(ctx, prep.Lease))
		}
	}
	if err != nil {
		f.rec.Ended = time.Now()
		f.rec.Err = &CommandError{Kind: KindPrepare, Message: err.Error(), Cause: err}
		if f.journal != nil && f.journal.Finish != nil {
			f.journal.Finish(f.rec)
		}
		return nil, err
	}
	f.fs, f.lease = prep.FS, prep.Lease
	f.rec.LeaseID, f.rec.Started = prep.Lease.ID(), time.Now()
	if f.journal != nil && f.journal.Start != nil {
		f.journal.Start(f.rec)
	}
	f.ctx, f.cancel = context.WithCancelCause(ctx)
	f.stop = keepAlive(ctx, f.lease, c.opts.HeartbeatInterval, func(err error) {
		c.opts.Logger.Warn("files: lease heartbeat failed: the call ends", "lease", f.lease.ID(), "err", err)
		f.cancel(&heartbeatError{fmt.Errorf("lease %s: %w", f.lease.ID(), err)})
	})
	return f, nil
}

// checkFiles validates a provider's preparation against its request, as
// CheckTarget does a command's.
func checkFiles(in FilesInput, actor Actor, p *PreparedFiles) error {
	switch {
	case p == nil || p.FS == nil:
		return errors.New("sandbox: provider prepared no files")
	case p.Lease == nil:
		return errors.New("sandbox: provider prepared files without a lease")
	case p.Project != in.Project:
		return fmt.Errorf("sandbox: provider prepared the files of project %s/%d, not %s/%d", p.Project.Kind, p.Project.ProjectID, in.Project.Kind, in.Project.ProjectID)
	case p.Lease.AccountUserID() != actor.AccountUserID:
		return fmt.Errorf("sandbox: lease %s belongs to account %d, not the actor %d", p.Lease.ID(), p.Lease.AccountUserID(), actor.AccountUserID)
	case p.Lease.Kind() != LeaseFiles:
		return fmt.Errorf("sandbox: lease %s has kind %q, not %q", p.Lease.ID(), p.Lease.Kind(), LeaseFiles)
	}
	return nil
}

// Context is the context every call runs under: OpenFiles's, ended also
// when the lease is lost (its cause wraps ErrHeartbeat) and by Close. A
// transfer the caller drives itself (reading an opened file into a
// response) stops when it ends.
func (f *Files) Context() context.Context { return f.ctx }

// LeaseID returns the ID of the lease covering the calls.
func (f *Files) LeaseID() string { return f.lease.ID() }

// Close ends the files call: it records outcome in the journal (nil: the
// call succeeded; otherwise its failure) when the call was journaled,
// stops the heartbeat, ends Context and releases the lease. It returns the
// release's failure (a lease that expired meanwhile included), or nil. It
// is idempotent: later calls return the first one's result and record
// nothing.
func (f *Files) Close(outcome error) error {
	f.closeOnce.Do(func() {
		f.stop()
		f.cancel(errors.New("sandbox: files closed"))
		f.rec.Ended = time.Now()
		if outcome == nil {
			f.rec.Result = &CommandResult{Code: new(int)}
		} else {
			f.rec.Err = &CommandError{Kind: kindFiles, Message: outcome.Error(), Cause: outcome}
		}
		journaled := false
		f.releaseOnce.Do(func() {
			release := f.lease.Release
			if j := f.journal; j != nil && j.Release != nil && outcome == nil {
				// The end of a call that succeeded is written with the
				// release.
				release = func(ctx context.Context) error {
					var err error
					journaled, err = j.Release(ctx, f.lease, f.rec)
					return err
				}
			}
			f.releaseErr = releaseWith(context.Background(), f.lease, release)
		})
		f.closeErr = f.releaseErr
		if f.closeErr != nil && outcome == nil {
			f.rec.Result = nil
			f.rec.Err = &CommandError{Kind: KindCleanup, Message: f.closeErr.Error(), Cleanup: f.closeErr}
		}
		if j := f.journal; !journaled && j != nil && j.Finish != nil {
			j.Finish(f.rec)
		}
	})
	return f.closeErr
}

// ReleaseLease ends the lease before Close, for a call that holds the Files
// but no longer uses the project's machine (an open watch: its events need
// no machine, and its lease would keep the project from being deleted):
// it stops the heartbeat and releases the lease, and returns the release's
// failure (which Close then returns again). Context does not end; calls
// still work where they need no lease. It is idempotent.
func (f *Files) ReleaseLease() error {
	f.releaseOnce.Do(func() {
		f.stop()
		f.releaseErr = releaseLease(context.Background(), f.lease)
	})
	return f.releaseErr
}

// Open is FileSystem.Open under Context.
func (f *Files) Open(p string) (*os.File, FileInfo, error) { return f.fs.Open(f.ctx, p) }

// Write is FileSystem.Write under Context.
func (f *Files) Write(p string, mode uint32, src io.Reader) (int64, error) {
	return f.fs.Write(f.ctx, p, mode, src)
}

// Stat is FileSystem.Stat under Context.
func (f *Files) Stat(p string) (FileInfo, error) { return f.fs.Stat(f.ctx, p) }

// List is FileSystem.List under Context.
func (f *Files) List(p string, depth, limit int) (FileInfo, []FileInfo, bool, error) {
	return f.fs.List(f.ctx, p, depth, limit)
}

// Mkdir is FileSystem.Mkdir under Context.
func (f *Files) Mkdir(p string, mode uint32, parents bool) (FileInfo, error) {
	return f.fs.Mkdir(f.ctx, p, mode, parents)
}

// Remove is FileSystem.Remove under Context.
func (f *Files) Remove(p string, recursive bool) error { return f.fs.Remove(f.ctx, p, recursive) }

// Rename is FileSystem.Rename under Context.
func (f *Files) Rename(from, to string) error { return f.fs.Rename(f.ctx, from, to) }

// Watch is FileSystem.Watch under Context.
func (f *Files) Watch(p string, recursive bool) (*os.File, []FileInfo, error) {
	return f.fs.Watch(f.ctx, p, recursive)
}

// AddWatch is FileSystem.AddWatch under Context.
func (f *Files) AddWatch(ino *os.File, p string) ([]FileInfo, error) {
	return f.fs.AddWatch(f.ctx, ino, p)
}
