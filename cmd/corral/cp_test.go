package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/corral-sandbox/corral/sandbox"
	"github.com/corral-sandbox/corral/store"
)

// makeTree makes a small tree with a binary file, an empty directory and
// a mode.
func makeTree(t *testing.T, dir string) []byte {
	t.Helper()
	bin := make([]byte, 300<<10)
	for i := range bin {
		bin[i] = byte(i * 7)
	}
	for _, d := range []string{"tree/sub/deep", "tree/empty"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(dir, "tree/bin"), bin, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "tree/sub/deep/x.sh"), []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	return bin
}

func checkTree(t *testing.T, dir string, bin []byte) {
	t.Helper()
	if b, err := os.ReadFile(filepath.Join(dir, "bin")); err != nil || !bytes.Equal(b, bin) {
		t.Errorf("bin: %d bytes, %v", len(b), err)
	}
	if st, err := os.Stat(filepath.Join(dir, "sub/deep/x.sh")); err != nil || st.Mode().Perm() != 0o755 {
		t.Errorf("x.sh: %v %v", st, err)
	}
	if st, err := os.Stat(filepath.Join(dir, "bin")); err != nil || st.Mode().Perm() != 0o600 {
		t.Errorf("bin mode: %v %v", st, err)
	}
	if st, err := os.Stat(filepath.Join(dir, "empty")); err != nil || !st.IsDir() {
		t.Errorf("empty dir: %v", err)
	}
}

// TestCpViaDaemon: a tree goes into a host project and comes back, through
// a daemon; a single file through standard input and output.
func TestCpViaDaemon(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: host projects' files are reached as their confined user")
	}
	state, err := os.MkdirTemp("", "cp")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(state)
	mustCLI(t, "account", "create", "alice", "--state", state)
	tok := mustCLI(t, "token", "create", "alice", "--state", state)
	ws := t.TempDir()
	id := mustCLI(t, "project", "create", "web", "--host", ws, "--owner", "alice", "--state", state)
	sock := startDaemon(t, state)
	local := t.TempDir()
	bin := makeTree(t, local)
	d := []string{"--daemon", sock, "--project-id", id, "--token", tok}

	if _, errs, status := cli(append(append([]string{"cp"}, d...), filepath.Join(local, "tree"), ":/workspace")...); status != 0 {
		t.Fatalf("cp into the project: %d %s", status, errs)
	}
	checkTree(t, filepath.Join(ws, "tree"), bin)
	back := filepath.Join(t.TempDir(), "back")
	if _, errs, status := cli(append(append([]string{"cp"}, d...), ":tree", back)...); status != 0 {
		t.Fatalf("cp out of the project: %d %s", status, errs)
	}
	checkTree(t, back, bin)
	if _, errs, status := cliIn(strings.NewReader("from stdin"), append(append([]string{"cp"}, d...), "-", ":note")...); status != 0 {
		t.Fatalf("cp - :note: %d %s", status, errs)
	}
	if out, errs, status := cli(append(append([]string{"cp"}, d...), ":/workspace/note", "-")...); status != 0 || out != "from stdin" {
		t.Fatalf("cp :note -: %d %q %s", status, out, errs)
	}
	if _, errs, status := cli(append(append([]string{"cp"}, d...), local, back)...); status == 0 || !strings.Contains(errs, "exactly one") {
		t.Errorf("cp host host: %d %s", status, errs)
	}
	if _, errs, status := cli(append(append([]string{"cp"}, d...), ":/workspace/../etc", back)...); status == 0 {
		t.Errorf("cp of a climbing path: %d %s", status, errs)
	}
}

// TestCpProjectPrivateWorker: corral cp --project DIR copies into and out
// of a managed project's machine, each copy under one lease of kind
// "files" taken through the sandbox control (stamped with its domain,
// released at the end) and journaled.
func TestCpProjectPrivateWorker(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("managed projects need root (CI runs as root)")
	}
	t.Setenv("CORRAL_TEST_AS_MAIN", "1")
	state := t.TempDir()
	ws := filepath.Join(t.TempDir(), "proj")
	if err := os.Mkdir(ws, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { stopSharedWorker(t, state) })
	local := t.TempDir()
	bin := makeTree(t, local)
	if _, errs, status := cli("cp", "--state", state, "--project", ws, filepath.Join(local, "tree"), ":/home/corral/t"); status != 0 {
		t.Fatalf("cp into the machine: %d %s", status, errs)
	}
	back := filepath.Join(t.TempDir(), "back")
	if _, errs, status := cli("cp", "--state", state, "--project", ws, ":/home/corral/t", back); status != 0 {
		t.Fatalf("cp out of the machine: %d %s", status, errs)
	}
	checkTree(t, back, bin)

	ctx := context.Background()
	st, err := store.Open(ctx, filepath.Join(state, "corral.db"), store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	leases, err := st.ListLeases(ctx, store.LeaseFilter{})
	if err != nil {
		t.Fatal(err)
	}
	rows, err := st.ListJournal(ctx, store.JournalFilter{})
	if err != nil {
		t.Fatal(err)
	}
	var files []store.Lease
	for _, l := range leases {
		if l.Kind == string(sandbox.LeaseFiles) {
			files = append(files, l)
		}
	}
	if len(files) != 2 {
		t.Fatalf("%d files leases for two copies, want 2: %+v", len(files), leases)
	}
	for _, l := range files {
		if l.Domain == "" || l.State != store.LeaseReleased {
			t.Errorf("lease %s: domain %q, state %s; want a domain and released", l.ID, l.Domain, l.State)
		}
	}
	cps := 0
	for _, r := range rows {
		if r.LeaseKind == string(sandbox.LeaseFiles) && len(r.Argv) > 1 && r.Argv[1] == "cp" && r.End.Outcome == store.OutcomeExit {
			cps++
		}
	}
	if cps != 2 {
		t.Errorf("%d journaled copies, want 2: %+v", cps, rows)
	}
}
