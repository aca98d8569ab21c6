package daemon

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/corral-sandbox/corral/api"
	"github.com/corral-sandbox/corral/sandbox"
	"github.com/corral-sandbox/corral/store"
)

// TestMachineSpecAndReset: owners set a managed project's image and limits
// (members may not, host projects have none), the spec is what the next
// command's machine is built from (an unknown image fails the command),
// and a reset discards guest root's changes — refused with 409 while a
// lease is live.
func TestMachineSpecAndReset(t *testing.T) {
	e := newManagedEnv(t)
	ctx := context.Background()
	alice, tok := e.account("alice")
	bob, bobTok := e.account("bob")
	p := e.managedProject("box", alice)
	if _, err := e.app.store.AddMember(ctx, store.Member{Project: p.ID, Account: bob.ID, Role: store.RoleMember}); err != nil {
		t.Fatal(err)
	}
	h := e.hostProject("web", alice)
	path := fmt.Sprintf("/v1/projects/%d/machine", p.ID)

	if status, body := e.do(ctx, "PUT", path, bobTok, api.Machine{Image: "base"}); status != http.StatusForbidden {
		t.Errorf("member sets the machine: %d %s", status, body)
	}
	if status, body := e.do(ctx, "PUT", fmt.Sprintf("/v1/projects/%d/machine", h.ID), tok, api.Machine{}); status != http.StatusBadRequest {
		t.Errorf("host project: %d %s", status, body)
	}
	if status, body := e.do(ctx, "PUT", path, tok, api.Machine{Image: "../etc"}); status != http.StatusBadRequest {
		t.Errorf("bad image name: %d %s", status, body)
	}
	status, body := e.do(ctx, "PUT", path, tok, api.Machine{Image: "nosuch", Limits: api.Limits{Memory: 300 << 20, CPUMillis: 500}})
	var got api.Machine
	if status != 200 || json.Unmarshal(body, &got) != nil || got.Image != "nosuch" || got.Limits.Memory != 300<<20 || got.Limits.CPUMillis != 500 {
		t.Fatalf("set machine: %d %s", status, body)
	}
	status, body = e.do(ctx, "POST", commandsPath(p.ID), tok, cmdBody("true"))
	if status == 200 || !strings.Contains(string(body), "nosuch") {
		t.Fatalf("a command with an unknown image: %d %s", status, body)
	}
	if status, body := e.do(ctx, "PUT", path, tok, api.Machine{}); status != 200 || !strings.Contains(string(body), `"image":"base"`) {
		t.Fatalf("back to base: %d %s", status, body)
	}
	if status, body := e.do(ctx, "GET", fmt.Sprintf("/v1/projects/%d", p.ID), tok, nil); status != 200 || !strings.Contains(string(body), `"machine":{"image":"base"`) {
		t.Errorf("project: %d %s", status, body)
	}

	// /var/tmp is the image's (sticky, world-writable): a change of the
	// upper layer.
	if status, body := e.do(ctx, "POST", commandsPath(p.ID), tok, cmdBody("sh", "-c", "echo x > /var/tmp/mark")); status != 200 || !strings.Contains(string(body), `"code":0`) {
		t.Fatalf("write: %d %s", status, body)
	}
	reset := fmt.Sprintf("/v1/projects/%d/reset", p.ID)
	if status, body := e.do(ctx, "POST", reset, bobTok, nil); status != http.StatusForbidden {
		t.Errorf("member resets: %d %s", status, body)
	}
	ctl, err := e.core.Sandbox()
	if err != nil {
		t.Fatal(err)
	}
	prep, err := ctl.PrepareExecution(ctx, sandbox.ExecInput{
		Command: sandbox.Command{Type: "argv", File: "true"}, LeaseKind: sandbox.LeaseTerminal, Project: projectRef(p),
	}, &sandbox.Actor{AccountUserID: alice.ID})
	if err != nil {
		t.Fatal(err)
	}
	if status, body := e.do(ctx, "POST", reset, tok, nil); status != http.StatusConflict {
		t.Errorf("reset while leased: %d %s", status, body)
	}
	if err := prep.Common().Lease.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if status, body := e.do(ctx, "POST", reset, tok, nil); status != http.StatusNoContent {
		t.Fatalf("reset: %d %s", status, body)
	}
	if status, body := e.do(ctx, "POST", commandsPath(p.ID), tok, cmdBody("test", "-e", "/var/tmp/mark")); status != 200 || !strings.Contains(string(body), `"code":1`) {
		t.Fatalf("the change survived the reset: %d %s", status, body)
	}
}

// TestOwnerCannotLiftMachineLimits is an attack: every account may create
// a project and so owns one; an owner that is not a daemon admin asking
// for no limit (negative) or for more than the daemon's ceiling
// (AppOptions.OwnerLimits, the machines' defaults) would take the host's
// memory, tasks, CPU and disk for one tenant. It is refused with 403 and
// the stored limits are unchanged; lowering a limit is allowed, and an
// admin may lift any.
func TestOwnerCannotLiftMachineLimits(t *testing.T) {
	e := newEnv(t, envOpts{app: AppOptions{Admins: []string{"root"}, OwnerLimits: api.Limits{Disk: 1 << 30}}})
	ctx := context.Background()
	alice, tok := e.account("alice")
	_, rootTok := e.account("root")
	p := e.managedProject("box", alice)
	path := fmt.Sprintf("/v1/projects/%d/machine", p.ID)
	for _, l := range []api.Limits{
		{Pids: -1}, {Memory: -1}, {CPUMillis: -1}, {Tmp: -1}, {Disk: -1},
		{Memory: 1 << 40}, {Pids: 1 << 20}, {CPUMillis: 64000}, {Tmp: 1 << 40}, {Disk: 1 << 40},
	} {
		status, body := e.do(ctx, "PUT", path, tok, api.Machine{Limits: l})
		if status != http.StatusForbidden || !strings.Contains(string(body), "admin") {
			t.Errorf("owner sets %+v: %d %s", l, status, body)
		}
	}
	if got, err := e.st.GetProject(ctx, p.ID); err != nil || got.Limits != (store.MachineLimits{}) {
		t.Fatalf("stored limits after refusals: %+v %v", got.Limits, err)
	}
	lower := api.Limits{Memory: 300 << 20, Pids: 100, CPUMillis: 500, Tmp: 16 << 20, Disk: 64 << 20}
	if status, body := e.do(ctx, "PUT", path, tok, api.Machine{Limits: lower}); status != http.StatusOK {
		t.Errorf("owner lowers the limits: %d %s", status, body)
	}
	if status, body := e.do(ctx, "PUT", path, rootTok, api.Machine{Limits: api.Limits{Pids: -1, Memory: 1 << 40}}); status != http.StatusOK {
		t.Errorf("admin lifts the limits: %d %s", status, body)
	}
}
