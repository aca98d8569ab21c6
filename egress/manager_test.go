package egress

import (
	"context"
	"net"
	"path/filepath"
	"testing"
	"time"

	"github.com/corral-sandbox/corral/machine"
	"github.com/corral-sandbox/corral/store"
)

// loopGateway arms machines on host loopback listeners.
type loopGateway struct{ noGateway }

func (loopGateway) Listen(context.Context, machine.Project, int) (net.Listener, error) {
	return net.Listen("tcp", "127.0.0.1:0")
}

// TestSessionPolicyKeepsLaterPolicy: a session whose preparation read the
// policy before it was tightened (SessionPolicy with the older version)
// may start after the Manager applied the tightened policy to the
// project's armed machine, which other sessions share; it must not bring
// the loose policy back. A session under a later read applies its policy.
// (Fails when the session's policy is applied whatever its version.)
func TestSessionPolicyKeepsLaterPolicy(t *testing.T) {
	ctx := context.Background()
	st, err := store.Open(ctx, filepath.Join(t.TempDir(), "corral.db"), store.Options{Migrate: true})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	p, err := st.CreateProject(ctx, store.NewProject{Kind: store.ProjectManaged, Name: "p", Root: "/p"})
	if err != nil {
		t.Fatal(err)
	}
	mg, err := NewManager(ManagerOptions{Store: st, Gateway: loopGateway{}, Poll: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	defer mg.Close()
	mp := machine.Project{ID: p.ID, Workspace: "/p"}
	store := func(allow ...string) (string, int64) {
		t.Helper()
		if _, err := StorePolicy(ctx, st, p.ID, Policy{Mode: ModeProxy, Allow: allow}); err != nil {
			t.Fatal(err)
		}
		s, v, err := st.EgressPolicyAt(ctx, p.ID)
		if err != nil {
			t.Fatal(err)
		}
		return s, v
	}
	allowed := func(name string) bool {
		t.Helper()
		mg.mu.Lock()
		m := mg.machines[p.ID].m
		mg.mu.Unlock()
		if m == nil {
			t.Fatal("machine not armed")
		}
		return m.rules.Load().CheckName(name, 443).Allowed
	}

	loose, v1 := store("a.example", "b.example")
	_, rel1, err := mg.Session(ctx, mp, 1) // a session running throughout
	if err != nil {
		t.Fatal(err)
	}
	defer rel1()
	if !allowed("a.example") {
		t.Fatal("loose policy: a.example refused")
	}
	tight, v2 := store("b.example")
	mg.PolicyChanged(ctx, p.ID)
	if allowed("a.example") {
		t.Fatal("tightened policy not applied")
	}
	// Prepared before the tightening, started after it.
	_, rel2, err := mg.SessionPolicy(ctx, mp, 1, loose, v1)
	if err != nil {
		t.Fatal(err)
	}
	defer rel2()
	if allowed("a.example") {
		t.Fatal("a session prepared under the older policy loosened the armed machine again")
	}
	if !allowed("b.example") {
		t.Fatal("b.example refused under the tightened policy")
	}
	// A later read applies.
	tighter, v3 := store("c.example")
	_, rel3, err := mg.SessionPolicy(ctx, mp, 1, tighter, v3)
	if err != nil {
		t.Fatal(err)
	}
	defer rel3()
	if allowed("b.example") || !allowed("c.example") {
		t.Fatalf("the later read's policy (%s at %d, after %s at %d) not applied", tighter, v3, tight, v2)
	}
}
