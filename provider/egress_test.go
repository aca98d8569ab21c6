package provider

import (
	"context"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/corral-sandbox/corral/internal/testworker"
	"github.com/corral-sandbox/corral/lease"
	"github.com/corral-sandbox/corral/machine"
	"github.com/corral-sandbox/corral/sandbox"
	"github.com/corral-sandbox/corral/store"
)

// countingEgress counts the egress sessions not yet released.
type countingEgress struct {
	mu   sync.Mutex
	live int
}

func (e *countingEgress) Session(context.Context, machine.Project, int64, string) (map[string]string, func(), error) {
	e.mu.Lock()
	e.live++
	e.mu.Unlock()
	var once sync.Once
	return nil, func() {
		once.Do(func() {
			e.mu.Lock()
			e.live--
			e.mu.Unlock()
		})
	}, nil
}

func (e *countingEgress) count() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.live
}

// TestManagedEgressReleased: a managed command's egress session is given
// back by the time RunCommand returns, whatever ended the command: its
// exit, its timeout, or the caller's abort. (The session settles with the
// machine's, without a goroutine of the provider's waiting for it: core
// collects its end on every path.)
func TestManagedEgressReleased(t *testing.T) {
	w := testworker.Start(t, testworker.Options{})
	ctx := context.Background()
	st, err := store.Open(ctx, filepath.Join(t.TempDir(), "corral.db"), store.Options{Migrate: true})
	must(t, err)
	t.Cleanup(func() { st.Close() })
	acct, err := st.CreateAccount(ctx, "alice")
	must(t, err)
	proj, err := st.CreateProject(ctx, store.NewProject{Kind: store.ProjectManaged, Name: "m", Root: w.Workspace(t, "m")})
	must(t, err)
	_, err = st.AddMember(ctx, store.Member{Project: proj.ID, Account: acct.ID, Role: store.RoleOwner})
	must(t, err)
	gw := machine.New(machine.SocketTransport{Path: w.Socket}, machine.Options{})
	t.Cleanup(func() { gw.Close() })
	eg := &countingEgress{}
	p, err := New(Options{Store: st, Leases: lease.NewManager(st, lease.Options{}), Gateway: gw, Egress: eg})
	must(t, err)
	ctrl := sandbox.NewControl(p, sandbox.ControlOptions{})
	actor := sandbox.Actor{AccountUserID: acct.ID}
	in := func(argv ...string) sandbox.ExecInput {
		return sandbox.ExecInput{
			Command:   sandbox.Command{Type: sandbox.CommandTypeArgv, File: argv[0], Args: argv[1:]},
			LeaseKind: sandbox.LeaseTerminal,
			Project:   sandbox.ProjectRef{Kind: sandbox.ProjectManaged, ProjectID: proj.ID},
		}
	}

	if _, err := ctrl.RunCommand(ctx, in("true"), &actor, nil); err != nil {
		t.Fatal(err)
	}
	if n := eg.count(); n != 0 {
		t.Fatalf("after an exit: %d egress session(s) held", n)
	}
	_, err = ctrl.RunCommand(ctx, in("sleep", "10"), &actor, &sandbox.RunOptions{Timeout: 200 * time.Millisecond})
	if sandbox.KindOf(err) != sandbox.KindTimeout {
		t.Fatalf("timeout: %v", err)
	}
	if n := eg.count(); n != 0 {
		t.Fatalf("after a timeout: %d egress session(s) held", n)
	}
	actx, cancel := context.WithCancel(ctx)
	_, err = ctrl.RunCommand(actx, in("sleep", "10"), &actor, &sandbox.RunOptions{OnStart: func(sandbox.StartInfo) error {
		time.AfterFunc(200*time.Millisecond, cancel)
		return nil
	}})
	cancel()
	if sandbox.KindOf(err) != sandbox.KindAbort {
		t.Fatalf("abort: %v", err)
	}
	if n := eg.count(); n != 0 {
		t.Fatalf("after an abort: %d egress session(s) held", n)
	}
}
