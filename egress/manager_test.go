package egress

import (
	"context"
	"errors"
	"net"
	"path/filepath"
	"sync"
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

// projectStore opens a store of its own with one managed project.
func projectStore(t testing.TB) (store.Store, store.Project) {
	t.Helper()
	ctx := context.Background()
	st, err := store.Open(ctx, filepath.Join(t.TempDir(), "corral.db"), store.Options{Migrate: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	p, err := st.CreateProject(ctx, store.NewProject{Kind: store.ProjectManaged, Name: "p", Root: "/p"})
	if err != nil {
		t.Fatal(err)
	}
	return st, p
}

// TestSessionPolicyKeepsLaterPolicy: a session whose preparation read the
// policy before it was tightened (SessionPolicy with the older version)
// may start after the Manager applied the tightened policy to the
// project's armed machine, which other sessions share; it must not bring
// the loose policy back. A session under a later read applies its policy.
// (Fails when the session's policy is applied whatever its version.)
func TestSessionPolicyKeepsLaterPolicy(t *testing.T) {
	ctx := context.Background()
	st, p := projectStore(t)
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
	_, rel1, err := mg.Session(ctx, mp, 1, "lease-1") // a session running throughout
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
	_, rel2, err := mg.SessionPolicy(ctx, mp, 1, "lease-2", loose, v1)
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
	_, rel3, err := mg.SessionPolicy(ctx, mp, 1, "lease-3", tighter, v3)
	if err != nil {
		t.Fatal(err)
	}
	defer rel3()
	if allowed("b.example") || !allowed("c.example") {
		t.Fatalf("the later read's policy (%s at %d, after %s at %d) not applied", tighter, v3, tight, v2)
	}
}

// startGateway has no running machine until a session starts one; it
// records the lease each session runs under.
type startGateway struct {
	mu      sync.Mutex
	running bool
	leases  []string
}

func (g *startGateway) Listen(context.Context, machine.Project, int) (net.Listener, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if !g.running {
		return nil, &machine.RejectedError{Message: "project 1 has no running machine", Err: machine.ErrNoMachine}
	}
	return net.Listen("tcp", "127.0.0.1:0")
}

func (g *startGateway) Exec(_ context.Context, req machine.ExecRequest) (*machine.Session, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.leases = append(g.leases, req.Lease)
	return nil, errors.New("no worker here")
}

// TestMachineStartUnderSessionLease: a proxy-mode project whose machine
// does not run yet has it started by a session of the Manager's own, under
// the lease of the session that needs the proxies — never a lease that no
// one holds. (Fails with the placeholder lease "egress".)
func TestMachineStartUnderSessionLease(t *testing.T) {
	ctx := context.Background()
	st, p := projectStore(t)
	if _, err := StorePolicy(ctx, st, p.ID, Policy{Mode: ModeProxy, Allow: []string{"a.example"}}); err != nil {
		t.Fatal(err)
	}
	gw := &startGateway{}
	mg, err := NewManager(ManagerOptions{Store: st, Gateway: gw, Poll: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	defer mg.Close()
	if _, _, err := mg.Session(ctx, machine.Project{ID: p.ID, Workspace: "/p"}, 1, "the-session-lease"); err == nil {
		t.Fatal("Session armed a machine that could not be started")
	}
	gw.mu.Lock()
	defer gw.mu.Unlock()
	if len(gw.leases) != 1 || gw.leases[0] != "the-session-lease" {
		t.Fatalf("machine started under leases %q, want the session's", gw.leases)
	}
}
