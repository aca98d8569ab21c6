package machine

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"syscall"
	"time"

	"github.com/corral-sandbox/corral/sandbox"
	"github.com/corral-sandbox/corral/wire"
)

// Files of a machine (wire.FeatureFiles). Every call resolves its path
// inside project's machine (started if none runs) as user — a user name or
// numeric uid of the machine; empty is the machine's default user — with
// that user's ids and no capability, through openat2 with RESOLVE_IN_ROOT
// and RESOLVE_NO_MAGICLINKS against the machine's root: no symlink or ".."
// leads out of the machine, no /proc magic link is followed, and procfs,
// sysfs and cgroupfs are refused. Paths are absolute guest paths
// (/workspace/x, /home/corral/y) or relative to the workspace, and clean.
//
// A refusal or failure in the machine is a *RejectedError wrapping one of
// this package's file errors (ErrNotFound, ErrPermission, ErrBadPath, …,
// each classed for the HTTP edge; ErrBadUser and ErrBadRequest classed as
// invalid); a worker without the feature yields an error
// wrapping ErrUnsupported, with nothing sent; a lost connection wraps
// ErrInterrupted; ctx bounds each call (not the descriptors returned).
// Descriptors returned are the caller's alone: the worker keeps no copy.

// FileInfo describes a file of a machine (the sandbox's description of a
// project's file: Path is the guest path; WD a watch's descriptor).
type FileInfo = sandbox.FileInfo

func fileInfo(s *wire.FileStat) FileInfo {
	if s == nil {
		return FileInfo{}
	}
	return FileInfo{Name: s.Name, Path: s.Path, Type: s.Type, Size: s.Size, Mode: s.Mode,
		MTime: time.Unix(0, s.MTime), Target: s.Target, WD: s.WD}
}

func fileInfos(ss []wire.FileStat) []FileInfo {
	out := make([]FileInfo, len(ss))
	for i := range ss {
		out[i] = fileInfo(&ss[i])
	}
	return out
}

// fileFrame routes a file-entries, file-opened or file-result frame to
// its request's waiter.
func (c *conn) fileFrame(m wire.Message, files []*os.File) {
	switch m := m.(type) {
	case *wire.FileEntries:
		c.mu.Lock()
		if _, ok := c.dials[m.ID]; ok {
			if c.entries == nil {
				c.entries = make(map[string][]wire.FileStat)
			}
			c.entries[m.ID] = append(c.entries[m.ID], m.Entries...)
		}
		c.mu.Unlock()
	case *wire.FileOpened:
		if w := c.takeDial(m.ID); w != nil {
			w <- dialResult{file: files[0], msg: m}
			return
		}
		closeFiles(files)
	case *wire.FileResult:
		if w := c.takeDial(m.ID); w != nil {
			w <- dialResult{msg: m}
		}
	}
}

// takeEntries returns and forgets the entries collected for id.
func (c *conn) takeEntries(id string) []wire.FileStat {
	c.mu.Lock()
	defer c.mu.Unlock()
	es := c.entries[id]
	delete(c.entries, id)
	return es
}

// fileCall sends the file request req makes (with fd, if not nil) and
// returns the worker's answer: its message, descriptor and entries.
func (g *Gateway) fileCall(ctx context.Context, p Project, req func(id string, wp wire.Project) wire.Message, fd *os.File) (wire.Message, *os.File, []wire.FileStat, error) {
	c, err := g.connection(ctx)
	if err != nil {
		return nil, nil, nil, err
	}
	if !c.hello.Has(wire.FeatureFiles) {
		return nil, nil, nil, fmt.Errorf("%w: files (feature %q)", ErrUnsupported, wire.FeatureFiles)
	}
	project, err := p.wire(c.hello)
	if err != nil {
		return nil, nil, nil, err
	}
	id := g.newID("file")
	w := c.addDial(id)
	if w == nil {
		return nil, nil, nil, c.lossErr
	}
	m := req(id, project)
	if fd != nil {
		err = c.wc.Send(m, fd)
	} else {
		err = c.wc.Send(m)
	}
	if err != nil {
		c.removeDial(id)
		c.takeEntries(id)
		c.fail(err)
		return nil, nil, nil, fmt.Errorf("%w: %w", ErrInterrupted, err)
	}
	select {
	case r := <-w:
		es := c.takeEntries(id)
		if r.err != nil {
			return nil, nil, nil, r.err
		}
		return r.msg, r.file, es, nil
	case <-ctx.Done():
		if !c.removeDial(id) {
			if r := <-w; r.file != nil {
				r.file.Close()
			}
		}
		c.takeEntries(id)
		return nil, nil, nil, ctx.Err()
	}
}

