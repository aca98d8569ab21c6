package daemon

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/corral-sandbox/corral/api"
	"github.com/corral-sandbox/corral/internal/testenv"
	"github.com/corral-sandbox/corral/store"
)

// TestRemovedMembersProcessDoesNotPinProject: a member starts a background
// process (no client holds it; its lease keeps the project busy) and is
// then removed, or its token revoked. The owner must not be left with a
// project it cannot delete because of the process of someone who no
// longer has access: once the member loses access its process ends (or
// the owner's DELETE succeeds anyway) within a few seconds.
func TestRemovedMembersProcessDoesNotPinProject(t *testing.T) {
	requireRoot(t)
	for _, how := range []string{"removed", "revoked"} {
		t.Run(how, func(t *testing.T) {
			e := newEnv(t, envOpts{})
			owner, otok := e.account("owner")
			bob, tok := e.account("bob")
			p := e.hostProject("box", owner)
			ctx := context.Background()
			if _, err := e.st.AddMember(ctx, store.Member{Project: p.ID, Account: bob.ID, Role: store.RoleMember}); err != nil {
				t.Fatal(err)
			}
			status, b := e.do(ctx, "POST", fmt.Sprintf("/v1/projects/%d/processes", p.ID), tok, api.ProcessRequest{Argv: []string{"sleep", "300"}})
			if status != http.StatusCreated {
				t.Fatalf("bob's process: %d %s", status, b)
			}
			var proc api.Process
			if err := json.Unmarshal(b, &proc); err != nil {
				t.Fatal(err)
			}
			switch how {
			case "removed":
				if err := e.st.RemoveMember(ctx, p.ID, bob.ID); err != nil {
					t.Fatal(err)
				}
			case "revoked":
				toks, err := e.st.ListTokens(ctx, bob.ID)
				if err != nil || len(toks) != 1 {
					t.Fatal(toks, err)
				}
				if err := e.st.RevokeToken(ctx, toks[0].ID); err != nil {
					t.Fatal(err)
				}
			}
			changed := time.Now()
			want := map[string]string{"removed": "no longer a member", "revoked": "token revoked"}[how]
			testenv.WaitFor(t, 5*time.Second, "bob's process to end", func() bool {
				_, pb := e.do(ctx, "GET", fmt.Sprintf("/v1/projects/%d/processes/%s", p.ID, proc.ID), otok, nil)
				var got api.Process
				return json.Unmarshal(pb, &got) == nil && got.State == api.ProcessKilled && got.Error != nil && strings.Contains(got.Error.Message, want)
			})
			deadline := changed.Add(5 * time.Second)
			for {
				status, b := e.do(ctx, "DELETE", fmt.Sprintf("/v1/projects/%d", p.ID), otok, nil)
				if status == http.StatusNoContent {
					t.Logf("deleted %v after bob was %s", time.Since(changed).Round(time.Millisecond), how)
					break
				}
				if time.Now().After(deadline) {
					_, pb := e.do(ctx, "GET", fmt.Sprintf("/v1/projects/%d/processes/%s", p.ID, proc.ID), otok, nil)
					t.Fatalf("the owner's DELETE 5 s after bob was %s: %d %s (bob's process: %s)", how, status, b, pb)
				}
				time.Sleep(100 * time.Millisecond)
			}
		})
	}
}
