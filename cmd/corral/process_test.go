package main

import (
	"encoding/json"
	"os"
	"strings"
	"testing"
)

// TestProcessViaDaemon drives corral process start|list|logs -f|kill
// against a real daemon and a host project: the process outlives the
// corral that started it, its output is replayed and followed to the
// end, and kill -s and kill reach it.
func TestProcessViaDaemon(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: host commands are confined by corral's Landlock helper")
	}
	state, err := os.MkdirTemp("", "cp")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(state)
	mustCLI(t, "account", "create", "alice", "--state", state)
	tok := mustCLI(t, "token", "create", "alice", "--state", state)
	id := mustCLI(t, "project", "create", "web", "--host", t.TempDir(), "--owner", "alice", "--state", state)
	sock := startDaemon(t, state)
	d := []string{"--daemon", sock, "--project-id", id, "--token", tok}

	pid := mustCLI(t, append(append([]string{"process", "start"}, d...), "-e", "WHO=bg", "--", "sh", "-c", "echo $WHO; echo err >&2; sleep 0.3; echo done")...)
	if !strings.HasPrefix(pid, "proc_") {
		t.Fatalf("start printed %q", pid)
	}
	out, errs, status := cli(append(append([]string{"process", "logs", "-f"}, d...), pid)...)
	if status != 0 || out != "bg\ndone\n" || errs != "err\n" {
		t.Fatalf("logs -f: %d %q %q", status, out, errs)
	}
	list := mustCLI(t, append([]string{"process", "list"}, d...)...)
	if !strings.Contains(list, pid) || !strings.Contains(list, "exited") || !strings.Contains(list, "code 0") {
		t.Errorf("list:\n%s", list)
	}
	var ps []map[string]any
	if err := json.Unmarshal([]byte(mustCLI(t, append([]string{"process", "list", "--json"}, d...)...)), &ps); err != nil || len(ps) != 1 || ps[0]["id"] != pid {
		t.Errorf("list --json: %v %v", ps, err)
	}

	pid = mustCLI(t, append(append([]string{"process", "start"}, d...), "--", "sleep", "30")...)
	if out := mustCLI(t, append(append([]string{"process", "kill", "-s", "TERM"}, d...), pid)...); !strings.Contains(out, pid) {
		t.Errorf("kill -s TERM: %q", out)
	}
	// The signal is sent, not awaited: logs -f follows until the end.
	cli(append(append([]string{"process", "logs", "-f"}, d...), pid)...)
	if out := mustCLI(t, append(append([]string{"process", "kill"}, d...), pid)...); !strings.Contains(out, "SIGTERM") {
		t.Errorf("kill after TERM: %q", out)
	}
	if _, errs, status := cli(append(append([]string{"process", "logs"}, d...), pid)...); status == 0 || !strings.Contains(errs, "404") {
		t.Errorf("logs of a forgotten process: %d %q", status, errs)
	}
}
