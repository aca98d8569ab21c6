package daemon

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/corral-sandbox/corral/internal/testenv"
	"github.com/corral-sandbox/corral/sandbox"
	"github.com/corral-sandbox/corral/sandbox/sandboxtest"
	"github.com/corral-sandbox/corral/store"
)

// TestSessionsFollowTheirToken: a live session closes with 1008 and the
// reason within 5 s of its token's revocation, its account's deletion or
// its removal from the project, and when it outlives the maximum lifetime;
// its command is cancelled and its lease released.
func TestSessionsFollowTheirToken(t *testing.T) {
	for _, tc := range []struct {
		name   string
		opts   AppOptions
		act    func(t *testing.T, e *env, owner, acct store.Account, p store.Project)
		reason string
	}{
		{name: "revoked", reason: "token revoked", act: func(t *testing.T, e *env, _, acct store.Account, _ store.Project) {
			toks, err := e.st.ListTokens(context.Background(), acct.ID)
			if err != nil || len(toks) != 1 {
				t.Fatal(toks, err)
			}
			if err := e.st.RevokeToken(context.Background(), toks[0].ID); err != nil {
				t.Fatal(err)
			}
		}},
		{name: "account deleted", reason: "account deleted", act: func(t *testing.T, e *env, _, acct store.Account, _ store.Project) {
			if err := e.st.DeleteAccount(context.Background(), acct.ID); err != nil {
				t.Fatal(err)
			}
		}},
		{name: "member removed", reason: "no longer a member", act: func(t *testing.T, e *env, _, acct store.Account, p store.Project) {
			if err := e.st.RemoveMember(context.Background(), p.ID, acct.ID); err != nil {
				t.Fatal(err)
			}
		}},
		// Long enough for python to start under load.
		{name: "lifetime", opts: AppOptions{MaxSessionLifetime: 3 * time.Second}, reason: "session lifetime of 3s reached"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fake := &sandboxtest.Provider{Dir: t.TempDir(), Kind: sandbox.ProjectManaged}
			e := newEnv(t, envOpts{fake: fake, app: tc.opts})
			owner, _ := e.account("owner")
			bob, tok := e.account("bob")
			p := e.managedProject("box", owner)
			if _, err := e.st.AddMember(context.Background(), store.Member{Project: p.ID, Account: bob.ID}); err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			marker := fmt.Sprintf("corral-follow-%d", time.Now().UnixNano())
			c, _, err := e.dialSession(ctx, tok, p.ID, "python3", "-c", "import time; print('up', flush=True); time.sleep(60)", marker)
			if err != nil {
				t.Fatal(err)
			}
			defer c.CloseNow()
			awaitOutput(ctx, t, c, "up\n")
			if tc.act != nil {
				tc.act(t, e, owner, bob, p)
			}
			acted := time.Now()
			tr := readSession(ctx, c)
			if took := time.Since(acted); took > 5*time.Second {
				t.Errorf("session closed %v after the change", took)
			}
			var ce websocket.CloseError
			if !errors.As(tr.closeErr, &ce) || ce.Code != websocket.StatusPolicyViolation || !strings.Contains(ce.Reason, tc.reason) {
				t.Fatalf("close: %v, want 1008 %q", tr.closeErr, tc.reason)
			}
			if m := tr.last(); m["type"] != "error" || !strings.Contains(fmt.Sprint(m["message"]), tc.reason) {
				t.Errorf("last message %v", m)
			}
			sandboxtest.AssertNoProcesses(t, marker)
			testenv.WaitFor(t, 5*time.Second, "the lease to be released", fake.LastLease().Released)
		})
	}
}
