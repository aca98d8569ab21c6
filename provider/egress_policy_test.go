package provider

import (
	"context"
	"path/filepath"
	"sync"
	"testing"

	"github.com/corral-sandbox/corral/egress"
	"github.com/corral-sandbox/corral/internal/testworker"
	"github.com/corral-sandbox/corral/lease"
	"github.com/corral-sandbox/corral/machine"
	"github.com/corral-sandbox/corral/sandbox"
	"github.com/corral-sandbox/corral/store"
)

var _ PolicyEgress = (*egress.Manager)(nil)

// policyEgress records the stored policy each session started under, and
// whether it was handed over (SessionPolicy) or read (Session).
type policyEgress struct {
	st store.Store
	mu sync.Mutex
	// got is the stored policy of each session; read counts the sessions
	// that read it themselves.
	got  []string
	read int
}

func (e *policyEgress) Session(ctx context.Context, p machine.Project, _ int64, _ string) (map[string]string, func(), error) {
	s, err := e.st.EgressPolicy(ctx, p.ID)
	if err != nil {
		return nil, nil, err
	}
	e.mu.Lock()
	e.got, e.read = append(e.got, s), e.read+1
	e.mu.Unlock()
	return nil, func() {}, nil
}

func (e *policyEgress) SessionPolicy(_ context.Context, _ machine.Project, _ int64, _, stored string, _ int64) (map[string]string, func(), error) {
	e.mu.Lock()
	e.got = append(e.got, stored)
	e.mu.Unlock()
	return nil, func() {}, nil
}

func (e *policyEgress) last() (string, int) {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.got[len(e.got)-1], e.read
}

// TestTightenedPolicyAppliesToNextCommand: a managed command's session
// starts under the egress policy its preparation read with the tenancy
// (from the store's cache: no read of its own), yet a policy tightened by
// another process (a second Store on the file) applies to the very next
// command, and so does a policy removed (mode none). (Fails without schema
// 17's triggers: the cached read's policy would still be the loose one.)
func TestTightenedPolicyAppliesToNextCommand(t *testing.T) {
	w := testworker.Start(t, testworker.Options{})
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "corral.db")
	st, err := store.Open(ctx, path, store.Options{Migrate: true})
	must(t, err)
	t.Cleanup(func() { st.Close() })
	other, err := store.Open(ctx, path, store.Options{}) // another process: the admin's
	must(t, err)
	t.Cleanup(func() { other.Close() })
	acct, err := st.CreateAccount(ctx, "alice")
	must(t, err)
	proj, err := st.CreateProject(ctx, store.NewProject{Kind: store.ProjectManaged, Name: "m", Root: w.Workspace(t, "m")})
	must(t, err)
	_, err = st.AddMember(ctx, store.Member{Project: proj.ID, Account: acct.ID, Role: store.RoleOwner})
	must(t, err)
	gw := machine.New(machine.SocketTransport{Path: w.Socket}, machine.Options{})
	t.Cleanup(func() { gw.Close() })
	eg := &policyEgress{st: st}
	p, err := New(Options{Store: st, Leases: lease.NewManager(st, lease.Options{}), Gateway: gw, Egress: eg})
	must(t, err)
	ctrl := sandbox.NewControl(p, sandbox.ControlOptions{})
	actor := sandbox.Actor{AccountUserID: acct.ID}
	in := sandbox.ExecInput{
		Command:   sandbox.Command{Type: sandbox.CommandTypeArgv, File: "true"},
		LeaseKind: sandbox.LeaseTerminal,
		Project:   sandbox.ProjectRef{Kind: sandbox.ProjectManaged, ProjectID: proj.ID},
	}
	// run runs one command and returns the stored policy its session got.
	run := func(what string) string {
		t.Helper()
		if _, err := ctrl.RunCommand(ctx, in, &actor, nil); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		got, read := eg.last()
		if read != 0 {
			t.Fatalf("%s: %d session(s) read the policy again", what, read)
		}
		return got
	}
	stored := func(what string) string {
		t.Helper()
		s, err := other.EgressPolicy(ctx, proj.ID)
		must(t, err)
		if s == "" {
			t.Fatalf("%s: no policy stored", what)
		}
		return s
	}

	_, err = egress.StorePolicy(ctx, other, proj.ID, egress.Policy{Mode: egress.ModeProxy, Allow: []string{"*.example.com", "example.org"}})
	must(t, err)
	loose := stored("loose")
	for i := range 3 { // the later ones from the cache
		if got := run("loose policy"); got != loose {
			t.Fatalf("command %d under %q, want the loose policy %q", i, got, loose)
		}
	}
	_, err = egress.StorePolicy(ctx, other, proj.ID, egress.Policy{Mode: egress.ModeProxy, Allow: []string{"example.org"}})
	must(t, err)
	tight := stored("tight")
	if got := run("after tightening"); got != tight {
		t.Fatalf("the command after the tightening ran under %q, want %q", got, tight)
	}
	if got := run("again"); got != tight {
		t.Fatalf("the next command ran under %q, want %q", got, tight)
	}
	// Back to mode none: at once too.
	_, err = egress.StorePolicy(ctx, other, proj.ID, egress.Policy{Mode: egress.ModeNone})
	must(t, err)
	none := stored("none")
	if got := run("mode none"); got != none {
		t.Fatalf("after mode none: %q, want %q", got, none)
	}
}
