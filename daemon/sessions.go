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
// (and optionally &user=U, as a command's "user", &env=K=V, repeatable, as
// a command's "env": names are POSIX portable names, refused with 400
// before anything is prepared, values may contain '=', and the terminal's
// &tty=1&rows=R&cols=C)
// upgrades to a WebSocket that carries one command's standard streams.
// The command is a sandbox.Session (Control.Open): a managed project's
// runs in its machine, a host project's through the same launch as its
// one-shot commands (confined unless the member is trusted, in its own
// process group); this file holds only the framing. Output is forwarded as
// the command wrote it: unlike RunCommand's results, a stream is not
// sanitized.
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
// While the socket lives the lease is heartbeated every
// sandbox.ControlOptions.HeartbeatInterval (5 s); a failed heartbeat
// cancels the command ("error" kind "transport"). After the command exits
// its remaining output is forwarded for at most the control's
// DrainTimeout (2 s).
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
	env, err := envQuery(q)
	if err != nil {
		return err
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
		Env:       env,
	}
	if in.TTY, err = ttyQuery(q); err != nil {
		return err
	}
	// The session lives until its command exits, its socket closes, the
	// daemon shuts down or the checker ends it (follow.go).
	ctx, untrack := a.trackSession(a.ctx, r, proj.ID)
	defer untrack()
	// The socket is upgraded once the preparation was accepted,
	// immediately before the command starts: a refused preparation is an
	// ordinary JSON error, a failed start an "error" message.
	s := &wsSession{a: a, tty: in.TTY != nil}
	var upgradeErr error
	var entered, shuttingDown bool
	sess, err := ctl.Open(ctx, in, &sandbox.Actor{AccountUserID: acct.ID}, &sandbox.SessionOptions{
		OnStart: func(sandbox.StartInfo) error {
			conn, err := websocket.Accept(w, r, nil)
			if err != nil {
				upgradeErr = err
				return err
			}
			s.conn = conn
			if !a.enterSession() {
				shuttingDown = true
				return errors.New("the daemon is shutting down")
			}
			entered = true
			return nil
		},
	})
	if entered {
		defer a.wg.Done()
	}
	switch {
	case err == nil:
	case upgradeErr != nil:
		return &APIError{Status: http.StatusBadRequest, Kind: KindInvalid, Message: "WebSocket upgrade failed", Cause: upgradeErr}
	case s.conn == nil:
		return err // refused before the upgrade: validation, admission, preparation
	case shuttingDown:
		s.fail(sandbox.KindAbort, "the daemon is shutting down", websocket.StatusGoingAway)
		return nil
	default:
		// Upgraded, then the start failed: nothing runs, the lease is
		// released.
		ce := err.(*sandbox.CommandError)
		s.fail(ce.Kind, ce.Message, websocket.StatusInternalError)
		return nil
	}
	s.sess = sess
	a.metrics.sessionsTotal.Inc()
	a.metrics.sessionsActive.Inc()
	defer a.metrics.sessionsActive.Dec()
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

// wsSession is one sandbox session bridged to a WebSocket: only the
// framing lives here; the lifecycle (heartbeat, cancel, drain, release) is
// the sandbox.Session's.
type wsSession struct {
	a    *App
	conn *websocket.Conn
	sess *sandbox.Session
	tty  bool
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

// run forwards the session until its command settles, its socket closes or
// parent ends (the daemon shuts down: 1001; the session lost its
// authorization: 1008). It always leaves the session closed: the command
// ended and its lease released.
func (s *wsSession) run(parent context.Context) {
	sess := s.sess
	// The socket's reads and writes use ctx, which ends only when run
	// returns: a cancelled read or write closes the socket at once, and
	// the close frame saying why must go first.
	ctx, cancel := context.WithCancel(context.WithoutCancel(parent))
	defer cancel()
	s.conn.SetReadLimit(sessionReadLimit)
	if err := s.send(ctx, map[string]any{"type": "started", "leaseId": sess.LeaseID()}); err != nil {
		_ = s.conn.CloseNow()
		s.close()
		return
	}

	socketGone := make(chan error, 3)
	go func() { socketGone <- s.readStdin(ctx) }()
	var pumps sync.WaitGroup
	pumps.Add(2)
	go func() { defer pumps.Done(); s.pump(ctx, StreamStdout, sess.Stdout, socketGone) }()
	go func() { defer pumps.Done(); s.pump(ctx, StreamStderr, sess.Stderr, socketGone) }()
	// Closing the session ends the pumps (it closes the streams).
	defer pumps.Wait()
	defer s.close()

	select {
	case <-sess.Done():
		// The session drained its output (bounded) before it settled.
		pumps.Wait()
		exit, err := sess.Wait()
		var ce *sandbox.CommandError
		switch {
		case errors.As(err, &ce) && ce.Kind == sandbox.KindAbort && parent.Err() != nil:
			code, reason := sessionCloseStatus(parent)
			s.fail(sandbox.KindAbort, reason, code)
		case errors.As(err, &ce):
			s.fail(ce.Kind, ce.Message, websocket.StatusInternalError)
		case err != nil:
			s.fail(sandbox.KindTransport, err.Error(), websocket.StatusInternalError)
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
	case <-socketGone:
		// The client went away (or broke the protocol): cancel.
		_ = s.conn.CloseNow()
	case <-parent.Done():
		code, reason := sessionCloseStatus(parent)
		s.fail(sandbox.KindAbort, reason, code)
	}
}

// close closes the session (cancelling its command unless it settled) and
// logs what failed in the teardown.
func (s *wsSession) close() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := s.sess.Close(ctx); err != nil {
		s.a.log.Warn("session: teardown", "lease", s.sess.LeaseID(), "err", err)
	}
}

// readStdin forwards the client's stdin messages; it returns when the
// socket fails or closes (or the client breaks the framing).
func (s *wsSession) readStdin(ctx context.Context) error {
	stdin := s.sess.Stdin
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
			case err == nil && m.Type == "resize" && s.tty && m.Rows > 0 && m.Cols > 0:
				if rerr := s.sess.Resize(m.Rows, m.Cols); rerr != nil {
					s.a.log.Debug("session: resize", "lease", s.sess.LeaseID(), "err", rerr)
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

// envQuery reads a session's environment: &env=K=V, repeatable (a later
// K wins); names must be POSIX portable names, values may contain '='.
func envQuery(q url.Values) (map[string]string, error) {
	kvs := q["env"]
	if len(kvs) == 0 {
		return nil, nil
	}
	env := make(map[string]string, len(kvs))
	for _, kv := range kvs {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || !sandbox.ValidEnvName(k) {
			return nil, apiErr(http.StatusBadRequest, KindInvalid, "env %q: want NAME=VALUE with NAME of letters, digits and _, not starting with a digit", clipReason(kv))
		}
		env[k] = v
	}
	return env, nil
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
