package daemon

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/corral-sandbox/corral/api"
	"github.com/corral-sandbox/corral/internal/testenv"
	"github.com/corral-sandbox/corral/sandbox/sandboxtest"
	"github.com/corral-sandbox/corral/store"
)

// TestLongAccessEndsWithItsAuthorization is issue 24's attack 4: a files
// watch, a streamed (NDJSON) command and a plain command of a member kept
// going after the member's token was revoked or the member was removed
// from the project (a watch 519 s later, a command up to its timeoutMs).
// Each must end within a few seconds of the change, say why, kill its
// command and release its lease.
func TestLongAccessEndsWithItsAuthorization(t *testing.T) {
	requireRoot(t)
	acts := []struct {
		name, reason string
		act          func(t *testing.T, e *env, bob store.Account, p store.Project)
	}{
		{"revoked", "token revoked", func(t *testing.T, e *env, bob store.Account, _ store.Project) {
			toks, err := e.st.ListTokens(context.Background(), bob.ID)
			if err != nil || len(toks) != 1 {
				t.Fatal(toks, err)
			}
			if err := e.st.RevokeToken(context.Background(), toks[0].ID); err != nil {
				t.Fatal(err)
			}
		}},
		{"removed", "no longer a member", func(t *testing.T, e *env, bob store.Account, p store.Project) {
			if err := e.st.RemoveMember(context.Background(), p.ID, bob.ID); err != nil {
				t.Fatal(err)
			}
		}},
	}
	// Each access starts as bob and returns a function that waits for its
	// end and says how it ended.
	accesses := []struct {
		name  string
		start func(ctx context.Context, t *testing.T, e *env, tok string, p store.Project, marker string) func() string
	}{
		{"watch", func(ctx context.Context, t *testing.T, e *env, tok string, p store.Project, _ string) func() string {
			c, resp, err := websocket.Dial(ctx, "ws://corral"+filesPath(p.ID, "watch", qp("path", "/workspace", "recursive", "1")), &websocket.DialOptions{
				HTTPClient: e.http, HTTPHeader: http.Header{"Authorization": {"Bearer " + tok}},
			})
			if err != nil {
				t.Fatalf("watch: %v %v", err, resp)
			}
			// The watch is live once it reports a change.
			if err := os.WriteFile(filepath.Join(p.Root, "before"), nil, 0o644); err != nil {
				t.Fatal(err)
			}
			if _, _, err := c.Read(ctx); err != nil {
				t.Fatalf("watch read: %v", err)
			}
			return func() string {
				defer c.CloseNow()
				for {
					if _, _, err := c.Read(ctx); err != nil {
						var ce websocket.CloseError
						if errors.As(err, &ce) && ce.Code == websocket.StatusPolicyViolation {
							return ce.Reason
						}
						return "read: " + err.Error()
					}
				}
			}
		}},
		{"streamed command", func(ctx context.Context, t *testing.T, e *env, tok string, p store.Project, marker string) func() string {
			resp := e.post(ctx, t, tok, p.ID, api.MediaNDJSON, "echo up; exec sleep "+marker)
			lines := bufio.NewScanner(resp.Body)
			if !lines.Scan() || !strings.Contains(lines.Text(), "up") {
				t.Fatalf("first line %q: %v", lines.Text(), lines.Err())
			}
			return func() string {
				defer resp.Body.Close()
				var last string
				for lines.Scan() {
					last = lines.Text()
				}
				var body struct {
					Error struct{ Kind, Message string }
				}
				if err := json.Unmarshal([]byte(last), &body); err != nil || body.Error.Kind != KindForbidden {
					return "last line " + last
				}
				return body.Error.Message
			}
		}},
		{"command", func(ctx context.Context, t *testing.T, e *env, tok string, p store.Project, marker string) func() string {
			respc := make(chan *http.Response, 1)
			go func() { respc <- e.post(ctx, t, tok, p.ID, "application/json", "touch started; exec sleep "+marker) }()
			testenv.WaitFor(t, 5*time.Second, "the command to start", func() bool {
				_, err := os.Stat(filepath.Join(p.Root, "started"))
				return err == nil
			})
			return func() string {
				resp := <-respc
				if resp == nil {
					return "no response"
				}
				defer resp.Body.Close()
				var body struct {
					Error struct{ Kind, Message string }
				}
				if err := json.NewDecoder(resp.Body).Decode(&body); err != nil || resp.StatusCode != http.StatusForbidden || body.Error.Kind != KindForbidden {
					return resp.Status + " " + body.Error.Kind + " " + body.Error.Message
				}
				return body.Error.Message
			}
		}},
	}
	for _, act := range acts {
		for _, ac := range accesses {
			t.Run(act.name+"/"+ac.name, func(t *testing.T) {
				e := newEnv(t, envOpts{})
				owner, _ := e.account("owner")
				bob, tok := e.account("bob")
				p := e.hostProject("box", owner)
				if _, err := e.st.AddMember(context.Background(), store.Member{Project: p.ID, Account: bob.ID, Role: store.RoleMember}); err != nil {
					t.Fatal(err)
				}
				ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
				defer cancel()
				marker := sandboxtest.SleepToken()
				wait := ac.start(ctx, t, e, tok, p, marker)
				act.act(t, e, bob, p)
				changed := time.Now()
				how := wait()
				if took := time.Since(changed); took > 5*time.Second {
					t.Errorf("the %s ended %v after the change", ac.name, took)
				}
				if !strings.Contains(how, act.reason) {
					t.Errorf("the %s ended with %q, want the reason %q", ac.name, how, act.reason)
				}
				sandboxtest.AssertNoProcesses(t, marker)
				testenv.WaitFor(t, 5*time.Second, "the leases to be released", func() bool { return e.liveLeases() == 0 })
			})
		}
	}
}

