package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"sync"

	"github.com/coder/websocket"

	"github.com/corral-sandbox/corral/api"
)

// Stream identifiers: the first byte of a session's binary messages.
const (
	StreamStdin  byte = 0
	StreamStdout byte = 1
	StreamStderr byte = 2
)

// sessionReadLimit bounds one message from the daemon (it sends at most
// 32 KiB of output per message).
const sessionReadLimit = 1 << 20

// DialWebSocket opens a WebSocket to an API path (with its query) with the
// client's token. An error answer before the upgrade is a *Error (its
// message cut to what the daemon sent in its first 1 KiB); a failure to
// connect is a wrapped transport error.
func (c *Client) DialWebSocket(ctx context.Context, path string) (*websocket.Conn, error) {
	u := c.URL(path)
	u = "ws" + strings.TrimPrefix(u, "http") // http → ws, https → wss
	conn, resp, err := websocket.Dial(ctx, u, &websocket.DialOptions{HTTPClient: c.http, HTTPHeader: c.Header()})
	if err != nil {
		if resp != nil && resp.StatusCode != http.StatusSwitchingProtocols {
			var data []byte
			if resp.Body != nil {
				data, _ = io.ReadAll(resp.Body)
			}
			return nil, decodeError(resp.StatusCode, resp.Header, data)
		}
		return nil, fmt.Errorf("client: GET %s: %w", path, err)
	}
	return conn, nil
}

// OpenLSP opens a language-server session of project id (openLSPSession):
// the WebSocket carries one JSON-RPC message per text message. The caller
// owns the connection.
func (c *Client) OpenLSP(ctx context.Context, projectID int64, server string) (*websocket.Conn, error) {
	return c.DialWebSocket(ctx, projectPath(projectID, "lsp", server))
}

// SessionRequest describes a raw session: one command whose standard
// streams travel over a WebSocket (openSession).
type SessionRequest struct {
	// Argv is the program and its arguments; required.
	Argv []string
	// Cwd, User and LeaseKind are as in CommandRequest (empty: the
	// defaults).
	Cwd       string
	User      string
	LeaseKind api.LeaseKind
	// Env is merged over the sandbox's default environment, as
	// CommandRequest.Env (names [A-Za-z_][A-Za-z0-9_]*: 400 otherwise).
	Env map[string]string
	// TTY, if non-nil, runs the command on a terminal of that size (zero
	// fields: 24 × 80): all output then arrives on Stdout.
	TTY *api.TTYSize
	// Stdout and Stderr receive the command's output as it arrives, from
	// one goroutine, unsanitized; nil discards it. A writer that blocks
	// holds the command's output (the daemon reads it only as fast as the
	// socket takes it).
	Stdout io.Writer
	Stderr io.Writer
}

// query is r as the session's query string.
func (r SessionRequest) query() url.Values {
	q := url.Values{"argv": r.Argv}
	if r.Cwd != "" {
		q.Set("cwd", r.Cwd)
	}
	if r.User != "" {
		q.Set("user", r.User)
	}
	if r.LeaseKind != "" {
		q.Set("leaseKind", string(r.LeaseKind))
	}
	names := make([]string, 0, len(r.Env))
	for k := range r.Env {
		names = append(names, k)
	}
	sort.Strings(names)
	for _, k := range names {
		q.Add("env", k+"="+r.Env[k])
	}
	if r.TTY != nil {
		q.Set("tty", "1")
		if r.TTY.Rows != 0 {
			q.Set("rows", strconv.Itoa(int(r.TTY.Rows)))
		}
		if r.TTY.Cols != 0 {
			q.Set("cols", strconv.Itoa(int(r.TTY.Cols)))
		}
	}
	return q
}

// Session is a running raw session. Its methods are safe for concurrent
// use. Wait for its end with Wait; Close ends it early.
type Session struct {
	conn    *websocket.Conn
	ctx     context.Context
	leaseID string
	stdout  io.Writer
	stderr  io.Writer

	done chan struct{} // closed when the reader returned
	exit api.Exit      // set before done is closed
	err  error         // set before done is closed

	closeOnce sync.Once
}

// OpenSession starts a raw session in project id and returns once the
// command has started (the daemon sent "started"). Errors before the
// start — 401, 403, 400 for a bad request or refused preparation, 429, 503,
// a start failure — are *Error values. Cancelling ctx closes the socket,
// which cancels the command's whole process tree.
func (c *Client) OpenSession(ctx context.Context, projectID int64, req SessionRequest) (*Session, error) {
	if len(req.Argv) == 0 {
		return nil, errors.New("client: a session needs Argv")
	}
	conn, err := c.DialWebSocket(ctx, projectPath(projectID, "sessions")+"?"+req.query().Encode())
	if err != nil {
		return nil, err
	}
	conn.SetReadLimit(sessionReadLimit)
	s := &Session{conn: conn, ctx: ctx, stdout: orDiscard(req.Stdout), stderr: orDiscard(req.Stderr), done: make(chan struct{})}
	// The first message is "started" or "error".
	typ, data, err := conn.Read(ctx)
	if err != nil {
		_ = conn.CloseNow()
		return nil, fmt.Errorf("client: session: %w", err)
	}
	m, err := decodeFrame(typ, data)
	switch {
	case err != nil:
		_ = conn.CloseNow()
		return nil, err
	case m.Type == "error":
		_ = conn.CloseNow()
		return nil, m.error()
	case m.Type != "started":
		_ = conn.CloseNow()
		return nil, fmt.Errorf("client: session: first message is %q, not \"started\"", m.Type)
	}
	s.leaseID = m.LeaseID
	go s.read()
	return s, nil
}

