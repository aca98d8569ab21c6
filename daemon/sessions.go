package daemon

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/coder/websocket"

	"github.com/corral-sandbox/corral/sandbox"
)

// Raw sessions: GET /v1/projects/{id}/sessions?argv=F&argv=A1&…&cwd=C&leaseKind=K
// (and optionally &user=U, as a command's "user", and the terminal's
// &tty=1&rows=R&cols=C)
// upgrades to a WebSocket that carries one command's standard streams. A
// managed project's command runs in its machine (ManagedPrepared.Start); a
// host project's is started by the daemon from the prepared launch
// (confined unless the member is trusted), in its own process group.
// Output is forwarded as the command wrote it: unlike RunCommand's
// results, a stream is not sanitized.
//
// Framing (every message is one WebSocket message):
//
//	client → daemon
//	  binary  0x00 ‖ bytes     bytes for the command's stdin
//	  text    {"type":"eof"}   close the command's stdin
//	  text    {"type":"resize","rows":R,"cols":C}   (terminal sessions)
//	daemon → client
//	  text    {"type":"started","leaseId":L}
//	  binary  0x01 ‖ bytes     the command wrote bytes to stdout
//	  binary  0x02 ‖ bytes     the command wrote bytes to stderr
//	  text    {"type":"exit","code":N|null,"signal":S|null} (with
//	          "oomKilled":true when the kernel's OOM killer killed it)
//	  text    {"type":"error","kind":K,"message":M}
//
// After "exit" or "error" the daemon closes the socket (1000 after an exit,
// 1011 after an error, 1001 when the daemon shuts down, 1008 with the reason
// when the session lost its authorization: its token was revoked, its
// account deleted or removed from the project, or it outlived
// AppOptions.MaxSessionLifetime; see follow.go). The client closing
// the socket cancels the command's whole process tree and releases its
// lease. Output is read from the command only as fast as the socket takes
// it; stdin is read from the socket only as fast as the command takes it.
// While the socket lives the daemon heartbeats the lease every
// AppOptions.SessionHeartbeat (5 s); a failed heartbeat cancels the command
// ("error" kind "transport").
//
// Terminal sessions: with ?tty=1&rows=R&cols=C (rows and cols 1…65535,
// default 24 × 80) the command runs on a pseudo-terminal (a managed
// project's inside its machine, a host project's on the host), its
// controlling terminal and its descriptors 0, 1 and 2, with TERM
// xterm-256color in a machine. Stdin messages are then the terminal's
// input (keys: ^C is 0x03 and interrupts the foreground job; ^D ends a
// shell's input), every output arrives as stream 0x01 and none as 0x02,
// "eof" does nothing, and {"type":"resize"} resizes the terminal (its
// foreground job gets SIGWINCH). "exit" reports the command's status.
//
// Errors before the upgrade (401, 403, 404, 400 for a missing argv or a
// refused preparation, 503, …) are ordinary JSON error responses.

// Stream identifiers: the first byte of binary session messages.
const (
	StreamStdin  byte = 0
	StreamStdout byte = 1
	StreamStderr byte = 2
)

// sessionReadLimit bounds one message from the client.
const sessionReadLimit = 1 << 20

func (a *App) session(w http.ResponseWriter, r *http.Request) error {
	acct, proj, _, err := a.projectMember(r)
	if err != nil {
		return err
	}
	q := r.URL.Query()
	argv := q["argv"]
	if len(argv) == 0 {
		return apiErr(http.StatusBadRequest, KindInvalid, "argv is required (?argv=FILE&argv=ARG…)")
	}
	kind := sandbox.LeaseKind(q.Get("leaseKind"))
	if kind == "" {
		kind = sandbox.LeaseTerminal
	}
	if !strings.EqualFold(r.Header.Get("Upgrade"), "websocket") {
		return apiErr(http.StatusBadRequest, KindInvalid, "a WebSocket upgrade is required")
	}
	ctl, err := a.core.Sandbox()
	if err != nil {
		return err
	}
	in := sandbox.ExecInput{
		Command:   sandbox.Command{Type: sandbox.CommandTypeArgv, File: argv[0], Args: argv[1:]},
		Cwd:       q.Get("cwd"),
		User:      q.Get("user"),
		LeaseKind: kind,
		Project:   projectRef(proj),
	}
	if in.TTY, err = ttyQuery(q); err != nil {
		return err
	}
	prep, err := ctl.PrepareExecution(r.Context(), in, &sandbox.Actor{AccountUserID: acct.ID})
	if err != nil {
		return err
	}
	s := &wsSession{a: a, lease: prep.Common().Lease}
	switch p := prep.(type) {
	case *sandbox.ManagedPrepared:
		s.start, s.cancel = p.Start, p.Cancel
	case *sandbox.LocalPrepared:
		var localCancel func(context.Context) error
		s.start = func(context.Context) (*sandbox.ManagedExecutionSession, error) {
			sess, c, err := startLocalSession(p, in.TTY)
			localCancel = c
			return sess, err
		}
		s.cancel = func(ctx context.Context) error {
			if localCancel != nil {
				return localCancel(ctx)
			}
			if p.Cancel != nil {
				return p.Cancel(ctx)
			}
			return nil
		}
	}
	conn, err := websocket.Accept(w, r, nil)
	if err != nil {
		s.cancelUnstarted()
		return &APIError{Status: http.StatusBadRequest, Kind: KindInvalid, Message: "WebSocket upgrade failed", Cause: err}
	}
	s.conn = conn
	if !a.enterSession() {
		s.cancelUnstarted()
		s.fail(sandbox.KindAbort, "the daemon is shutting down", websocket.StatusGoingAway)
		return nil
	}
	defer a.wg.Done()
	a.metrics.sessionsTotal.Inc()
	a.metrics.sessionsActive.Inc()
	defer a.metrics.sessionsActive.Dec()
	ctx, untrack := a.trackSession(a.ctx, r, proj.ID)
	defer untrack()
	s.run(ctx)
	return nil
}

