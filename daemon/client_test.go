package daemon

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/corral-sandbox/corral/client"
	"github.com/corral-sandbox/corral/internal/testenv"
	"github.com/corral-sandbox/corral/sandbox"
)

// TestClientAgainstDaemon drives the Go client against a real daemon: a
// session's stdin, stdout, stderr and exit; a terminal session's size and
// resize; typed errors for anonymous callers, non-members and bad
// requests; streamed output.
func TestClientAgainstDaemon(t *testing.T) {
	requireRoot(t)
	e := newEnv(t, envOpts{})
	alice, tok := e.account("alice")
	_, carolTok := e.account("carol")
	p := e.hostProject("web", alice)
	c := e.client(tok)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	// stdin to stdout, a line on stderr, an exit status.
	var stdout, stderr bytes.Buffer
	s, err := c.OpenSession(ctx, p.ID, client.SessionRequest{
		Argv:   []string{"sh", "-c", "cat; echo \"$GREETING\" >&2; exit 7"},
		Env:    map[string]string{"GREETING": "done"},
		Stdout: &stdout, Stderr: &stderr,
	})
	if err != nil {
		t.Fatal(err)
	}
	if s.LeaseID() == "" {
		t.Error("no lease id")
	}
	if _, err := s.Stdin().Write([]byte("hello\x00\xff\n")); err != nil {
		t.Fatal(err)
	}
	if err := s.Stdin().Close(); err != nil {
		t.Fatal(err)
	}
	exit, err := s.Wait()
	if err != nil || exit.Code == nil || *exit.Code != 7 {
		t.Fatalf("exit %+v, %v", exit, err)
	}
	if stdout.String() != "hello\x00\xff\n" || stderr.String() != "done\n" {
		t.Errorf("stdout %q stderr %q", stdout.String(), stderr.String())
	}
	s.Close()

	// A terminal: its initial size, then a resize seen by the command.
	var term lockedBuffer
	s, err = c.OpenSession(ctx, p.ID, client.SessionRequest{
		Argv: []string{"sh", "-c", "stty size; read x; stty size"},
		TTY:  &sandbox.TTYSize{Rows: 30, Cols: 100}, Stdout: &term,
	})
	if err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 5*time.Second, "the first stty size", func() bool { return strings.Contains(term.String(), "30 100") })
	if err := s.Resize(40, 120); err != nil {
		t.Fatal(err)
	}
	// The resize message goes before the line on the same socket.
	if _, err := s.Write([]byte("go\r")); err != nil {
		t.Fatal(err)
	}
	if exit, err := s.Wait(); err != nil || exit.Code == nil || *exit.Code != 0 || !strings.Contains(term.String(), "40 120") {
		t.Fatalf("exit %+v, %v; terminal %q", exit, err, term.String())
	}
	s.Close()

	// Typed errors before the upgrade.
	anon := e.client("")
	if _, err := anon.OpenSession(ctx, p.ID, client.SessionRequest{Argv: []string{"true"}}); !errors.Is(err, client.ErrUnauthorized) {
		t.Errorf("anonymous session: %v", err)
	}
	carol := e.client(carolTok)
	if _, err := carol.OpenSession(ctx, p.ID, client.SessionRequest{Argv: []string{"true"}}); !errors.Is(err, client.ErrForbidden) {
		t.Errorf("non-member session: %v", err)
	}
	if _, err := c.OpenSession(ctx, p.ID, client.SessionRequest{Argv: []string{"true"}, TTY: &sandbox.TTYSize{Rows: 1}, User: "root"}); !errors.Is(err, client.ErrInvalid) {
		t.Errorf("host session as a user: %v", err)
	}
	// Typed errors of ordinary calls.
	if _, err := carol.Project(ctx, p.ID); !errors.Is(err, client.ErrForbidden) {
		t.Errorf("non-member project: %v", err)
	}
	if _, err := anon.Whoami(ctx); !errors.Is(err, client.ErrUnauthorized) {
		t.Errorf("anonymous whoami: %v", err)
	}
	if _, err := c.CreateAccount(ctx, "dave"); !errors.Is(err, client.ErrForbidden) {
		t.Errorf("account by a non-admin: %v", err)
	}
	if _, err := c.RunCommand(ctx, p.ID, client.CommandRequest{Command: sandbox.Command{Type: "argv", File: "true"}, Env: map[string]string{"1X": "y"}}); !errors.Is(err, client.ErrInvalid) {
		t.Errorf("bad env: %v", err)
	}
	if me, err := c.Whoami(ctx); err != nil || me.Name != "alice" {
		t.Errorf("whoami %+v %v", me, err)
	}
	if ms, err := c.Members(ctx, p.ID); err != nil || len(ms) != 1 || ms[0].Account != "alice" || ms[0].Role != "owner" {
		t.Errorf("members %+v %v", ms, err)
	}

	// Streamed output through the client.
	var chunks []string
	res, err := c.StreamCommand(ctx, p.ID, client.CommandRequest{
		Command: sandbox.Command{Type: "argv", File: "sh", Args: []string{"-c", "echo a; sleep 0.2; echo b"}},
	}, func(b []byte) { chunks = append(chunks, string(b)) }, nil)
	if err != nil || res.Stdout != "a\nb\n" || strings.Join(chunks, "") != "a\nb\n" {
		t.Fatalf("res %+v err %v chunks %q", res, err, chunks)
	}
}

// lockedBuffer is a bytes.Buffer safe for a writer and a reader.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}
