package daemon

// The files API: a project's files, read, written and watched as a user of
// the project (a managed project's machine user, a host project's
// confined user).
//
//	GET    /v1/projects/{id}/files?path=&user=          the bytes (streamed)
//	PUT    /v1/projects/{id}/files?path=&mode=&user=    replace atomically
//	GET    /v1/projects/{id}/files/stat?path=&user=     FileJSON
//	GET    /v1/projects/{id}/files/list?path=&depth=&limit=&user=
//	POST   /v1/projects/{id}/files/mkdir   {path, mode, parents, user}
//	POST   /v1/projects/{id}/files/remove  {path, recursive, user}
//	POST   /v1/projects/{id}/files/rename  {from, to, user}
//	GET    /v1/projects/{id}/files/watch?path=&recursive=1&user=  WebSocket
//
// Members only (401 anonymous, 403 others), checked against the store
// before anything else. Each call holds a lease of kind "files" while it
// runs; PUT, mkdir, remove and rename are journaled.

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"path"
	"strconv"
	"strings"
	"syscall"

	"github.com/coder/websocket"
	"golang.org/x/sys/unix"

	"github.com/corral-sandbox/corral/api"
	"github.com/corral-sandbox/corral/provider"
	"github.com/corral-sandbox/corral/sandbox"
)

// File API bounds.
const (
	// MaxListEntries bounds a list's entries (a request's limit may be
	// lower).
	MaxListEntries = 10000
	// MaxListDepth bounds a list's depth.
	MaxListDepth = 32
	// maxFilePath bounds a path parameter.
	maxFilePath = 4096
	// MaxAccountFileCalls bounds the files API calls (transfers, listings,
	// watches) in flight at once per account that is not an admin, and
	// MaxFileCalls those of the whole daemon: each holds a lease, a
	// goroutine, descriptors and a copy buffer (429 beyond).
	MaxAccountFileCalls = 32
	MaxFileCalls        = 512
)

// fileInfo is what the files API reports of a file.
type fileInfo = sandbox.FileInfo

// pathParam is a request's path parameter, with "." (the workspace, as
// relative paths are taken from it) and a leading "./" accepted as shells
// and SDKs write them.
func pathParam(q url.Values) string {
	p := q.Get("path")
	for strings.HasPrefix(p, "./") {
		p = strings.TrimLeft(p[2:], "/")
	}
	if p == "." {
		return provider.DisplayRoot
	}
	return p
}

// checkFilePath refuses a path parameter that is not a clean guest path:
// 400, before anything is contacted.
func checkFilePath(p string) error {
	if p == "" {
		return apiErr(http.StatusBadRequest, KindInvalid, "a path is required")
	}
	if len(p) > maxFilePath || strings.IndexByte(p, 0) >= 0 {
		return apiErr(http.StatusBadRequest, KindInvalid, "path is too long or holds a NUL byte")
	}
	rel := strings.TrimPrefix(p, "/")
	if p != "/" && (path.Clean(p) != p || strings.HasSuffix(p, "/")) {
		return apiErr(http.StatusBadRequest, KindInvalid, "path %q is not clean (no \".\", \"..\", empty components or trailing slash)", p)
	}
	for _, c := range strings.Split(rel, "/") {
		if c == ".." || c == "." {
			return apiErr(http.StatusBadRequest, KindInvalid, "path %q has a %q component: paths may not climb", p, c)
		}
	}
	return nil
}

// fileCall is one authorized files request: the project's files under a
// lease of their own (sandbox.Control.OpenFiles), and the call's
// reservation.
type fileCall struct {
	*sandbox.Files
	a    *App
	done func() // gives the call's reservation back (startFileCall), untracks
	// ctx is the Files' context: the request's, ended when the lease's
	// heartbeat fails (no transfer outlives its lease) and, with a
	// *sessionEnded cause, when the caller lost its authorization
	// (trackSession).
	ctx context.Context
}