// enterSession counts a session that Close waits for; it reports false
// once Close began.
func (a *App) enterSession() bool {
	a.sessMu.Lock()
	defer a.sessMu.Unlock()
	if a.closing {
		return false
	}
	a.wg.Add(1)
	return true
}

func releaseQuietly(a *App, l sandbox.Lease) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := l.Release(ctx); err != nil {
		a.log.Warn("session: release lease", "lease", l.ID(), "err", err)
	}
}

// wsSession is one raw session bridged to a WebSocket: a managed
// execution's session, or a host process started by startLocalSession.
type wsSession struct {
	a      *App
	conn   *websocket.Conn
	lease  sandbox.Lease
	start  func(context.Context) (*sandbox.ManagedExecutionSession, error)
	cancel func(context.Context) error
}

// cancelUnstarted cancels a prepared execution that never started and
// releases its lease.
func (s *wsSession) cancelUnstarted() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := s.cancel(ctx); err != nil {
		s.a.log.Warn("session: cancel", "lease", s.lease.ID(), "err", err)
	}
	releaseQuietly(s.a, s.lease)
}

func (s *wsSession) send(ctx context.Context, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	return s.conn.Write(ctx, websocket.MessageText, b)
}

func (s *wsSession) fail(kind sandbox.ErrorKind, msg string, code websocket.StatusCode) {
	_ = s.send(context.Background(), map[string]any{"type": "error", "kind": kind, "message": msg})
	reason := string(kind)
	if code == websocket.StatusPolicyViolation {
		reason = clipReason(msg)
	}
	_ = s.conn.Close(code, reason)
}

// run drives the session until its command exits, its socket closes or
// parent ends (the daemon shuts down: 1001; the session lost its
// authorization: 1008). It always leaves the command ended and its lease
// released.
func (s *wsSession) run(parent context.Context) {
	a := s.a
	// The socket's reads and writes use ctx, which ends only when run
	// returns: a cancelled read or write closes the socket at once, and
	// the close frame saying why must go first.
	ctx, cancel := context.WithCancel(context.WithoutCancel(parent))
	defer cancel()
	s.conn.SetReadLimit(sessionReadLimit)

	sess, err := s.start(ctx)
	if err != nil {
		s.cancelUnstarted()
		kind := sandbox.KindStart
		if errors.Is(err, sandbox.ErrTransport) {
			kind = sandbox.KindTransport
		}
		s.fail(kind, "start: "+err.Error(), websocket.StatusInternalError)
		return
	}
	// From here the command runs: every path below cancels it (unless it
	// exited) and releases its lease; the streams are closed last.
	defer func() {
		_ = sess.Stdout.Close()
		_ = sess.Stderr.Close()
		_ = sess.Stdin.Close()
	}()
	if err := s.send(ctx, map[string]any{"type": "started", "leaseId": s.lease.ID()}); err != nil {
		_ = s.conn.CloseNow()
		releaseAfterCancel(s, sess)
		return
	}

	socketGone := make(chan error, 3)
	go func() { socketGone <- s.readStdin(ctx, sess.Stdin, sess.Resize) }()
	var pumps sync.WaitGroup
	pumps.Add(2)
	go func() { defer pumps.Done(); s.pump(ctx, StreamStdout, sess.Stdout, socketGone) }()
	go func() { defer pumps.Done(); s.pump(ctx, StreamStderr, sess.Stderr, socketGone) }()
	pumpsDone := make(chan struct{})
	go func() { pumps.Wait(); close(pumpsDone) }()

	tick := time.NewTicker(a.opts.SessionHeartbeat)
	defer tick.Stop()
	for {
		select {
		case <-sess.Done():
			// Forward what is left of the output, for a bounded time.
			select {
			case <-pumpsDone:
			case <-time.After(a.opts.SessionDrain):
				_ = sess.Stdout.Close()
				_ = sess.Stderr.Close()
				<-pumpsDone
			}
			exit, werr := sess.Wait()
			cctx, ccancel := context.WithTimeout(context.Background(), 10*time.Second)
			rerr := s.lease.Release(cctx)
			ccancel()
			switch {
			case werr != nil:
				kind := sandbox.KindTransport
				if errors.Is(werr, sandbox.ErrNotStarted) {
					kind = sandbox.KindStart
				}
				s.fail(kind, werr.Error(), websocket.StatusInternalError)
			case rerr != nil:
				s.fail(sandbox.KindCleanup, "release lease: "+rerr.Error(), websocket.StatusInternalError)
			default:
				var sig *string
				if exit.Signal != "" {
					sig = &exit.Signal
				}
				frame := map[string]any{"type": "exit", "code": exit.Code, "signal": sig}
				if exit.OOMKilled && sig != nil {
					frame["oomKilled"] = true
				}
				_ = s.send(ctx, frame)
				_ = s.conn.Close(websocket.StatusNormalClosure, "exit")
			}
			return
		case <-socketGone:
			// The client went away (or broke the protocol): cancel.
			_ = s.conn.CloseNow()
			releaseAfterCancel(s, sess)
			return
		case <-tick.C:
			hctx, hcancel := context.WithTimeout(ctx, 10*time.Second)
			err := s.lease.Heartbeat(hctx)
			hcancel()
			if err != nil {
				s.fail(sandbox.KindTransport, "lease heartbeat failed: "+err.Error(), websocket.StatusInternalError)
				releaseAfterCancel(s, sess)
				return
			}
		case <-parent.Done():
			code, reason := sessionCloseStatus(parent)
			s.fail(sandbox.KindAbort, reason, code)
			releaseAfterCancel(s, sess)
			return
		}
	}
}

