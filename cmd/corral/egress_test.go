package main

import (
	"bytes"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestProjectEgressCommands: set and show a policy; a bad one is refused
// and leaves the stored one.
func TestProjectEgressCommands(t *testing.T) {
	state := t.TempDir()
	run := func(args ...string) (string, int) {
		var out, errb bytes.Buffer
		status := execute(append(args, "--state", state), &out, &errb)
		return out.String() + errb.String(), status
	}
	if out, st := run("account", "create", "alice"); st != 0 {
		t.Fatal(out)
	}
	if out, st := run("project", "create", "p", "--managed", "--owner", "alice"); st != 0 {
		t.Fatal(out)
	}
	if out, _ := run("project", "egress", "show", "p"); !strings.Contains(out, "mode none") {
		t.Errorf("default: %q", out)
	}
	if out, st := run("project", "egress", "set", "p", "--allow", "pypi.org,*.pythonhosted.org", "--deny", "evil.pypi.org"); st != 0 {
		t.Fatal(out)
	}
	if out, st := run("project", "egress", "set", "p", "--mode", "none", "--allow", "x.org"); st == 0 {
		t.Errorf("rules in mode none accepted: %q", out)
	}
	if out, _ := run("project", "egress", "show", "p", "--json"); strings.TrimSpace(out) != `{"mode":"proxy","allow":["pypi.org","*.pythonhosted.org"],"deny":["evil.pypi.org"]}` {
		t.Errorf("show --json: %q", out)
	}
}

// TestRunEgressAllow: `corral run --project DIR --egress-allow` gives one
// run a proxy to what it allows, and the next run is back to none.
func TestRunEgressAllow(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("managed projects need root (CI runs as root)")
	}
	t.Setenv("CORRAL_TEST_AS_MAIN", "1")
	ln, err := net.Listen("tcp", "127.0.0.2:0")
	if err != nil {
		t.Skipf("no 127.0.0.2: %v", err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, "one-off ok") })}
	go srv.Serve(ln)
	defer srv.Close()
	url := "http://" + ln.Addr().String() + "/"
	state := t.TempDir()
	ws := filepath.Join(t.TempDir(), "proj")
	if err := os.Mkdir(ws, 0o755); err != nil {
		t.Fatal(err)
	}
	out, errs, status := corral(t, state, "--project", ws, "--egress-allow", "127.0.0.2", "--egress-allow-cidr", "127.0.0.0/8", "--", "curl", "-sS", url)
	if status != 0 || out != "one-off ok" {
		t.Fatalf("with --egress-allow: %d %q %q", status, out, errs)
	}
	out, _, status = corral(t, state, "--project", ws, "--", "curl", "-sS", "--max-time", "5", url)
	if status == 0 || strings.Contains(out, "one-off ok") {
		t.Errorf("the next run still reached the upstream: %d %q", status, out)
	}
	if _, errs, status := corral(t, state, "--host", t.TempDir(), "--egress-allow", "x.org", "--", "true"); status == 0 {
		t.Errorf("--egress-allow with --host accepted: %q", errs)
	}
}
