package worker

// Files (wire.FeatureFiles): the worker resolves a request's path inside
// the project's machine as the request's user and either answers with
// metadata or passes the opened descriptor to the client, which reads and
// writes the bytes itself.
//
//	client                     worker (conn)               thread (fsop.Run)
//	  |-- file-request ---------->| acquire the machine;
//	  |                           | user → ids (init lookup);
//	  |                           | root = /proc/<init>/root --->| fsuid/fsgid/groups
//	  |                           |                               | of the user, no caps;
//	  |                           |<-----------------------------| openat2 IN_ROOT|NO_MAGICLINKS
//	  |<-- file-entries … --------|
//	  |<-- file-opened [fd] | file-result | error

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path"
	"strconv"
	"strings"
	"sync"

	"github.com/corral-sandbox/corral/internal/fsop"
	"github.com/corral-sandbox/corral/wire"
	"github.com/corral-sandbox/corral/worker/internal/ctl"
)

// File request bounds: the entries of a list and the watches of a watch
// unless the request asks for fewer.
const (
	maxListEntries = 100000
	maxWatches     = 8192
	// entriesFrameBytes is how much JSON of entries one file-entries
	// frame holds, below wire.MaxFrame.
	entriesFrameBytes = 48 << 10
)

// goFiles runs a file request off the connection's goroutine: it may wait
// for a machine to start and walk a tree.
func (c *conn) goFiles(f func()) {
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
		f()
	}()
}

// guestRel turns a request's guest path (absolute, or relative to the
// workspace) into a path relative to the machine's root.
func guestRel(p string) (string, error) {
	if p == "" {
		return "", fmt.Errorf("%w: empty path", fsop.ErrBadPath)
	}
	if !path.IsAbs(p) {
		p = GuestWorkspace + "/" + p
	}
	rel := strings.TrimPrefix(p, "/")
	if p == "/" {
		rel = ""
	}
	if err := fsop.Clean(rel); err != nil {
		return "", err
	}
	return rel, nil
}

// fileError is the error frame of a failed file request.
func fileError(id string, err error) *wire.Error {
	var r *rejection
	if errors.As(err, &r) {
		return &wire.Error{ID: id, Code: r.code, Message: r.msg}
	}
	return &wire.Error{ID: id, Code: fsop.Code(err), Message: err.Error()}
}

// fileCred returns the host credentials of user (empty: the machine's
// default user) in m.
func (m *machine) fileCred(user string) (*fsop.Cred, error) {
	if code, msg := checkUser(user); code != "" {
		return nil, &rejection{code, msg}
	}
	if user == "" {
		user = m.defaultUser
	}
	var cred *ctl.Cred
	if user == "" {
		cred = &ctl.Cred{UID: GuestUID, GID: GuestGID}
	} else {
		var err error
		if cred, err = m.lookupUser(user); err != nil {
			return nil, err
		}
	}
	host := func(id uint32) (uint32, error) {
		if id >= RangeSize {
			return 0, &rejection{wire.CodeBadUser, fmt.Sprintf("guest id %d is not mapped", id)}
		}
		return m.hostUID + id, nil
	}
	c := fsop.Cred{Override: cred.UID == 0}
	var err error
	if c.UID, err = host(cred.UID); err != nil {
		return nil, err
	}
	if c.GID, err = host(cred.GID); err != nil {
		return nil, err
	}
	for _, g := range cred.Groups {
		hg, err := host(g)
		if err != nil {
			continue
		}
		c.Groups = append(c.Groups, hg)
	}
	return &c, nil
}