func orDiscard(w io.Writer) io.Writer {
	if w == nil {
		return io.Discard
	}
	return w
}

// frame is a text message of the daemon.
type frame struct {
	Type      string  `json:"type"`
	LeaseID   string  `json:"leaseId"`
	Code      *int    `json:"code"`
	Signal    *string `json:"signal"`
	OOMKilled bool    `json:"oomKilled"`
	Kind      string  `json:"kind"`
	Message   string  `json:"message"`
}

// error is an "error" frame as a *Error: Status 101, the status the
// answer had.
func (f frame) error() *Error {
	return &Error{Status: http.StatusSwitchingProtocols, Kind: f.Kind, Message: f.Message}
}

func decodeFrame(typ websocket.MessageType, data []byte) (frame, error) {
	var f frame
	if typ != websocket.MessageText {
		return f, errors.New("client: session: a binary message where a text message was due")
	}
	if err := json.Unmarshal(data, &f); err != nil {
		return f, fmt.Errorf("client: session: decode message: %w", err)
	}
	return f, nil
}

// read forwards output until the exit, an error or the socket's end.
func (s *Session) read() {
	defer close(s.done)
	s.err = errors.New("client: session: the daemon closed the session without an exit")
	ended := false // an "exit" or "error" arrived
	for {
		typ, data, err := s.conn.Read(s.ctx)
		if err != nil {
			if ended {
				return
			}
			if s.ctx.Err() != nil {
				s.err = fmt.Errorf("client: session: %w", s.ctx.Err())
			} else if !errors.Is(err, io.EOF) && websocket.CloseStatus(err) == -1 {
				s.err = fmt.Errorf("client: session: %w", err)
			}
			return
		}
		if typ == websocket.MessageBinary {
			if len(data) == 0 {
				continue
			}
			var w io.Writer
			switch data[0] {
			case StreamStdout:
				w = s.stdout
			case StreamStderr:
				w = s.stderr
			default:
				continue
			}
			_, _ = w.Write(data[1:])
			continue
		}
		f, err := decodeFrame(typ, data)
		if err != nil {
			continue
		}
		switch f.Type {
		case "exit":
			s.exit = api.Exit{Code: f.Code, OOMKilled: f.OOMKilled}
			if f.Signal != nil {
				s.exit.Signal = *f.Signal
			}
			s.err, ended = nil, true
		case "error":
			s.err, ended = f.error(), true
		}
	}
}

// LeaseID is the lease the session's command holds.
func (s *Session) LeaseID() string { return s.leaseID }

// Write writes p to the command's standard input (on a terminal: its
// keystrokes).
func (s *Session) Write(p []byte) (int, error) {
	msg := make([]byte, 1+len(p))
	msg[0] = StreamStdin
	copy(msg[1:], p)
	if err := s.conn.Write(s.ctx, websocket.MessageBinary, msg); err != nil {
		return 0, fmt.Errorf("client: session stdin: %w", err)
	}
	return len(p), nil
}

// CloseStdin closes the command's standard input (nothing on a terminal:
// send ^D, 0x04, to end a shell's input there).
func (s *Session) CloseStdin() error {
	if err := s.conn.Write(s.ctx, websocket.MessageText, []byte(`{"type":"eof"}`)); err != nil {
		return fmt.Errorf("client: session stdin: %w", err)
	}
	return nil
}

// Stdin returns an io.WriteCloser over Write and CloseStdin.
func (s *Session) Stdin() io.WriteCloser { return sessionStdin{s} }

type sessionStdin struct{ s *Session }

func (w sessionStdin) Write(p []byte) (int, error) { return w.s.Write(p) }
func (w sessionStdin) Close() error                { return w.s.CloseStdin() }

// Resize resizes a terminal session's terminal (the daemon ignores it for
// other sessions).
func (s *Session) Resize(rows, cols uint16) error {
	b, _ := json.Marshal(map[string]any{"type": "resize", "rows": rows, "cols": cols})
	if err := s.conn.Write(s.ctx, websocket.MessageText, b); err != nil {
		return fmt.Errorf("client: session resize: %w", err)
	}
	return nil
}

// Wait blocks until the session ended and its output was written to the
// request's writers, and returns the command's exit status. A session the
// daemon ended with an "error" message (a lost transport, the session's
// token revoked, the daemon shutting down) is a *Error with Status 101;
// one that ended otherwise before an exit is an error too.
func (s *Session) Wait() (api.Exit, error) {
	<-s.done
	return s.exit, s.err
}

// Done is closed when the session has ended.
func (s *Session) Done() <-chan struct{} { return s.done }

// Close closes the socket, which cancels the command's whole process tree
// if it still runs and releases its lease, and waits for the reader. It
// may be called more than once and after Wait.
func (s *Session) Close() error {
	s.closeOnce.Do(func() {
		select {
		case <-s.done:
		default:
			_ = s.conn.Close(websocket.StatusNormalClosure, "")
		}
		_ = s.conn.CloseNow()
	})
	<-s.done
	return nil
}
