package main

import (
	"context"
	"os"
	"strings"
	"testing"

	"github.com/corral-sandbox/corral/daemon"
	"github.com/corral-sandbox/corral/internal/pgtest"
	"github.com/corral-sandbox/corral/store"
)

// TestStoreCopyCLI: an installation the administrative commands and a
// real daemon made on SQLite (a command run through the daemon is in its
// journal) moves to PostgreSQL with corral store copy; the same commands
// then read it there through --store, a daemon on --store runs the same
// project for the same token, and a second copy into the now non-empty
// database is refused.
func TestStoreCopyCLI(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: host commands are confined by corral's Landlock helper")
	}
	url := pgtest.NewDatabase(t)
	state := shortTempDir(t)
	mustCLI(t, "account", "create", "bob", "--state", state)
	tok := strings.TrimSpace(mustCLI(t, "token", "create", "bob", "--name", "laptop", "--state", state))
	web := mustCLI(t, "project", "create", "web", "--host", t.TempDir(), "--owner", "bob", "--state", state)
	mustCLI(t, "account", "create", "carol", "--state", state)
	mustCLI(t, "project", "add-member", "web", "carol", "--state", state)
	sock := startDaemon(t, state)
	if out, errs, status := cli("run", "--daemon", sock, "--project-id", web, "--token", tok, "--", "echo", "on sqlite"); status != 0 || out != "on sqlite\n" {
		t.Fatalf("run on the SQLite daemon: %d %q %q", status, out, errs)
	}

	out := mustCLI(t, "store", "copy", "--from", store.DefaultURL(state), "--to", url)
	if !strings.Contains(out, "accounts") || !strings.Contains(out, "members") {
		t.Errorf("store copy printed:\n%s", out)
	}
	if got := mustCLI(t, "project", "members", "web", "--store", url, "--state", t.TempDir()); !strings.Contains(got, "carol") || !strings.Contains(got, "bob") {
		t.Errorf("members on PostgreSQL:\n%s", got)
	}
	st, err := store.Open(context.Background(), url, store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if a, err := st.Authenticate(context.Background(), tok); err != nil || a.Name != "bob" {
		t.Fatalf("bob's token on PostgreSQL: %+v, %v", a, err)
	}
	_, errs, status := cli("store", "copy", "--from", store.DefaultURL(state), "--to", url)
	if status == 0 || !strings.Contains(errs, "not empty") {
		t.Errorf("second copy: status %d, %q; want refused", status, errs)
	}
	if _, errs, status := cli("store", "copy", "--from", url, "--to", url); status == 0 || !strings.Contains(errs, "want a sqlite store") {
		t.Errorf("copy from PostgreSQL: status %d, %q; want refused", status, errs)
	}

	// A daemon on the copy: the same token runs in the same project, and
	// the journal holds both commands.
	pgSock := startDaemonConfig(t, daemon.Config{StateDir: shortTempDir(t), Store: url})
	if out, errs, status := cli("run", "--daemon", pgSock, "--project-id", web, "--token", tok, "--", "echo", "on postgres"); status != 0 || out != "on postgres\n" {
		t.Fatalf("run on the PostgreSQL daemon: %d %q %q", status, out, errs)
	}
	js, err := st.ListJournal(context.Background(), store.JournalFilter{})
	if err != nil || len(js) != 2 || js[1].Argv[1] != "on sqlite" || js[0].Argv[1] != "on postgres" || js[1].End.Outcome != store.OutcomeExit {
		t.Fatalf("journal on PostgreSQL: %+v, %v", js, err)
	}
}

// shortTempDir is a temporary directory whose path leaves room for a Unix
// socket's name under it (t.TempDir's may not).
func shortTempDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "cc")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}
