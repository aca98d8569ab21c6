package daemon

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/corral-sandbox/corral/internal/testenv"
	"github.com/corral-sandbox/corral/sandbox"
	"github.com/corral-sandbox/corral/sandbox/sandboxtest"
)

// dialQuery opens a raw session with the query q in project id.
func (e *env) dialQuery(ctx context.Context, token string, id int64, q url.Values) (*websocket.Conn, *http.Response, error) {
	return websocket.Dial(ctx, fmt.Sprintf("ws://corral/v1/projects/%d/sessions?%s", id, q.Encode()), &websocket.DialOptions{
		HTTPClient: e.http,
		HTTPHeader: http.Header{"Authorization": {"Bearer " + token}},
	})
}

// TestSessionEnv: &env=K=V reaches the command (a value may contain '=',
// a later K wins, the sandbox's defaults stay); a bad name is refused with
// 400 before any provider call.
func TestSessionEnv(t *testing.T) {
	fake := &sandboxtest.Provider{Dir: t.TempDir(), Kind: sandbox.ProjectManaged}
	e := newEnv(t, envOpts{fake: fake})
	alice, tok := e.account("alice")
	p := e.managedProject("box", alice)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	for _, bad := range [][]string{{"1X=y"}, {"NOEQUALS"}, {"=v"}, {"A B=c"}, {"OK=1", "BAD-NAME=2"}} {
		_, resp, err := e.dialQuery(ctx, tok, p.ID, url.Values{"argv": {"true"}, "env": bad})
		if err == nil || resp == nil || resp.StatusCode != http.StatusBadRequest {
			t.Errorf("env %q: %v %v; want 400", bad, resp, err)
		}
	}
	if n := fake.Calls(); n != 0 {
		t.Fatalf("refused environments reached the provider %d times", n)
	}

	q := url.Values{"argv": {"sh", "-c", `printf '%s|%s|%s' "$A" "$B" "$PATH"`}, "env": {"A=first", "B=x=y==z", "A=1"}}
	c, _, err := e.dialQuery(ctx, tok, p.ID, q)
	if err != nil {
		t.Fatal(err)
	}
	tr := readSession(ctx, c)
	if got := tr.stdout.String(); !strings.HasPrefix(got, "1|x=y==z|/") {
		t.Errorf("the command saw %q", got)
	}
	if last := tr.last(); last["type"] != "exit" || last["code"] != float64(0) {
		t.Errorf("control %v", tr.control)
	}
}

