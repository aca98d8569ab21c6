package provider

import (
	"context"
	"fmt"
	"io"
	"os"
	"path"
	"strings"
	"time"

	"github.com/corral-sandbox/corral/internal/errdefs"
	"github.com/corral-sandbox/corral/internal/fsop"
	"github.com/corral-sandbox/corral/machine"
	"github.com/corral-sandbox/corral/sandbox"
)

// hostFiles is a host project's workspace, reached as the project's
// confined user (user; nil: this process's own) under its root: the same
// resolution as a machine's (package fsop), with the workspace as the root
// and its guest name, /workspace, as the only absolute prefix. Its errors
// are classified (fsop.Classify).
type hostFiles struct {
	root string
	user *fsop.Cred
}

var _ sandbox.FileSystem = (*hostFiles)(nil)

// rel maps a guest path to one relative to the workspace.
func (h *hostFiles) rel(p string) (string, error) {
	if !path.IsAbs(p) {
		return p, fsop.Clean(p)
	}
	root := DisplayRoot
	switch {
	case p == root:
		return "", nil
	case strings.HasPrefix(p, root+"/"):
		rel := p[len(root)+1:]
		return rel, fsop.Clean(rel)
	}
	return "", fmt.Errorf("%w: a host project's paths are under %s", fsop.ErrBadPath, root)
}

func (h *hostFiles) info(s fsop.Stat) sandbox.FileInfo {
	p := DisplayRoot
	if s.Rel != "" {
		p += "/" + s.Rel
	}
	name := s.Name
	if s.Rel == "" {
		name = path.Base(DisplayRoot)
	}
	return sandbox.FileInfo{Name: name, Path: p, Type: s.Type, Size: s.Size, Mode: s.Mode, MTime: time.Unix(0, s.MTime), Target: s.Target}
}

// run resolves p and runs f as the project's user with a root of the
// workspace.
func (h *hostFiles) run(p string, f func(root *fsop.Root, rel string) error) error {
	rel, err := h.rel(p)
	if err != nil {
		return fsop.Classify(err)
	}
	root, err := fsop.OpenRoot(h.root)
	if err != nil {
		return fsop.Classify(err)
	}
	defer root.Close()
	return fsop.Classify(fsop.Run(h.user, func() error { return f(root, rel) }))
}

func (h *hostFiles) Open(_ context.Context, p string) (f *os.File, fi sandbox.FileInfo, err error) {
	err = h.run(p, func(root *fsop.Root, rel string) error {
		var st fsop.Stat
		f, st, err = root.Read(rel)
		fi = h.info(st)
		return err
	})
	return f, fi, err
}

func (h *hostFiles) Write(_ context.Context, p string, mode uint32, src io.Reader) (int64, error) {
	if mode == 0 {
		mode = 0o644
	}
	var f *os.File
	var tmp string
	err := h.run(p, func(root *fsop.Root, rel string) error {
		var err error
		if f, tmp, err = root.Create(rel); err != nil {
			return err
		}
		if err := fsop.Chmod(f, mode); err != nil {
			f.Close()
			_ = root.Remove(tmp, false)
			return err
		}
		return nil
	})
	if err != nil {
		return 0, err
	}
	n, err := machine.CopyInto(f, src)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = h.run(p, func(root *fsop.Root, rel string) error { return root.Rename(tmp, rel) })
	}
	if err != nil {
		_ = h.run(p, func(root *fsop.Root, _ string) error { return root.Remove(tmp, false) })
		if fsop.Code(err) == fsop.CodeNoSpace {
			return n, errdefs.Wrap(fmt.Errorf("writing %s: the disk is full: %w", p, err), errdefs.NoSpace)
		}
	}
	return n, fsop.Classify(err)
}

func (h *hostFiles) Stat(_ context.Context, p string) (fi sandbox.FileInfo, err error) {
	err = h.run(p, func(root *fsop.Root, rel string) error {
		st, err := root.Stat(rel)
		fi = h.info(st)
		return err
	})
	return fi, err
}

func (h *hostFiles) List(_ context.Context, p string, depth, limit int) (dir sandbox.FileInfo, es []sandbox.FileInfo, trunc bool, err error) {
	err = h.run(p, func(root *fsop.Root, rel string) error {
		st, err := root.Stat(rel)
		if err != nil {
			return err
		}
		dir = h.info(st)
		trunc, err = root.List(rel, depth, limit, func(s fsop.Stat) error {
			es = append(es, h.info(s))
			return nil
		})
		return err
	})
	return dir, es, trunc, err
}

func (h *hostFiles) Mkdir(_ context.Context, p string, mode uint32, parents bool) (fi sandbox.FileInfo, err error) {
	err = h.run(p, func(root *fsop.Root, rel string) error {
		if err := root.Mkdir(rel, mode, parents); err != nil {
			return err
		}
		st, err := root.Stat(rel)
		fi = h.info(st)
		return err
	})
	return fi, err
}

func (h *hostFiles) Remove(_ context.Context, p string, recursive bool) error {
	return h.run(p, func(root *fsop.Root, rel string) error { return root.Remove(rel, recursive) })
}

func (h *hostFiles) Rename(_ context.Context, from, to string) error {
	toRel, err := h.rel(to)
	if err != nil {
		return fsop.Classify(err)
	}
	return h.run(from, func(root *fsop.Root, rel string) error { return root.Rename(rel, toRel) })
}

func (h *hostFiles) Watch(_ context.Context, p string, recursive bool) (*os.File, []sandbox.FileInfo, error) {
	// Made as the project's user, so that the kernel charges the instance
	// (and its watches) to that user's fs.inotify quotas, never to host
	// root's, which every root daemon of the host shares.
	var ino *os.File
	err := h.run(p, func(*fsop.Root, string) error {
		var err error
		ino, err = fsop.NewInotify()
		return err
	})
	if err != nil {
		return nil, nil, err
	}
	ws, err := h.addWatches(ino, p, recursive)
	if err != nil {
		ino.Close()
		return nil, nil, err
	}
	return ino, ws, nil
}

func (h *hostFiles) AddWatch(_ context.Context, ino *os.File, p string) ([]sandbox.FileInfo, error) {
	return h.addWatches(ino, p, true)
}

func (h *hostFiles) addWatches(ino *os.File, p string, recursive bool) (ws []sandbox.FileInfo, err error) {
	err = h.run(p, func(root *fsop.Root, rel string) error {
		_, err := root.Watch(int(ino.Fd()), rel, recursive, 8192, func(wd int, r string) error {
			fi := h.info(fsop.Stat{Rel: r, Name: path.Base("/" + r), Type: "dir"})
			fi.WD = wd
			ws = append(ws, fi)
			return nil
		})
		return err
	})
	return ws, err
}