// fileRoot acquires p's machine and returns it with the user's
// credentials and a descriptor of its root; the caller releases the
// machine and closes the root.
func (c *conn) fileRoot(p wire.Project, user string) (*machine, *fsop.Cred, *fsop.Root, error) {
	// As a session: a file request starts the machine if none runs and
	// keeps it (and its limits) while it runs.
	lim := c.w.resolve(p.Limits)
	mach, err := c.w.acquire(p.ID, p.Workspace, p.Image, true, lim)
	if err != nil {
		var r *rejection
		if !errors.As(err, &r) {
			err = &rejection{wire.CodeMachineFailed, err.Error()}
		}
		return nil, nil, nil, err
	}
	mach.setLimits(lim)
	cred, err := mach.fileCred(user)
	if err != nil {
		mach.release(true)
		return nil, nil, nil, err
	}
	// The init's root is the machine's: its mount tree, seen from here.
	root, err := fsop.OpenRoot("/proc/" + strconv.Itoa(mach.initPID) + "/root")
	if err != nil {
		mach.release(true)
		return nil, nil, nil, &rejection{wire.CodeMachineFailed, err.Error()}
	}
	return mach, cred, root, nil
}

func guestStat(s fsop.Stat) wire.FileStat {
	return wire.FileStat{Name: s.Name, Path: "/" + s.Rel, Type: s.Type, Size: s.Size, Mode: s.Mode, MTime: s.MTime, Target: s.Target}
}

// sendEntries sends es in file-entries frames of bounded size.
func (c *conn) sendEntries(id string, es []wire.FileStat) {
	start, size := 0, 0
	for i, e := range es {
		b, _ := json.Marshal(e)
		if size+len(b) > entriesFrameBytes && i > start {
			c.send(&wire.FileEntries{ID: id, Entries: es[start:i]})
			start, size = i, 0
		}
		size += len(b) + 1
	}
	if start < len(es) {
		c.send(&wire.FileEntries{ID: id, Entries: es[start:]})
	}
}

// fileRequest answers a file-request.
func (c *conn) fileRequest(m *wire.FileRequest) {
	rel, err := guestRel(m.Path)
	if err != nil {
		c.send(fileError(m.ID, err))
		return
	}
	var to string
	if m.Op == wire.OpRename {
		if to, err = guestRel(m.To); err != nil {
			c.send(fileError(m.ID, err))
			return
		}
	}
	switch m.Op {
	case wire.OpRead, wire.OpCreate, wire.OpStat, wire.OpList, wire.OpMkdir, wire.OpRemove, wire.OpRename, wire.OpWatch:
	default:
		c.send(&wire.Error{ID: m.ID, Code: wire.CodeBadField, Message: fmt.Sprintf("unknown file op %q", m.Op)})
		return
	}
	mach, cred, root, err := c.fileRoot(m.Project, m.User)
	if err != nil {
		c.send(fileError(m.ID, err))
		return
	}
	defer mach.release(true)
	defer root.Close()

	var (
		reply   wire.Message
		file    *os.File
		entries []wire.FileStat
	)
	err = c.asUser(mach, cred, root, func(root *fsop.Root) error {
		entries = nil // a retry starts over
		switch m.Op {
		case wire.OpRead:
			f, st, err := root.Read(rel)
			if err != nil {
				return err
			}
			gs := guestStat(st)
			file, reply = f, &wire.FileOpened{ID: m.ID, Stat: &gs}
		case wire.OpCreate:
			f, tmp, err := root.Create(rel)
			if err != nil {
				return err
			}
			mode := m.Mode
			if mode == 0 {
				mode = 0o644
			}
			if err := fsop.Chmod(f, mode); err != nil {
				f.Close()
				_ = root.Remove(tmp, false)
				return err
			}
			file, reply = f, &wire.FileOpened{ID: m.ID, Tmp: "/" + tmp}
		case wire.OpStat:
			st, err := root.Stat(rel)
			if err != nil {
				return err
			}
			gs := guestStat(st)
			reply = &wire.FileResult{ID: m.ID, Stat: &gs}
		case wire.OpList:
			st, err := root.Stat(rel)
			if err != nil {
				return err
			}
			limit := m.Limit
			if limit <= 0 || limit > maxListEntries {
				limit = maxListEntries
			}
			trunc, err := root.List(rel, m.Depth, limit, func(s fsop.Stat) error {
				entries = append(entries, guestStat(s))
				return nil
			})
			if err != nil {
				return err
			}
			gs := guestStat(st)
			reply = &wire.FileResult{ID: m.ID, Stat: &gs, Truncated: trunc}
		case wire.OpMkdir:
			if err := root.Mkdir(rel, m.Mode, m.Recursive); err != nil {
				return err
			}
			st, err := root.Stat(rel)
			if err != nil {
				return err
			}
			gs := guestStat(st)
			reply = &wire.FileResult{ID: m.ID, Stat: &gs}
		case wire.OpRemove:
			if err := root.Remove(rel, m.Recursive); err != nil {
				return err
			}
			reply = &wire.FileResult{ID: m.ID}
		case wire.OpRename:
			if err := root.Rename(rel, to); err != nil {
				return err
			}
			reply = &wire.FileResult{ID: m.ID}
		case wire.OpWatch:
			ino, err := fsop.NewInotify()
			if err != nil {
				return err
			}
			trunc, err := root.Watch(int(ino.Fd()), rel, m.Recursive, watchLimit(m.Limit), func(wd int, r string) error {
				entries = append(entries, wire.FileStat{Name: path.Base("/" + r), Path: "/" + r, Type: "dir", WD: wd})
				return nil
			})
			if err != nil {
				ino.Close()
				return err
			}
			file, reply = ino, &wire.FileOpened{ID: m.ID, Truncated: trunc}
		}
		return nil
	})
	if err != nil {
		c.send(fileError(m.ID, err))
		return
	}
	c.sendEntries(m.ID, entries)
	if file != nil {
		c.send(reply, file)
		file.Close() // the client's now: the worker keeps no copy
		return
	}
	c.send(reply)
}