// TestHostSessionConfinedAsRunCommand is the attack on daemon/local.go's
// removal: a host project's WebSocket session (plain and on a terminal)
// runs exactly as confined as its one-shot command — the same user and
// groups, no capabilities, no_new_privs, a pid and network namespace of
// its own, and Landlock refusing to read or write a world-writable
// directory outside the project — and the environment it was given.
func TestHostSessionConfinedAsRunCommand(t *testing.T) {
	requireRoot(t)
	e := newEnv(t, envOpts{})
	alice, tok := e.account("alice")
	p := e.hostProject("web", alice)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	// Outside every root, open to everyone by its permissions: only
	// Landlock keeps the command out.
	probe, err := os.MkdirTemp("", "corral-probe")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(probe)
	if err := os.Chmod(probe, 0o777); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(probe, "readable"), []byte("secret\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	// The host's namespaces, as a thread of this process that never
	// changed them has them: /proc/self names the main thread's, which a
	// goroutine that locked it and entered a namespace (confine's offline
	// network, say) may have left wedged there.
	hostPid, hostNet := threadNamespaces(t)
	script := `echo "uid=$(id -u) gid=$(id -g) groups=$(id -G)"
grep -E '^(NoNewPrivs|CapInh|CapPrm|CapEff|CapBnd|CapAmb):' /proc/self/status
[ "$(readlink /proc/self/ns/pid)" = "$HOSTPID" ] && echo pid-ns=host || echo pid-ns=own
[ "$(readlink /proc/self/ns/net)" = "$HOSTNET" ] && echo net-ns=host || echo net-ns=own
(echo x > "$PROBE/written") 2>/dev/null && echo write=allowed || echo write=denied
cat "$PROBE/readable" 2>/dev/null || echo read=denied
echo "probe-env=$PROBE_ENV"`
	env := map[string]string{"HOSTPID": hostPid, "HOSTNET": hostNet, "PROBE": probe, "PROBE_ENV": "a=b"}

	body := cmdBody("sh", "-c", script)
	body["env"] = env
	status, b := e.do(ctx, "POST", commandsPath(p.ID), tok, body)
	if status != 200 {
		t.Fatalf("command: %d %s", status, b)
	}
	var res struct{ Stdout, Stderr string }
	if err := json.Unmarshal(b, &res); err != nil {
		t.Fatal(err)
	}
	want := res.Stdout
	for _, line := range []string{"pid-ns=own", "net-ns=own", "write=denied", "read=denied", "NoNewPrivs:\t1", "CapEff:\t0000000000000000", "CapBnd:\t0000000000000000", "probe-env=a=b"} {
		if !strings.Contains(want, line) {
			t.Fatalf("the one-shot command is not confined as expected (%q missing):\n%s%s", line, want, res.Stderr)
		}
	}
	if strings.Contains(want, "uid=0 ") {
		t.Fatalf("the one-shot command runs as root:\n%s", want)
	}

	var kv []string
	for k, v := range env {
		kv = append(kv, k+"="+v)
	}
	for _, tty := range []bool{false, true} {
		q := url.Values{"argv": {"sh", "-c", script}, "env": kv}
		if tty {
			q.Set("tty", "1")
		}
		c, _, err := e.dialQuery(ctx, tok, p.ID, q)
		if err != nil {
			t.Fatal(err)
		}
		tr := readSession(ctx, c)
		got := strings.ReplaceAll(tr.stdout.String(), "\r\n", "\n")
		if got != want {
			t.Errorf("tty=%v: the session runs otherwise than the command:\nsession:\n%s\ncommand:\n%s", tty, got, want)
		}
		if last := tr.last(); last["type"] != "exit" || last["code"] != float64(0) {
			t.Errorf("tty=%v: control %v", tty, tr.control)
		}
	}
	if _, err := os.Stat(filepath.Join(probe, "written")); err == nil {
		t.Error("a confined command wrote outside the project")
	}
	testenv.WaitFor(t, 5*time.Second, "the leases to be released", func() bool { return e.liveLeases() == 0 })
}

// TestSessionClientVanishesMidOutput is the attack of a client that goes
// away (no close frame) while its command floods output and has a
// grandchild: the whole tree is killed (checked in /proc) and the lease
// released, for a managed project (the fake provider) and a real, confined
// host project.
func TestSessionClientVanishesMidOutput(t *testing.T) {
	fake := &sandboxtest.Provider{Dir: t.TempDir(), Kind: sandbox.ProjectManaged}
	for _, kind := range []string{"managed", "host"} {
		t.Run(kind, func(t *testing.T) {
			var e *env
			var id int64
			var tok string
			if kind == "managed" {
				e = newEnv(t, envOpts{fake: fake})
				alice, tk := e.account("alice")
				id, tok = e.managedProject("box", alice).ID, tk
			} else {
				requireRoot(t)
				e = newEnv(t, envOpts{})
				alice, tk := e.account("alice")
				id, tok = e.hostProject("web", alice).ID, tk
			}
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			token := sandboxtest.SleepToken()
			c, _, err := e.dialSession(ctx, tok, id, "sh", "-c", "sleep "+token+" & while :; do echo flood; done")
			if err != nil {
				t.Fatal(err)
			}
			for n := 0; n < 5; {
				typ, _, err := c.Read(ctx)
				if err != nil {
					t.Fatal(err)
				}
				if typ == websocket.MessageBinary {
					n++
				}
			}
			c.CloseNow()
			sandboxtest.AssertNoProcesses(t, token)
			testenv.WaitFor(t, 5*time.Second, "the lease to be released", func() bool { return e.liveLeases() == 0 })
			if kind == "managed" {
				testenv.WaitFor(t, 5*time.Second, "the fake lease to be released", fake.LastLease().Released)
			}
		})
	}
}

// threadNamespaces returns the pid and network namespaces of a fresh
// locked thread: the process's own, whatever namespaces its discarded
// threads entered.
func threadNamespaces(t *testing.T) (pid, net string) {
	t.Helper()
	done := make(chan struct{})
	go func() {
		defer close(done)
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		pid, _ = os.Readlink("/proc/thread-self/ns/pid")
		net, _ = os.Readlink("/proc/thread-self/ns/net")
	}()
	<-done
	if pid == "" || net == "" {
		t.Fatal("cannot read this process's namespaces")
	}
	return pid, net
}
