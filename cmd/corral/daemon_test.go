package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/corral-sandbox/corral/daemon"
	"github.com/corral-sandbox/corral/store"
)

// cli runs corral in-process with the daemon's subcommands registered.
func cli(args ...string) (stdout, stderr string, status int) {
	return cliIn(strings.NewReader(""), args...)
}

// cliIn is cli with stdin.
func cliIn(stdin io.Reader, args ...string) (stdout, stderr string, status int) {
	root := newRoot()
	root.SetIn(stdin)
	if c, _, err := root.Find([]string{"account"}); err != nil || c == root {
		root.AddCommand(daemonCommands()...)
	}
	var out, errb bytes.Buffer
	root.SetArgs(args)
	root.SetOut(&out)
	root.SetErr(&errb)
	err := root.Execute()
	switch e := err.(type) {
	case nil:
	case exitError:
		status = e.status
	default:
		errb.WriteString("corral: " + err.Error() + "\n")
		status = 2
	}
	return out.String(), errb.String(), status
}

func mustCLI(t *testing.T, args ...string) string {
	t.Helper()
	out, errs, status := cli(args...)
	if status != 0 {
		t.Fatalf("corral %v: status %d: %s", args, status, errs)
	}
	return strings.TrimSpace(out)
}

// TestAdminCommands drives account, token and project against a state
// directory, then uses what they made through a running daemon.
func TestAdminCommands(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: host commands are confined by corral's Landlock helper")
	}
	state, err := os.MkdirTemp("", "cc")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(state)
	dir := t.TempDir()
	src := t.TempDir()
	if err := os.WriteFile(filepath.Join(src, "f"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}

	mustCLI(t, "account", "create", "alice", "--state", state)
	mustCLI(t, "account", "create", "bob", "--state", state)
	if _, errs, status := cli("account", "create", "alice", "--state", state); status == 0 {
		t.Errorf("duplicate account accepted: %s", errs)
	}
	tok := mustCLI(t, "token", "create", "alice", "--name", "laptop", "--state", state)
	if !strings.HasPrefix(tok, "corral_") {
		t.Fatalf("token %q", tok)
	}
	hostID := mustCLI(t, "project", "create", "web", "--host", dir, "--owner", "alice", "--state", state)
	boxID := mustCLI(t, "project", "create", "box", "--managed", "--from", src, "--owner", "alice", "--state", state)
	if b, err := os.ReadFile(filepath.Join(state, "projects", "box", "f")); err != nil || string(b) != "x" {
		t.Errorf("managed workspace copy: %q %v", b, err)
	}
	for _, bad := range [][]string{
		{"project", "create", "x", "--owner", "alice"},
		{"project", "create", "x", "--managed", "--host", dir, "--owner", "alice"},
		{"project", "create", "x", "--managed"},
		{"project", "create", "x", "--host", dir, "--git", "file:///x", "--owner", "alice"},
	} {
		if _, _, status := cli(append(bad, "--state", state)...); status == 0 {
			t.Errorf("corral %v accepted", bad)
		}
	}
	mustCLI(t, "project", "add-member", "web", "bob", "--trusted", "--state", state)
	list := mustCLI(t, "project", "list", "--state", state)
	if !strings.Contains(list, "web") || !strings.Contains(list, "box") || !strings.Contains(list, "managed") {
		t.Errorf("project list:\n%s", list)
	}
	// The list says who runs unconfined, and which host projects have
	// the network.
	for _, line := range strings.Split(list, "\n") {
		if f := strings.Fields(line); len(f) > 0 && f[1] == "web" && (f[len(f)-2] != "no" || f[len(f)-1] != "bob") {
			t.Errorf("host project line %q: want network no, trusted bob", line)
		}
	}
	mustCLI(t, "project", "network", "web", "on", "--state", state)
	if list := mustCLI(t, "project", "list", "--state", state); !strings.Contains(list, " yes ") {
		t.Errorf("project list after network on:\n%s", list)
	}
	mustCLI(t, "project", "network", "web", "off", "--state", state)

	sock := startDaemon(t, state)

	out, errs, status := cli("run", "--daemon", sock, "--project-id", hostID, "--token", tok, "--", "sh", "-c", "pwd; exit 3")
	if status != 3 || out != "/workspace\n" {
		t.Errorf("run --daemon: %d %q %q", status, out, errs)
	}
	// Managed projects need a worker this daemon does not have.
	_, errs, status = cli("run", "--daemon", sock, "--project-id", boxID, "--token", tok, "--", "true")
	if status != 125 || !strings.Contains(errs, "no privileged transport in this process") {
		t.Errorf("managed without a worker: %d %q", status, errs)
	}
	mustCLI(t, "project", "delete", "box", "--state", state)
	if _, err := os.Stat(filepath.Join(state, "projects", "box")); !os.IsNotExist(err) {
		t.Errorf("workspace left after delete: %v", err)
	}
}