// asUser runs f as cred on root. Guest root's requests run without
// capabilities first; one refused for permission runs again with the
// override capabilities (fsop.Cred.Override) on root limited to the
// machine's ids, so that guest root reaches, as in the machine, the files
// of its namespace whatever their modes, and no file of the host's ids
// (an image's or the host's read-only binds) beyond what their modes grant
// everyone. A failed attempt changed nothing: every op fails before it
// modifies anything, or succeeds.
func (c *conn) asUser(m *machine, cred *fsop.Cred, root *fsop.Root, f func(*fsop.Root) error) error {
	if !cred.Override {
		return fsop.Run(cred, func() error { return f(root) })
	}
	plain := *cred
	plain.Override = false
	err := fsop.Run(&plain, func() error { return f(root) })
	if fsop.Code(err) != fsop.CodePermission {
		return err
	}
	return fsop.Run(cred, func() error { return f(root.Limited(m.hostUID, RangeSize)) })
}

func watchLimit(n int) int {
	if n <= 0 || n > maxWatches {
		return maxWatches
	}
	return n
}

// fileWatch answers a file-watch: watches added to the client's inotify
// descriptor (closed here once answered).
func (c *conn) fileWatch(m *wire.FileWatch, fds []int) {
	var once sync.Once
	ino := os.NewFile(uintptr(fds[0]), "inotify")
	done := func() { once.Do(func() { ino.Close() }) }
	defer done()
	rel, err := guestRel(m.Path)
	if err != nil {
		c.send(fileError(m.ID, err))
		return
	}
	mach, cred, root, err := c.fileRoot(m.Project, m.User)
	if err != nil {
		c.send(fileError(m.ID, err))
		return
	}
	defer mach.release(true)
	defer root.Close()
	var entries []wire.FileStat
	var trunc bool
	err = c.asUser(mach, cred, root, func(root *fsop.Root) error {
		var err error
		entries = nil
		trunc, err = root.Watch(int(ino.Fd()), rel, m.Recursive, watchLimit(m.Limit), func(wd int, r string) error {
			entries = append(entries, wire.FileStat{Name: path.Base("/" + r), Path: "/" + r, Type: "dir", WD: wd})
			return nil
		})
		return err
	})
	done()
	if err != nil {
		c.send(fileError(m.ID, err))
		return
	}
	c.sendEntries(m.ID, entries)
	c.send(&wire.FileResult{ID: m.ID, Truncated: trunc})
}