// post sends a command (sh -c script) and returns the response once its
// headers arrived.
func (e *env) post(ctx context.Context, t *testing.T, tok string, id int64, accept, script string) *http.Response {
	t.Helper()
	body := cmdBody("sh", "-c", script)
	body["timeoutMs"] = 50000
	b, _ := json.Marshal(body)
	req, err := http.NewRequestWithContext(ctx, "POST", "http://corral"+commandsPath(id), bytes.NewReader(b))
	if err != nil {
		t.Error(err)
		return nil
	}
	req.Header.Set("Authorization", "Bearer "+tok)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", accept)
	resp, err := e.http.Do(req)
	if err != nil {
		t.Errorf("POST: %v", err)
		return nil
	}
	return resp
}

// TestWatchDoesNotPinProject is the rest of issue 24's attack 4: a
// member's files watch held a "files" lease for as long as it stayed
// open, so the owner's DELETE of the project answered 409 with no way to
// end it. The delete must succeed, and the watch end within a few seconds.
func TestWatchDoesNotPinProject(t *testing.T) {
	requireRoot(t)
	e := newEnv(t, envOpts{})
	owner, otok := e.account("owner")
	bob, tok := e.account("bob")
	p := e.hostProject("box", owner)
	if _, err := e.st.AddMember(context.Background(), store.Member{Project: p.ID, Account: bob.ID, Role: store.RoleMember}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c, resp, err := websocket.Dial(ctx, "ws://corral"+filesPath(p.ID, "watch", qp("path", "/workspace")), &websocket.DialOptions{
		HTTPClient: e.http, HTTPHeader: http.Header{"Authorization": {"Bearer " + tok}},
	})
	if err != nil {
		t.Fatalf("watch: %v %v", err, resp)
	}
	defer c.CloseNow()
	if err := os.WriteFile(filepath.Join(p.Root, "before"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, _, err := c.Read(ctx); err != nil {
		t.Fatalf("watch read: %v", err)
	}
	if status, b := e.do(ctx, "DELETE", fmt.Sprintf("/v1/projects/%d", p.ID), otok, nil); status != http.StatusNoContent {
		t.Fatalf("the owner's DELETE with a member's watch open: %d %s", status, b)
	}
	deleted := time.Now()
	for {
		if _, _, err := c.Read(ctx); err != nil {
			var ce websocket.CloseError
			if !errors.As(err, &ce) || ce.Code != websocket.StatusPolicyViolation {
				t.Errorf("the watch of a deleted project ended with %v, want 1008", err)
			}
			break
		}
	}
	if took := time.Since(deleted); took > 5*time.Second {
		t.Errorf("the watch ended %v after the delete", took)
	}
}