// startDaemon runs the daemon on state until the test ends.
func startDaemon(t *testing.T, state string) string {
	t.Helper()
	return startDaemonConfig(t, daemon.Config{StateDir: state})
}

// startDaemonConfig runs the daemon of cfg until the test ends and returns
// its socket. A nil cfg.Logger discards the logs.
func startDaemonConfig(t *testing.T, cfg daemon.Config) string {
	t.Helper()
	ready := make(chan string, 1)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	cfg.Ready = func(s string) { ready <- s }
	go func() {
		done <- daemon.Run(ctx, cfg)
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("daemon: %v", err)
		}
	})
	select {
	case s := <-ready:
		return s
	case err := <-done:
		t.Fatalf("daemon: %v", err)
	case <-time.After(20 * time.Second):
		t.Fatal("daemon did not start")
	}
	return ""
}

// TestRunViaDaemonContract: `corral run --daemon` keeps the pinned CLI
// contract (exit statuses, --json bodies).
func TestRunViaDaemonContract(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: host commands are confined by corral's Landlock helper")
	}
	state, err := os.MkdirTemp("", "cc")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(state)
	mustCLI(t, "account", "create", "alice", "--state", state)
	mustCLI(t, "account", "create", "eve", "--state", state)
	tok := mustCLI(t, "token", "create", "alice", "--state", state)
	eve := mustCLI(t, "token", "create", "eve", "--state", state)
	id := mustCLI(t, "project", "create", "web", "--host", t.TempDir(), "--owner", "alice", "--state", state)
	sock := startDaemon(t, state)

	cases := []struct {
		name      string
		args      []string
		token     string
		status    int
		stdout    string
		stderrHas string
		kind      string
	}{
		{name: "success", args: []string{"--", "sh", "-c", "printf out; printf err >&2"}, status: 0, stdout: "out", stderrHas: "err"},
		{name: "nonzero", args: []string{"--", "sh", "-c", "exit 7"}, status: 7},
		{name: "signal", args: []string{"--", "sh", "-c", "kill -TERM $$"}, status: 128 + 15},
		{name: "timeout", args: []string{"--timeout", "300ms", "--", "sh", "-c", "echo partial; exec sleep 10"}, status: 124, stdout: "partial\n", stderrHas: "corral: timeout: ", kind: "timeout"},
		{name: "start", args: []string{"--", "/no/such/program"}, status: 127, stderrHas: "corral: start: fork/exec /no/such/program: no such file or directory\n", kind: "start"},
		{name: "overflow", args: []string{"--stdout-limit", "4B", "--", "sh", "-c", "echo 123456789"}, status: 125, stdout: "1234", stderrHas: "corral: overflow: ", kind: "overflow"},
		{name: "forbidden", token: eve, args: []string{"--", "true"}, status: 125, stderrHas: "corral: prepare: daemon refused (403 forbidden): project 1: no such project, or you are not a member of it", kind: "prepare"},
		{name: "unauthorized", token: "corral_forged", args: []string{"--", "true"}, status: 125, stderrHas: "(401 unauthorized)", kind: "prepare"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			token := tc.token
			if token == "" {
				token = tok
			}
			args := append([]string{"run", "--daemon", sock, "--project-id", id, "--token", token}, tc.args...)
			out, errs, status := cli(args...)
			if status != tc.status {
				t.Fatalf("status = %d, want %d (stderr %q)", status, tc.status, errs)
			}
			if tc.stdout != "" && out != tc.stdout {
				t.Errorf("stdout = %q, want %q", out, tc.stdout)
			}
			if !strings.Contains(errs, tc.stderrHas) {
				t.Errorf("stderr = %q, want it to contain %q", errs, tc.stderrHas)
			}
			out, _, jstatus := cli(append([]string{"run", "--json"}, args[1:]...)...)
			if jstatus != tc.status {
				t.Errorf("--json status = %d, want %d", jstatus, tc.status)
			}
			var obj map[string]json.RawMessage
			if err := json.Unmarshal([]byte(out), &obj); err != nil {
				t.Fatalf("--json stdout %q: %v", out, err)
			}
			if tc.kind != "" {
				var e struct {
					Kind   string `json:"kind"`
					Stdout string `json:"stdout"`
				}
				if err := json.Unmarshal(obj["error"], &e); err != nil || e.Kind != tc.kind {
					t.Errorf("--json error %s (want kind %s)", out, tc.kind)
				}
			} else if _, ok := obj["code"]; !ok {
				t.Errorf("--json result %s", out)
			}
		})
	}
	// The token from the environment.
	t.Setenv("CORRAL_TOKEN", tok)
	if out, errs, status := cli("run", "--daemon", sock, "--project-id", id, "--", "echo", "env"); status != 0 || out != "env\n" {
		t.Errorf("$CORRAL_TOKEN: %d %q %q", status, out, errs)
	}
	// Environment, input and binary output through the daemon.
	if out, errs, status := cliIn(strings.NewReader("in\xff\n"), "run", "--daemon", sock, "--project-id", id, "-i", "-e", "V=x y", "--",
		"sh", "-c", `printf '%s|' "$V"; cat; printf '\376'`); status != 0 || out != "x y|in\xff\n\xfe" {
		t.Errorf("-e -i via daemon: %d %q %q", status, out, errs)
	}
	if _, errs, status := cli("run", "--daemon", sock, "--project-id", id, "-e", "9=x", "--", "true"); status != 125 || !strings.Contains(errs, "corral: prepare: ") {
		t.Errorf("bad name via daemon: %d %q", status, errs)
	}
	// An unreachable daemon: nothing started.
	_, errs, status := cli("run", "--daemon", filepath.Join(state, "nope.sock"), "--project-id", id, "--", "true")
	if status != 125 || !strings.Contains(errs, "corral: prepare: cannot reach the daemon") {
		t.Errorf("unreachable: %d %q", status, errs)
	}
}

