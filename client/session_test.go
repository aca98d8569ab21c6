package client

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/coder/websocket"

	"github.com/corral-sandbox/corral/api"
)

// fakeSessions serves /v1/projects/1/sessions as the daemon frames it:
// script runs the session after "started" has been sent.
func fakeSessions(t *testing.T, script func(ctx context.Context, conn *websocket.Conn, r *http.Request)) *Client {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer tok" {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(401)
			w.Write([]byte(`{"error":{"kind":"unauthorized","message":"a bearer token is required","stdout":"","stderr":""}}`))
			return
		}
		if len(r.URL.Query()["argv"]) == 0 {
			w.WriteHeader(400)
			w.Write([]byte(`{"error":{"kind":"invalid","message":"argv is required","stdout":"","stderr":""}}`))
			return
		}
		conn, err := websocket.Accept(w, r, nil)
		if err != nil {
			return
		}
		defer conn.CloseNow()
		script(r.Context(), conn, r)
	}))
	t.Cleanup(srv.Close)
	c, err := New(srv.URL, "tok")
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func sendJSON(ctx context.Context, conn *websocket.Conn, v any) {
	b, _ := json.Marshal(v)
	_ = conn.Write(ctx, websocket.MessageText, b)
}

// TestSession drives a session: the query it sends, stdin (bytes and
// eof), resize, stdout and stderr in order, and the exit.
func TestSession(t *testing.T) {
	var query string
	var mu sync.Mutex
	var got []string // what the fake daemon received
	c := fakeSessions(t, func(ctx context.Context, conn *websocket.Conn, r *http.Request) {
		query = r.URL.RawQuery
		sendJSON(ctx, conn, map[string]any{"type": "started", "leaseId": "L1"})
		for {
			typ, data, err := conn.Read(ctx)
			if err != nil {
				return
			}
			mu.Lock()
			if typ == websocket.MessageBinary {
				got = append(got, "bin:"+string(data))
			} else {
				got = append(got, "text:"+string(data))
			}
			mu.Unlock()
			if string(data) == `{"type":"eof"}` {
				break
			}
		}
		conn.Write(ctx, websocket.MessageBinary, []byte("\x01out1 "))
		conn.Write(ctx, websocket.MessageBinary, []byte("\x02err"))
		conn.Write(ctx, websocket.MessageBinary, []byte("\x01out2"))
		sendJSON(ctx, conn, map[string]any{"type": "exit", "code": 3, "signal": nil})
		conn.Close(websocket.StatusNormalClosure, "exit")
	})
	var stdout, stderr bytes.Buffer
	s, err := c.OpenSession(context.Background(), 1, SessionRequest{
		Argv: []string{"sh", "-c", "a&b?c"}, Cwd: "/w s", User: "root", LeaseKind: api.LeaseTerminal,
		TTY: &api.TTYSize{Rows: 30, Cols: 100}, Env: map[string]string{"B": "2=x", "A": "1"}, Stdout: &stdout, Stderr: &stderr,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if s.LeaseID() != "L1" {
		t.Errorf("lease %q", s.LeaseID())
	}
	if _, err := s.Stdin().Write([]byte("in\x00put")); err != nil {
		t.Fatal(err)
	}
	if err := s.Resize(40, 120); err != nil {
		t.Fatal(err)
	}
	if err := s.Stdin().Close(); err != nil {
		t.Fatal(err)
	}
	exit, err := s.Wait()
	if err != nil || exit.Code == nil || *exit.Code != 3 || exit.Signal != "" {
		t.Fatalf("exit %+v err %v", exit, err)
	}
	if stdout.String() != "out1 out2" || stderr.String() != "err" {
		t.Errorf("stdout %q stderr %q", stdout.String(), stderr.String())
	}
	want := "argv=sh&argv=-c&argv=a%26b%3Fc&cols=100&cwd=%2Fw+s&env=A%3D1&env=B%3D2%3Dx&leaseKind=terminal&rows=30&tty=1&user=root"
	if query != want {
		t.Errorf("query %q, want %q", query, want)
	}
	mu.Lock()
	defer mu.Unlock()
	if strings.Join(got, "|") != "bin:\x00in\x00put|text:{\"cols\":120,\"rows\":40,\"type\":\"resize\"}|text:{\"type\":\"eof\"}" {
		t.Errorf("daemon received %q", got)
	}
}

// TestSessionErrors: an answer before the upgrade, an error instead of
// "started", an error frame ending a session, a signal exit, and a socket
// closed without an exit are each reported, typed where the daemon said
// why.
func TestSessionErrors(t *testing.T) {
	ctx := context.Background()
	// 401 before the upgrade.
	c := fakeSessions(t, nil)
	c.token = ""
	_, err := c.OpenSession(ctx, 1, SessionRequest{Argv: []string{"true"}})
	if !errors.Is(err, ErrUnauthorized) {
		t.Fatalf("anonymous: %v", err)
	}
	if _, err := c.OpenSession(ctx, 1, SessionRequest{}); err == nil {
		t.Fatal("no argv: no error")
	}

	run := func(script func(ctx context.Context, conn *websocket.Conn)) (*Session, error) {
		c := fakeSessions(t, func(ctx context.Context, conn *websocket.Conn, _ *http.Request) { script(ctx, conn) })
		return c.OpenSession(ctx, 1, SessionRequest{Argv: []string{"x"}})
	}
	// The start failed.
	_, err = run(func(ctx context.Context, conn *websocket.Conn) {
		sendJSON(ctx, conn, map[string]any{"type": "error", "kind": "start", "message": "start: no such file"})
		conn.Close(websocket.StatusInternalError, "start")
	})
	var e *Error
	if !errors.As(err, &e) || e.Kind != "start" || e.Status != http.StatusSwitchingProtocols {
		t.Fatalf("start failure: %v", err)
	}
	// An error ends a started session.
	s, err := run(func(ctx context.Context, conn *websocket.Conn) {
		sendJSON(ctx, conn, map[string]any{"type": "started", "leaseId": "L"})
		sendJSON(ctx, conn, map[string]any{"type": "error", "kind": "abort", "message": "token revoked"})
		conn.Close(websocket.StatusPolicyViolation, "token revoked")
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Wait(); !errors.As(err, &e) || e.Kind != "abort" || e.Message != "token revoked" {
		t.Fatalf("revoked: %v", err)
	}
	// A signal and an OOM kill.
	s, err = run(func(ctx context.Context, conn *websocket.Conn) {
		sendJSON(ctx, conn, map[string]any{"type": "started", "leaseId": "L"})
		sendJSON(ctx, conn, map[string]any{"type": "exit", "code": nil, "signal": "SIGKILL", "oomKilled": true})
		conn.Close(websocket.StatusNormalClosure, "exit")
	})
	if err != nil {
		t.Fatal(err)
	}
	if exit, err := s.Wait(); err != nil || exit.Code != nil || exit.Signal != "SIGKILL" || !exit.OOMKilled {
		t.Fatalf("signal: %+v %v", exit, err)
	}
	// Closed without an exit.
	s, err = run(func(ctx context.Context, conn *websocket.Conn) {
		sendJSON(ctx, conn, map[string]any{"type": "started", "leaseId": "L"})
		conn.Close(websocket.StatusNormalClosure, "")
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Wait(); err == nil || !strings.Contains(err.Error(), "without an exit") {
		t.Fatalf("no exit: %v", err)
	}
	s.Close()
	s.Close() // idempotent
}

// TestSessionClose: Close ends a session that still runs (the daemon sees
// the socket close, as it cancels the command then).
func TestSessionClose(t *testing.T) {
	closed := make(chan error, 1)
	c := fakeSessions(t, func(ctx context.Context, conn *websocket.Conn, _ *http.Request) {
		sendJSON(ctx, conn, map[string]any{"type": "started", "leaseId": "L"})
		_, _, err := conn.Read(ctx)
		closed <- err
	})
	s, err := c.OpenSession(context.Background(), 1, SessionRequest{Argv: []string{"sleep", "100"}})
	if err != nil {
		t.Fatal(err)
	}
	s.Close()
	if err := <-closed; websocket.CloseStatus(err) != websocket.StatusNormalClosure {
		t.Fatalf("daemon saw %v", err)
	}
	<-s.Done()
	if _, err := s.Wait(); err == nil {
		t.Fatal("a closed session reported an exit")
	}
}