// beginFiles authorizes the request (member of the {id} project), then
// opens the project's files as user through the sandbox control (a lease
// of kind "files"). A write (verb and paths) is journaled.
func (a *App) beginFiles(r *http.Request, user string, verb string, paths ...string) (*fileCall, error) {
	acct, proj, _, err := a.projectMember(r)
	if err != nil {
		return nil, err
	}
	for _, p := range paths {
		if err := checkFilePath(p); err != nil {
			return nil, err
		}
	}
	in := sandbox.FilesInput{Project: sandbox.ProjectRef{Kind: sandbox.ProjectKind(proj.Kind), ProjectID: proj.ID}, User: user}
	if err := in.Validate(); err != nil {
		return nil, apiErr(http.StatusBadRequest, KindInvalid, "%v", err)
	}
	if verb != "" {
		in.Journal = append([]string{"files", verb}, paths...)
	}
	ctl, err := a.core.Sandbox()
	if err != nil {
		return nil, err
	}
	done, err := a.fileCalls.start(acct, a.isAdmin(acct))
	if err != nil {
		return nil, err
	}
	// Registered like a session: a watch or a long transfer ends when
	// the token is revoked or the member removed.
	ctx, untrack := a.trackSession(r.Context(), r, proj.ID)
	f, err := ctl.OpenFiles(ctx, in, &sandbox.Actor{AccountUserID: acct.ID})
	if err != nil {
		untrack()
		done()
		return nil, err
	}
	return &fileCall{Files: f, a: a, done: func() { untrack(); done() }, ctx: f.Context()}, nil
}

// end closes the call's files (journaling the outcome of a write, err;
// releasing the lease) and gives its reservation back. A release that
// fails is the call's failure: end returns it (err, if not nil, first).
func (fc *fileCall) end(err error) error {
	defer fc.done()
	if rerr := fc.Close(err); rerr != nil {
		fc.a.log.Warn("files: release lease", "lease", fc.LeaseID(), "err", rerr)
		return errors.Join(err, rerr)
	}
	return err
}

func fileJSON(fi fileInfo) api.File {
	return api.File{Name: fi.Name, Path: fi.Path, Type: fi.Type, Size: fi.Size,
		Mode: fmt.Sprintf("%04o", fi.Mode), MTime: fi.MTime.UTC(), Target: fi.Target}
}

// parseMode parses an octal mode ("0644"); empty is 0 (the default).
func parseMode(s string, mask uint32) (uint32, error) {
	if s == "" {
		return 0, nil
	}
	v, err := strconv.ParseUint(s, 8, 32)
	if err != nil || uint32(v)&^mask != 0 {
		return 0, apiErr(http.StatusBadRequest, KindInvalid, "mode %q is not an octal mode within %04o", s, mask)
	}
	return uint32(v), nil
}

// getFile serves GET …/files: the file's bytes, streamed.
func (a *App) getFile(w http.ResponseWriter, r *http.Request) error {
	q := r.URL.Query()
	p := pathParam(q)
	fc, err := a.beginFiles(r, q.Get("user"), "", p)
	if err != nil {
		return err
	}
	f, fi, err := fc.Open(p)
	if err != nil {
		return fc.end(err)
	}
	// The body is on its way: a failed release is logged (end), as the
	// client can no longer be told.
	defer fc.end(nil)
	defer f.Close()
	h := w.Header()
	h.Set("Content-Type", "application/octet-stream")
	h.Set("Content-Length", strconv.FormatInt(fi.Size, 10))
	h.Set("Last-Modified", fi.MTime.UTC().Format(http.TimeFormat))
	h.Set("X-Corral-Mode", fmt.Sprintf("%04o", fi.Mode))
	// Exactly the size announced: a file that grew meanwhile is cut there,
	// one that shrank ends the response short (the client sees it).
	if _, onUnix := r.Context().Value(http.LocalAddrContextKey).(*net.UnixAddr); onUnix && fi.Size >= sendfileMin {
		if sendfileBody(fc.ctx, w, f, fi.Size) {
			return nil
		}
	}
	w.WriteHeader(http.StatusOK)
	// In large writes (measured: the ResponseWriter's ReadFrom moves a
	// file in small steps on a Unix socket; on TCP it would sendfile, but
	// TLS and proxies in front make that moot).
	_, _ = io.CopyBuffer(writerOnly{w}, ctxReader{fc.ctx, io.LimitReader(f, fi.Size)}, make([]byte, fileCopyBuffer))
	return nil
}

// sendfileMin is the size from which a GET on the Unix socket is sent with
// sendfile(2) on the hijacked connection.
const sendfileMin = 1 << 20

