package main

import (
	"context"
	"strings"
	"testing"

	"github.com/corral-sandbox/corral/internal/pgtest"
	"github.com/corral-sandbox/corral/store"
)

// TestStoreCopyCLI: an installation the administrative commands made on
// SQLite moves to PostgreSQL with corral store copy; the same commands
// then read it there through --store, its token authenticates, and a
// second copy into the now non-empty database is refused.
func TestStoreCopyCLI(t *testing.T) {
	url := pgtest.NewDatabase(t)
	state := t.TempDir()
	mustCLI(t, "account", "create", "bob", "--state", state)
	tok := strings.TrimSpace(mustCLI(t, "token", "create", "bob", "--name", "laptop", "--state", state))
	mustCLI(t, "project", "create", "web", "--host", t.TempDir(), "--owner", "bob", "--state", state)
	mustCLI(t, "account", "create", "carol", "--state", state)
	mustCLI(t, "project", "add-member", "web", "carol", "--state", state)

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
}