// FileRequest names a file of a machine and whom to act as.
type FileRequest struct {
	Project Project
	// User is a user name or uid of the machine; empty is its default.
	User string
	// Path is an absolute guest path or one relative to the workspace.
	Path string
}

func (g *Gateway) fileOp(ctx context.Context, r FileRequest, fill func(*wire.FileRequest)) (wire.Message, *os.File, []wire.FileStat, error) {
	msg, f, es, err := g.fileCall(ctx, r.Project, func(id string, wp wire.Project) wire.Message {
		m := &wire.FileRequest{ID: id, Project: wp, User: r.User, Path: r.Path}
		fill(m)
		return m
	}, nil)
	if err != nil {
		return nil, nil, nil, fileErr(r, err)
	}
	return msg, f, es, nil
}

// fileErr wraps err with what was asked.
func fileErr(r FileRequest, err error) error {
	var rej *RejectedError
	if errors.As(err, &rej) {
		return fileRefusal(err) // its message names the path already
	}
	return fmt.Errorf("machine: file %s of project %d: %w", r.Path, r.Project.ID, err)
}

// OpenFile opens a regular file of the machine for reading (a final
// symlink followed inside the machine) and describes it.
func (g *Gateway) OpenFile(ctx context.Context, r FileRequest) (*os.File, FileInfo, error) {
	msg, f, _, err := g.fileOp(ctx, r, func(m *wire.FileRequest) { m.Op = wire.OpRead })
	if err != nil {
		return nil, FileInfo{}, err
	}
	return f, fileInfo(msg.(*wire.FileOpened).Stat), nil
}

// WriteFile replaces the file at r.Path atomically with what src yields:
// the worker creates a temporary file with mode (0 means 0644; only the
// permission bits count) beside it as r.User; the caller's process copies
// src into it, fsyncs it and has it renamed over r.Path, so that a reader
// sees the old file or the whole new one, never a part. A final symlink
// at r.Path is replaced, not written through; a directory there is
// refused (ErrIsDirectory). On any failure (src's error, a full
// disk: ErrNoSpace) the temporary file is removed and r.Path is
// unchanged. It returns the bytes written.
func (g *Gateway) WriteFile(ctx context.Context, r FileRequest, mode uint32, src io.Reader) (int64, error) {
	msg, f, _, err := g.fileOp(ctx, r, func(m *wire.FileRequest) { m.Op = wire.OpCreate; m.Mode = mode & 0o777 })
	if err != nil {
		return 0, err
	}
	tmp := msg.(*wire.FileOpened).Tmp
	n, err := copyInto(f, src)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		_, _, _, err = g.fileOp(ctx, r, func(m *wire.FileRequest) { m.Op = wire.OpRename; m.Path = tmp; m.To = r.Path })
	}
	if err != nil {
		// A fresh context: the caller's may be what ended the copy.
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		_, _, _, rerr := g.fileOp(cctx, FileRequest{Project: r.Project, User: r.User, Path: tmp}, func(m *wire.FileRequest) { m.Op = wire.OpRemove })
		cancel()
		if rerr != nil {
			g.log.Warn("temporary file left behind", "project", r.Project.ID, "path", tmp, "err", rerr)
		}
		if isNoSpace(err) {
			return n, rejected(wire.CodeNoSpace, fmt.Sprintf("writing %s: the project's disk is full", r.Path))
		}
		return n, err
	}
	return n, nil
}

// copyInto copies src into f in writes of up to 1 MiB (os.File's
// ReadFrom falls back to 32 KiB steps for a reader that is not a file or
// a socket, such as an HTTP request's body: measured 2-3× slower).
// CopyInto is copyInto, for the host files of the daemon.
func CopyInto(f *os.File, src io.Reader) (int64, error) { return copyInto(f, src) }