// sendfileBody answers a GET on a Unix socket with sendfile(2): Go's
// UnixConn has no ReadFrom, so the ResponseWriter would copy every byte
// through user space twice. It hijacks the connection, writes the status
// line and w's headers with "Connection: close", sends size bytes of f
// and closes the connection. It reports false, having written nothing,
// when the connection cannot be hijacked.
func sendfileBody(ctx context.Context, w http.ResponseWriter, f *os.File, size int64) bool {
	conn, brw, err := http.NewResponseController(w).Hijack()
	if err != nil {
		return false
	}
	defer conn.Close()
	h := w.Header().Clone()
	h.Set("Connection", "close")
	if _, err := io.WriteString(brw, "HTTP/1.1 200 OK\r\n"); err != nil {
		return true
	}
	if h.Write(brw) != nil {
		return true
	}
	if _, err := brw.WriteString("\r\n"); err != nil || brw.Flush() != nil {
		return true
	}
	sc, ok := conn.(syscall.Conn)
	if !ok {
		_, _ = io.CopyBuffer(conn, io.LimitReader(f, size), make([]byte, fileCopyBuffer))
		return true
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return true
	}
	in := int(f.Fd())
	for sent := int64(0); sent < size && ctx.Err() == nil; {
		var n int
		var serr error
		werr := raw.Write(func(out uintptr) bool {
			n, serr = unix.Sendfile(int(out), in, nil, int(min(size-sent, fileCopyBuffer*4)))
			return serr != unix.EAGAIN
		})
		if werr != nil || serr != nil || n == 0 {
			return true
		}
		sent += int64(n)
	}
	return true
}

// fileCopyBuffer is the buffer of a GET's copy.
const fileCopyBuffer = 1 << 20

// ctxReader ends a transfer once ctx is done (its lease lost).
type ctxReader struct {
	ctx context.Context
	r   io.Reader
}

func (c ctxReader) Read(p []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, context.Cause(c.ctx)
	}
	return c.r.Read(p)
}

// writerOnly hides everything of a Writer but Write (io.CopyBuffer then
// uses the buffer it is given).
type writerOnly struct{ io.Writer }

// putFile serves PUT …/files: the body replaces the file atomically.
func (a *App) putFile(w http.ResponseWriter, r *http.Request) error {
	q := r.URL.Query()
	p := pathParam(q)
	mode, err := parseMode(q.Get("mode"), 0o777)
	if err != nil {
		return err
	}
	mkdirs := q.Get("mkdirs")
	if mkdirs != "" && mkdirs != "0" && mkdirs != "1" {
		return apiErr(http.StatusBadRequest, KindInvalid, "mkdirs %q is not 0 or 1", mkdirs)
	}
	fc, err := a.beginFiles(r, q.Get("user"), "put", p)
	if err != nil {
		return err
	}
	if dir := path.Dir(p); mkdirs == "1" && dir != "." && dir != "/" {
		// As mkdir -p, as the request's user: what exists is kept.
		if _, err := fc.Mkdir(dir, 0o755, true); err != nil {
			return fc.end(err)
		}
	}
	_, err = fc.Write(p, mode, ctxReader{fc.ctx, r.Body})
	if err == nil {
		var fi fileInfo
		if fi, err = fc.Stat(p); err == nil {
			if err := fc.end(nil); err != nil {
				return err
			}
			writeJSON(w, http.StatusOK, fileJSON(fi))
			return nil
		}
	}
	return fc.end(err)
}

// statFile serves GET …/files/stat.
func (a *App) statFile(w http.ResponseWriter, r *http.Request) error {
	q := r.URL.Query()
	p := pathParam(q)
	fc, err := a.beginFiles(r, q.Get("user"), "", p)
	if err != nil {
		return err
	}
	fi, err := fc.Stat(p)
	if err := fc.end(err); err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, fileJSON(fi))
	return nil
}

