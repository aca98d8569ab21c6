package daemon

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/corral-sandbox/corral/internal/testenv"
	"github.com/corral-sandbox/corral/sandbox"
	"github.com/corral-sandbox/corral/sandbox/sandboxtest"
)

// TestBusyIs429: over an admission budget, commands and sessions are
// refused with 429, Retry-After and the budget's name, before anything is
// prepared; once the work settled, the next one is admitted.
func TestBusyIs429(t *testing.T) {
	fake := &sandboxtest.Provider{Dir: t.TempDir(), Kind: sandbox.ProjectManaged}
	lim := sandbox.NewLimiter(sandbox.Budget{}, sandbox.Budget{Commands: 1, Sessions: 1})
	e := newEnv(t, envOpts{fake: fake, control: sandbox.ControlOptions{Admitter: lim}})
	alice, tok := e.account("alice")
	p := e.managedProject("box", alice)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	// One command runs…
	done := make(chan int, 1)
	go func() {
		req, _ := http.NewRequestWithContext(ctx, "POST", "http://corral"+commandsPath(p.ID), strings.NewReader(`{"command":{"type":"argv","file":"sleep","args":["30"]},"timeoutMs":60000}`))
		req.Header.Set("Authorization", "Bearer "+tok)
		resp, err := e.http.Do(req)
		if err != nil {
			done <- 0 // the client gave up (cancel below)
			return
		}
		resp.Body.Close()
		done <- resp.StatusCode
	}()
	testenv.WaitFor(t, 5*time.Second, "the first command to run", func() bool { l := fake.LastLease(); return l != nil && !l.Released() })
	calls := fake.Calls()
	// …the second is refused.
	req, _ := http.NewRequestWithContext(ctx, "POST", "http://corral"+commandsPath(p.ID), strings.NewReader(`{"command":{"type":"argv","file":"true"}}`))
	req.Header.Set("Authorization", "Bearer "+tok)
	resp, err := e.http.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body := make([]byte, 512)
	n, _ := resp.Body.Read(body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("Retry-After") != "1" {
		t.Fatalf("second command: %d, Retry-After %q: %s", resp.StatusCode, resp.Header.Get("Retry-After"), body[:n])
	}
	if kind, msg, _, _ := apiError(t, body[:n]); kind != string(sandbox.KindPrepare) || !strings.Contains(msg, "budget of 1 concurrent commands is exhausted") {
		t.Errorf("second command: %s %q", kind, msg)
	}
	if fake.Calls() != calls {
		t.Error("a refused command reached the provider")
	}

	// One session runs, the second is refused before the upgrade.
	c, _, err := e.dialSession(ctx, tok, p.ID, "sleep", "30")
	if err != nil {
		t.Fatal(err)
	}
	if _, resp, err := e.dialSession(ctx, tok, p.ID, "true"); err == nil || resp == nil || resp.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("second session: %v %v", resp, err)
	}
	c.CloseNow()
	testenv.WaitFor(t, 5*time.Second, "the session's reservation to be given back", func() bool {
		_, u := lim.Usage(alice.ID)
		return u.Sessions == 0
	})
	cancel()
	<-done
	testenv.WaitFor(t, 5*time.Second, "the command's reservation to be given back", func() bool {
		_, u := lim.Usage(alice.ID)
		return u.Commands == 0
	})
	if status, body := e.do(context.Background(), "POST", commandsPath(p.ID), tok, cmdBody("true")); status != 200 {
		t.Fatalf("after the first settled: %d %s", status, body)
	}
}
