package daemon

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"

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

	if status, body := e.do(ctx, "PUT", path, bobTok, MachineJSON{Image: "base"}); status != http.StatusForbidden {
		t.Errorf("member sets the machine: %d %s", status, body)
	}
	if status, body := e.do(ctx, "PUT", fmt.Sprintf("/v1/projects/%d/machine", h.ID), tok, MachineJSON{}); status != http.StatusBadRequest {
		t.Errorf("host project: %d %s", status, body)
	}
	if status, body := e.do(ctx, "PUT", path, tok, MachineJSON{Image: "../etc"}); status != http.StatusBadRequest {
		t.Errorf("bad image name: %d %s", status, body)
	}
	status, body := e.do(ctx, "PUT", path, tok, MachineJSON{Image: "nosuch", Limits: LimitsJSON{Memory: 300 << 20, CPUMillis: 1500}})
	var got MachineJSON
	if status != 200 || json.Unmarshal(body, &got) != nil || got.Image != "nosuch" || got.Limits.Memory != 300<<20 || got.Limits.CPUMillis != 1500 {
		t.Fatalf("set machine: %d %s", status, body)
	}
	status, body = e.do(ctx, "POST", commandsPath(p.ID), tok, cmdBody("true"))
	if status == 200 || !strings.Contains(string(body), "nosuch") {
		t.Fatalf("a command with an unknown image: %d %s", status, body)
	}
	if status, body := e.do(ctx, "PUT", path, tok, MachineJSON{}); status != 200 || !strings.Contains(string(body), `"image":"base"`) {
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