// TestAccountGrantHostPaths: `corral account grant|revoke host-paths NAME`
// set the account's grant, and the state directory is 0700 afterwards.
func TestAccountGrantHostPaths(t *testing.T) {
	state := filepath.Join(t.TempDir(), "state")
	mustCLI(t, "account", "create", "carol", "--state", state)
	open := func() store.Store {
		st, err := store.Open(context.Background(), filepath.Join(state, "corral.db"), store.Options{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { st.Close() })
		return st
	}
	granted := func() bool {
		st := open()
		a, err := st.AccountByName(context.Background(), "carol")
		if err != nil {
			t.Fatal(err)
		}
		on, err := st.HostPaths(context.Background(), a.ID)
		if err != nil {
			t.Fatal(err)
		}
		st.Close()
		return on
	}
	if granted() {
		t.Fatal("granted by default")
	}
	mustCLI(t, "account", "grant", "host-paths", "carol", "--state", state)
	if !granted() {
		t.Fatal("grant did not grant")
	}
	mustCLI(t, "account", "revoke", "host-paths", "carol", "--state", state)
	if granted() {
		t.Fatal("revoke did not revoke")
	}
	for _, bad := range [][]string{{"account", "grant", "root", "carol"}, {"account", "grant", "host-paths", "nobody"}} {
		if _, _, status := cli(append(bad, "--state", state)...); status == 0 {
			t.Errorf("corral %v accepted", bad)
		}
	}
	if st, err := os.Stat(state); err != nil || st.Mode().Perm() != 0o700 {
		t.Errorf("state directory: %v %v", st.Mode(), err)
	}
}