// listFiles serves GET …/files/list.
func (a *App) listFiles(w http.ResponseWriter, r *http.Request) error {
	q := r.URL.Query()
	p := pathParam(q)
	if p == "" {
		p = provider.DisplayRoot
	}
	depth, limit := 1, MaxListEntries
	if s := q.Get("depth"); s != "" {
		d, err := strconv.Atoi(s)
		if err != nil || d < 1 || d > MaxListDepth {
			return apiErr(http.StatusBadRequest, KindInvalid, "depth %q is not between 1 and %d", s, MaxListDepth)
		}
		depth = d
	}
	if s := q.Get("limit"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 || n > MaxListEntries {
			return apiErr(http.StatusBadRequest, KindInvalid, "limit %q is not between 1 and %d", s, MaxListEntries)
		}
		limit = n
	}
	fc, err := a.beginFiles(r, q.Get("user"), "", p)
	if err != nil {
		return err
	}
	dir, entries, trunc, err := fc.List(p, depth, limit)
	if err := fc.end(err); err != nil {
		return err
	}
	out := api.FileList{Dir: fileJSON(dir), Entries: make([]api.File, len(entries)), Truncated: trunc}
	for i, e := range entries {
		out.Entries[i] = fileJSON(e)
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

// makeDirectory serves POST …/files/mkdir.
func (a *App) makeDirectory(w http.ResponseWriter, r *http.Request) error {
	if _, _, _, err := a.projectMember(r); err != nil {
		return err
	}
	var req api.FileMkdirRequest
	if err := a.decodeBody(w, r, &req); err != nil {
		return err
	}
	mode, err := parseMode(req.Mode, 0o1777)
	if err != nil {
		return err
	}
	fc, err := a.beginFiles(r, req.User, "mkdir", req.Path)
	if err != nil {
		return err
	}
	fi, err := fc.Mkdir(req.Path, mode, req.Parents)
	if err := fc.end(err); err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, fileJSON(fi))
	return nil
}

// removeFile serves POST …/files/remove.
func (a *App) removeFile(w http.ResponseWriter, r *http.Request) error {
	if _, _, _, err := a.projectMember(r); err != nil {
		return err
	}
	var req api.FileRemoveRequest
	if err := a.decodeBody(w, r, &req); err != nil {
		return err
	}
	fc, err := a.beginFiles(r, req.User, "remove", req.Path)
	if err != nil {
		return err
	}
	if err := fc.end(fc.Remove(req.Path, req.Recursive)); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// renameFile serves POST …/files/rename.
func (a *App) renameFile(w http.ResponseWriter, r *http.Request) error {
	if _, _, _, err := a.projectMember(r); err != nil {
		return err
	}
	var req api.FileRenameRequest
	if err := a.decodeBody(w, r, &req); err != nil {
		return err
	}
	fc, err := a.beginFiles(r, req.User, "rename", req.From, req.To)
	if err != nil {
		return err
	}
	if err := fc.end(fc.Rename(req.From, req.To)); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// watchFiles serves GET …/files/watch: a WebSocket of FileEvent text
// messages, in the kernel's order, until the client closes it (or the
// watched directory goes).
func (a *App) watchFiles(w http.ResponseWriter, r *http.Request) error {
	q := r.URL.Query()
	p := pathParam(q)
	if p == "" {
		p = provider.DisplayRoot
	}
	recursive := q.Get("recursive") == "1" || q.Get("recursive") == "true"
	fc, err := a.beginFiles(r, q.Get("user"), "", p)
	if err != nil {
		return err
	}
	ino, watches, err := fc.Watch(p, recursive)
	if err != nil {
		return fc.end(err)
	}
	defer ino.Close()
	// An open watch is no use of the machine: its lease ends now, before
	// the upgrade, so that it keeps no owner from deleting the project,
	// not even one that saw the watch open and close at once (the session
	// checker ends the watch then: the project has no members).
	if err := fc.ReleaseLease(); err != nil {
		a.log.Warn("files: release a watch's lease", "lease", fc.LeaseID(), "err", err)
	}
	conn, err := websocket.Accept(w, r, nil)
	if err != nil {
		fc.end(err)
		return &APIError{Status: http.StatusBadRequest, Kind: KindInvalid, Message: "WebSocket upgrade failed", Cause: err}
	}
	defer fc.end(nil)
	if !a.enterSession() { // Close waits for watches as for sessions
		conn.Close(websocket.StatusGoingAway, "the daemon is shutting down")
		return nil
	}
	defer a.wg.Done()
	dirs := make(map[int32]string, len(watches))
	for _, wi := range watches {
		dirs[int32(wi.WD)] = wi.Path
	}
	ctx, cancel := context.WithCancel(a.ctx)
	defer cancel()
	stopLease := context.AfterFunc(fc.ctx, cancel)
	defer stopLease()
	stopWatch := context.AfterFunc(ctx, func() { ino.Close() })
	defer stopWatch()
	rctx, stopRead := context.WithCancel(context.Background())
	defer stopRead()
	go func() {
		// The client's messages are not read for anything but its close
		// (with a context of its own: one that ends closes the connection
		// before the close below could say why).
		_, _, _ = conn.Read(rctx)
		cancel()
	}()
	send := func(ev api.FileEvent) bool {
		b, _ := json.Marshal(ev)
		return conn.Write(ctx, websocket.MessageText, b) == nil
	}
	buf := make([]byte, 64<<10)
	for {
		n, err := ino.Read(buf)
		if err != nil {
			break
		}
		var pendingFrom string
		var pendingCookie uint32
		var pendingDir bool
		flush := func() bool {
			if pendingFrom != "" {
				ok := send(api.FileEvent{Type: "delete", Path: pendingFrom, IsDir: pendingDir})
				pendingFrom = ""
				return ok
			}
			return true
		}
		for off := 0; off+unix.SizeofInotifyEvent <= n; {
			wd := int32(binary.NativeEndian.Uint32(buf[off:]))
			mask := binary.NativeEndian.Uint32(buf[off+4:])
			cookie := binary.NativeEndian.Uint32(buf[off+8:])
			nl := int(binary.NativeEndian.Uint32(buf[off+12:]))
			name := strings.TrimRight(string(buf[off+unix.SizeofInotifyEvent:off+unix.SizeofInotifyEvent+nl]), "\x00")
			off += unix.SizeofInotifyEvent + nl
			dir, known := dirs[wd]
			if mask&unix.IN_Q_OVERFLOW != 0 {
				if !send(api.FileEvent{Type: "overflow"}) {
					return nil
				}
				continue
			}
			if !known {
				continue
			}
			if mask&unix.IN_IGNORED != 0 {
				delete(dirs, wd)
				continue
			}
			full := path.Join(dir, name)
			isDir := mask&unix.IN_ISDIR != 0
			var ev api.FileEvent
			switch {
			case mask&unix.IN_MOVED_TO != 0 && pendingFrom != "" && cookie == pendingCookie:
				ev = api.FileEvent{Type: "rename", From: pendingFrom, Path: full, IsDir: isDir}
				pendingFrom = ""
			case mask&unix.IN_MOVED_FROM != 0:
				if !flush() {
					return nil
				}
				pendingFrom, pendingCookie, pendingDir = full, cookie, isDir
				continue
			case mask&(unix.IN_CREATE|unix.IN_MOVED_TO) != 0:
				ev = api.FileEvent{Type: "create", Path: full, IsDir: isDir}
			case mask&unix.IN_MODIFY != 0:
				ev = api.FileEvent{Type: "modify", Path: full}
			case mask&unix.IN_DELETE != 0:
				ev = api.FileEvent{Type: "delete", Path: full, IsDir: isDir}
			case mask&(unix.IN_DELETE_SELF|unix.IN_MOVE_SELF) != 0:
				continue
			default:
				continue
			}
			if !flush() || !send(ev) {
				return nil
			}
			if recursive && isDir && (ev.Type == "create" || ev.Type == "rename") {
				added, err := fc.AddWatch(ino, ev.Path)
				if err != nil {
					a.log.Debug("files: watch a new directory", "path", ev.Path, "err", err)
				}
				for _, wi := range added {
					// Directories made inside it before its watch began
					// had no event: they are reported now.
					if _, known := dirs[int32(wi.WD)]; !known && wi.Path != ev.Path {
						if !send(api.FileEvent{Type: "create", Path: wi.Path, IsDir: true}) {
							return nil
						}
					}
					dirs[int32(wi.WD)] = wi.Path
				}
			}
		}
		if !flush() {
			return nil
		}
	}
	if _, ended := context.Cause(fc.ctx).(*sessionEnded); ended {
		conn.Close(sessionCloseStatus(fc.ctx))
		return nil
	}
	conn.Close(websocket.StatusNormalClosure, "")
	return nil
}