// releaseAfterCancel cancels the command, waits (bounded) for it to end,
// and releases the lease.
func releaseAfterCancel(s *wsSession, sess *sandbox.ManagedExecutionSession) {
	cctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := s.cancel(cctx); err != nil {
		s.a.log.Warn("session: cancel", "lease", s.lease.ID(), "err", err)
	}
	select {
	case <-sess.Done():
	case <-cctx.Done():
		s.a.log.Warn("session: command did not end after cancel", "lease", s.lease.ID())
	}
	if err := s.lease.Release(cctx); err != nil {
		s.a.log.Warn("session: release lease", "lease", s.lease.ID(), "err", err)
	}
}

// readStdin forwards the client's stdin messages; it returns when the
// socket fails or closes (or the client breaks the framing).
func (s *wsSession) readStdin(ctx context.Context, stdin io.WriteCloser, resize func(rows, cols uint16) error) error {
	for {
		typ, data, err := s.conn.Read(ctx)
		if err != nil {
			return err
		}
		switch typ {
		case websocket.MessageBinary:
			if len(data) == 0 || data[0] != StreamStdin {
				return errors.New("session: binary messages from the client must start with 0x00")
			}
			if _, err := stdin.Write(data[1:]); err != nil {
				// The command closed its stdin: drop further input.
				continue
			}
		case websocket.MessageText:
			var m struct {
				Type string `json:"type"`
				Rows uint16 `json:"rows"`
				Cols uint16 `json:"cols"`
			}
			err := json.Unmarshal(data, &m)
			switch {
			case err == nil && m.Type == "eof":
				_ = stdin.Close()
			case err == nil && m.Type == "resize" && resize != nil && m.Rows > 0 && m.Cols > 0:
				if rerr := resize(m.Rows, m.Cols); rerr != nil {
					s.a.log.Debug("session: resize", "lease", s.lease.ID(), "err", rerr)
				}
			default:
				return errors.New(`session: text messages from the client must be {"type":"eof"} or, on a terminal, {"type":"resize","rows":R,"cols":C}`)
			}
		}
	}
}

// pump forwards one output stream, reading only as fast as the socket
// writes. A failed write means the socket is gone.
func (s *wsSession) pump(ctx context.Context, id byte, r io.Reader, gone chan<- error) {
	buf := make([]byte, 32<<10)
	buf[0] = id
	for {
		n, err := r.Read(buf[1:])
		if n > 0 {
			if werr := s.conn.Write(ctx, websocket.MessageBinary, buf[:1+n]); werr != nil {
				gone <- werr
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// ttyQuery reads a session's terminal parameters: nil without ?tty=1.
func ttyQuery(q url.Values) (*sandbox.TTYSize, error) {
	switch q.Get("tty") {
	case "", "0", "false":
		return nil, nil
	case "1", "true":
	default:
		return nil, apiErr(http.StatusBadRequest, KindInvalid, "tty must be 1 or 0")
	}
	size := &sandbox.TTYSize{Rows: 24, Cols: 80}
	for _, f := range []struct {
		name string
		v    *uint16
	}{{"rows", &size.Rows}, {"cols", &size.Cols}} {
		v := q.Get(f.name)
		if v == "" {
			continue
		}
		n, err := strconv.ParseUint(v, 10, 16)
		if err != nil || n == 0 {
			return nil, apiErr(http.StatusBadRequest, KindInvalid, "%s must be an integer from 1 to 65535", f.name)
		}
		*f.v = uint16(n)
	}
	return size, nil
}
