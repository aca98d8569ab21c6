package core_test

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/corral-sandbox/corral/core"
	"github.com/corral-sandbox/corral/egress"
	"github.com/corral-sandbox/corral/internal/testworker"
	"github.com/corral-sandbox/corral/machine"
	"github.com/corral-sandbox/corral/store"
)

type testNames map[string]string

func (n testNames) LookupNetIP(_ context.Context, _, host string) ([]netip.Addr, error) {
	if a, ok := n[host]; ok {
		return []netip.Addr{netip.MustParseAddr(a)}, nil
	}
	return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
}

// TestEgressThroughCore: core's egress service arms a proxy-mode project's
// machine before its command runs, gives the command the proxy
// environment, journals the connection, applies a stored policy change to
// the next command, and closes the listeners when the project's sessions
// end; a mode-none project's command gets no proxy and reaches nothing.
func TestEgressThroughCore(t *testing.T) {
	w := testworker.Start(t, testworker.Options{})
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, "upstream says hi")
	}))
	defer up.Close()
	port := up.Listener.Addr().(*net.TCPAddr).Port
	e := build(t, core.Options{Egress: core.EgressOptions{AllowCIDRs: []string{"127.0.0.0/8"},
		Service: egress.Options{Resolver: testNames{"up.test": "127.0.0.1"}}}}, w)
	ctl, err := e.core.Sandbox()
	must(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	st := e.core.Store()
	script := fmt.Sprintf(`echo "proxy=${HTTP_PROXY:-none}"; curl -sS --max-time 5 http://up.test:%d/ || curl -sS --noproxy '*' --max-time 5 http://127.0.0.1:%d/`, port, port)

	res, err := ctl.RunCommand(ctx, e.input(e.managed, "sh", "-c", script), &e.actor, nil)
	must(t, err)
	if !strings.Contains(res.Stdout, "proxy=none") || strings.Contains(res.Stdout, "upstream says hi") {
		t.Errorf("mode none: %+v", res)
	}

	_, err = egress.StorePolicy(ctx, st, e.managed.ID, egress.Policy{Mode: egress.ModeProxy, Allow: []string{"up.test"}})
	must(t, err)
	res, err = ctl.RunCommand(ctx, e.input(e.managed, "sh", "-c", script), &e.actor, nil)
	must(t, err)
	if !strings.Contains(res.Stdout, "proxy=http://127.0.0.1:3128") || !strings.Contains(res.Stdout, "upstream says hi") {
		t.Errorf("mode proxy: %+v", res)
	}
	rows, err := st.EgressLog(ctx, e.managed.ID, 10)
	must(t, err)
	if len(rows) != 1 || rows[0].Verdict != "allowed" || rows[0].Name != "up.test" || rows[0].Account != e.actor.AccountUserID || rows[0].BytesIn == 0 {
		t.Errorf("journal %+v", rows)
	}

	// The listeners are gone with the project's last session: the ports
	// are free in the (still running) machine.
	p := machine.Project{ID: e.managed.ID, Workspace: e.managed.Root}
	for _, port := range []int{egress.HTTPPort, egress.SOCKSPort} {
		ln, err := e.core.Gateway().Listen(ctx, p, port)
		if err != nil {
			t.Fatalf("port %d after the session: %v", port, err)
		}
		ln.Close()
	}

	// A stored change applies to the next command; and to a running one's
	// next connection within the poll (a second).
	_, err = egress.StorePolicy(ctx, st, e.managed.ID, egress.Policy{Mode: egress.ModeProxy, Allow: []string{"up.test"}, Deny: []string{"up.test"}})
	must(t, err)
	res, err = ctl.RunCommand(ctx, e.input(e.managed, "sh", "-c", fmt.Sprintf(`curl -sS -o /dev/null -w '%%{http_code}' http://up.test:%d/`, port)), &e.actor, nil)
	must(t, err)
	if res.Stdout != "403" {
		t.Errorf("after deny: %+v", res)
	}
	_, err = egress.StorePolicy(ctx, st, e.managed.ID, egress.Policy{Mode: egress.ModeProxy, Allow: []string{"up.test"}})
	must(t, err)
	// Denied until the policy changes under the running command.
	live := fmt.Sprintf(`curl -sS -o /dev/null -w '%%{http_code}\n' http://up.test:%d/
while [ ! -e /workspace/go ]; do sleep 0.05; done
for i in $(seq 1 60); do c=$(curl -sS -o /dev/null -w '%%{http_code}' http://up.test:%d/); [ "$c" = 403 ] && break; sleep 0.1; done; echo "$c"`, port, port)
	done := make(chan error, 1)
	var liveRes string
	go func() {
		r, err := ctl.RunCommand(ctx, e.input(e.managed, "sh", "-c", live), &e.actor, nil)
		if r != nil {
			liveRes = r.Stdout
		}
		done <- err
	}()
	waitRows(t, st, e.managed.ID, 3) // the running command's first connection
	_, err = egress.StorePolicy(ctx, st, e.managed.ID, egress.Policy{Mode: egress.ModeProxy, Allow: []string{"up.test"}, Deny: []string{"up.test"}})
	must(t, err)
	must(t, os.WriteFile(e.managed.Root+"/go", nil, 0o644))
	must(t, <-done)
	if liveRes != "200\n403\n" {
		t.Errorf("running command across a policy change: %q", liveRes)
	}
}

func waitRows(t *testing.T, st store.Store, project int64, n int) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		rows, err := st.EgressLog(context.Background(), project, 100)
		if err != nil {
			t.Fatal(err)
		}
		if len(rows) >= n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d egress rows, want %d", len(rows), n)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestEgressArmsBeforeFirstCommand: a proxy-mode project whose machine
// does not run yet has its proxies listening before its first command's
// program starts (the service starts the machine first).
func TestEgressArmsBeforeFirstCommand(t *testing.T) {
	w := testworker.Start(t, testworker.Options{})
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, "first try")
	}))
	defer up.Close()
	port := up.Listener.Addr().(*net.TCPAddr).Port
	e := build(t, core.Options{Egress: core.EgressOptions{AllowCIDRs: []string{"127.0.0.0/8"},
		Service: egress.Options{Resolver: testNames{"up.test": "127.0.0.1"}}}}, w)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	_, err := egress.StorePolicy(ctx, e.core.Store(), e.managed.ID, egress.Policy{Mode: egress.ModeProxy, Allow: []string{"up.test"}})
	must(t, err)
	ctl, err := e.core.Sandbox()
	must(t, err)
	res, err := ctl.RunCommand(ctx, e.input(e.managed, "curl", "-sS", fmt.Sprintf("http://up.test:%d/", port)), &e.actor, nil)
	must(t, err)
	if res.Stdout != "first try" {
		t.Errorf("first command: %+v", res)
	}
}