func copyInto(f *os.File, src io.Reader) (int64, error) {
	if rf, ok := src.(*os.File); ok {
		return f.ReadFrom(rf) // copy_file_range or splice
	}
	return io.CopyBuffer(struct{ io.Writer }{f}, src, make([]byte, 1<<20))
}

func isNoSpace(err error) bool {
	return errors.Is(err, errNoSpace) || errors.Is(err, errQuota)
}

// StatFile describes r.Path without following a final symlink.
func (g *Gateway) StatFile(ctx context.Context, r FileRequest) (FileInfo, error) {
	msg, _, _, err := g.fileOp(ctx, r, func(m *wire.FileRequest) { m.Op = wire.OpStat })
	if err != nil {
		return FileInfo{}, err
	}
	return fileInfo(msg.(*wire.FileResult).Stat), nil
}

// ListFiles describes directory r.Path and its entries to depth levels
// (below 1 means 1), in name order, depth first, at most limit of them (0:
// the worker's bound, 100,000); truncated reports that more were left
// out. Symlinks are listed, never followed.
func (g *Gateway) ListFiles(ctx context.Context, r FileRequest, depth, limit int) (dir FileInfo, entries []FileInfo, truncated bool, err error) {
	msg, _, es, err := g.fileOp(ctx, r, func(m *wire.FileRequest) { m.Op = wire.OpList; m.Depth = depth; m.Limit = limit })
	if err != nil {
		return FileInfo{}, nil, false, err
	}
	res := msg.(*wire.FileResult)
	return fileInfo(res.Stat), fileInfos(es), res.Truncated, nil
}

// Mkdir makes directory r.Path with mode (0 means 0755); with parents,
// missing parents too, and an existing directory is no error.
func (g *Gateway) Mkdir(ctx context.Context, r FileRequest, mode uint32, parents bool) (FileInfo, error) {
	msg, _, _, err := g.fileOp(ctx, r, func(m *wire.FileRequest) { m.Op = wire.OpMkdir; m.Mode = mode; m.Recursive = parents })
	if err != nil {
		return FileInfo{}, err
	}
	return fileInfo(msg.(*wire.FileResult).Stat), nil
}

// RemoveFile removes r.Path (a symlink itself, not its target); a
// non-empty directory only with recursive, which follows no symlink.
func (g *Gateway) RemoveFile(ctx context.Context, r FileRequest, recursive bool) error {
	_, _, _, err := g.fileOp(ctx, r, func(m *wire.FileRequest) { m.Op = wire.OpRemove; m.Recursive = recursive })
	return err
}

// RenameFile renames r.Path to `to` (rename(2)'s rules: a file at to is
// replaced).
func (g *Gateway) RenameFile(ctx context.Context, r FileRequest, to string) error {
	_, _, _, err := g.fileOp(ctx, r, func(m *wire.FileRequest) { m.Op = wire.OpRename; m.To = to })
	return err
}

// WatchFiles returns an inotify descriptor (non-blocking) watching
// directory r.Path and, with recursive, the directories below it (at most
// 8,192: then truncated), with each watch's descriptor and path. Events
// are read from the descriptor by the caller; directories that appear
// later are added with AddWatch.
func (g *Gateway) WatchFiles(ctx context.Context, r FileRequest, recursive bool) (*os.File, []FileInfo, bool, error) {
	msg, f, es, err := g.fileOp(ctx, r, func(m *wire.FileRequest) { m.Op = wire.OpWatch; m.Recursive = recursive })
	if err != nil {
		return nil, nil, false, err
	}
	return f, fileInfos(es), msg.(*wire.FileOpened).Truncated, nil
}

// AddWatch adds watches for directory r.Path (and below, with recursive)
// to ino, an inotify descriptor WatchFiles returned, as r.User.
func (g *Gateway) AddWatch(ctx context.Context, r FileRequest, ino *os.File, recursive bool) ([]FileInfo, bool, error) {
	msg, _, es, err := g.fileCall(ctx, r.Project, func(id string, wp wire.Project) wire.Message {
		return &wire.FileWatch{ID: id, Project: wp, User: r.User, Path: r.Path, Recursive: recursive}
	}, ino)
	if err != nil {
		return nil, false, fileErr(r, err)
	}
	return fileInfos(es), msg.(*wire.FileResult).Truncated, nil
}

var (
	errNoSpace = syscall.ENOSPC
	errQuota   = syscall.EDQUOT
)
