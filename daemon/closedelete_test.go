package daemon

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/coder/websocket"
)

// TestDeleteAfterClose: a client that closed its file watch or its session
// and saw the close complete deletes the project at once (204, every time):
// the lease of what it closed does not outlive the close.
func TestDeleteAfterClose(t *testing.T) {
	requireRoot(t)
	e := newEnv(t, envOpts{})
	alice, tok := e.account("alice")
	c := e.client(tok)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	for i := range 30 {
		p := e.hostProject(fmt.Sprintf("w%d", i), alice)
		w, err := c.WatchFiles(ctx, p.ID, "/workspace", "", true)
		if err != nil {
			t.Fatal(err)
		}
		if err := w.Close(); err != nil {
			t.Fatalf("close watch %d: %v", i, err)
		}
		if status, body := e.do(ctx, "DELETE", fmt.Sprintf("/v1/projects/%d", p.ID), tok, nil); status != 204 {
			t.Fatalf("delete %d after closing its watch: %d %s", i, status, body)
		}
	}
	for i := range 30 {
		p := e.hostProject(fmt.Sprintf("s%d", i), alice)
		conn, _, err := e.dialSession(ctx, tok, p.ID, "sleep", "60")
		if err != nil {
			t.Fatal(err)
		}
		if _, _, err := conn.Read(ctx); err != nil { // "started"
			t.Fatal(err)
		}
		if err := conn.Close(websocket.StatusNormalClosure, ""); err != nil {
			t.Fatalf("close session %d: %v", i, err)
		}
		if status, body := e.do(ctx, "DELETE", fmt.Sprintf("/v1/projects/%d", p.ID), tok, nil); status != 204 {
			t.Fatalf("delete %d after closing its session: %d %s", i, status, body)
		}
	}
	// An open session's lease still blocks the delete.
	p := e.hostProject("open", alice)
	conn, _, err := e.dialSession(ctx, tok, p.ID, "sleep", "60")
	if err != nil {
		t.Fatal(err)
	}
	defer conn.CloseNow()
	if _, _, err := conn.Read(ctx); err != nil {
		t.Fatal(err)
	}
	if status, body := e.do(ctx, "DELETE", fmt.Sprintf("/v1/projects/%d", p.ID), tok, nil); status != 409 {
		t.Fatalf("delete with an open session: %d %s", status, body)
	}
	for i := range 30 {
		// A session whose command exited: the daemon closes, the client
		// acknowledges.
		p := e.hostProject(fmt.Sprintf("x%d", i), alice)
		conn, _, err := e.dialSession(ctx, tok, p.ID, "true")
		if err != nil {
			t.Fatal(err)
		}
		if tr := readSession(ctx, conn); websocket.CloseStatus(tr.closeErr) != websocket.StatusNormalClosure {
			t.Fatalf("session %d: %v %v", i, tr.closeErr, tr.control)
		}
		if status, body := e.do(ctx, "DELETE", fmt.Sprintf("/v1/projects/%d", p.ID), tok, nil); status != 204 {
			t.Fatalf("delete %d after its session exited: %d %s", i, status, body)
		}
	}
}
