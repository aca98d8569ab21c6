package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestRunProjectPrivateWorker runs `corral run --project DIR` as root: corral
// starts a private worker, registers DIR as a managed project, runs the
// command in its machine at /workspace and stops the worker.
func TestRunProjectPrivateWorker(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("managed projects need root (CI runs as root)")
	}
	// The private worker is this test binary run as corral.
	t.Setenv("CORRAL_TEST_AS_MAIN", "1")
	state := t.TempDir()
	ws := filepath.Join(t.TempDir(), "proj")
	if err := os.Mkdir(ws, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(ws, "hello.txt"), []byte("hi"), 0o644); err != nil {
		t.Fatal(err)
	}
	out, errs, status := corral(t, state, "--json", "--project", ws, "--",
		"sh", "-c", "pwd; cat hello.txt; echo; hostname; touch made; id -u; exit 5")
	if status != 5 {
		t.Fatalf("status = %d, stderr %q, stdout %q", status, errs, out)
	}
	var res struct {
		Stdout string
		Code   *int
	}
	if err := json.Unmarshal([]byte(out), &res); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(res.Stdout), "\n")
	if len(lines) != 4 || lines[0] != "/workspace" || lines[1] != "hi" || !strings.HasPrefix(lines[2], "project-") || lines[3] == "0" {
		t.Fatalf("inside the machine: %q", res.Stdout)
	}
	if _, err := os.Stat(filepath.Join(ws, "made")); err != nil {
		t.Errorf("the workspace is not the project: %v", err)
	}
	// The same project again: registered once, reused.
	out, _, status = corral(t, state, "--project", ws, "--", "git", "--version")
	if status != 0 || !strings.HasPrefix(out, "git version") {
		t.Fatalf("second run: %d %q", status, out)
	}
	// A program that is not there is a start error, not 127.
	_, errs, status = corral(t, state, "--project", ws, "--", "no-such-program-here")
	if status != 125 || !strings.Contains(errs, "corral: start:") {
		t.Fatalf("missing program: %d %q", status, errs)
	}
	// --user: guest root, and a user the machine does not know (a start
	// error: nothing ran).
	out, errs, status = corral(t, state, "--project", ws, "--user", "root", "--", "sh", "-c", "id -u; echo $HOME")
	if status != 0 || out != "0\n/root\n" {
		t.Fatalf("--user root: %d %q %q", status, out, errs)
	}
	_, errs, status = corral(t, state, "--project", ws, "--user", "nosuchuser", "--", "true")
	if status != 125 || !strings.Contains(errs, "corral: start:") || !strings.Contains(errs, "nosuchuser") {
		t.Fatalf("--user nosuchuser: %d %q", status, errs)
	}
	_, errs, status = corral(t, state, "--host", ws, "--user", "root", "--", "true")
	if status != 125 || !strings.Contains(errs, "corral: prepare:") {
		t.Fatalf("--host with --user: %d %q", status, errs)
	}
}
