package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/corral-sandbox/corral/store"
)

// TestProjectSetMachineAndReset: set-machine records the image and limits
// (flags not given keep their value; host projects refused); reset without
// a running worker deletes the project's upper layer under STATE/worker,
// and is refused while a lease is live.
func TestProjectSetMachineAndReset(t *testing.T) {
	state := t.TempDir()
	mustCLI(t, "account", "create", "alice", "--state", state)
	id := mustCLI(t, "project", "create", "box", "--managed", "--owner", "alice", "--state", state)
	mustCLI(t, "project", "create", "web", "--host", t.TempDir(), "--owner", "alice", "--state", state)
	mustCLI(t, "project", "set-machine", "box", "--image", "debian", "--memory", "512MiB", "--cpus", "1.5", "--state", state)
	mustCLI(t, "project", "set-machine", "box", "--pids", "99", "--tmp", "64MiB", "--state", state)
	if _, errs, status := cli("project", "set-machine", "web", "--pids", "3", "--state", state); status == 0 || !strings.Contains(errs, "host project") {
		t.Errorf("set-machine of a host project: %d %s", status, errs)
	}
	if _, errs, status := cli("project", "set-machine", "box", "--cpus", "-1", "--state", state); status == 0 {
		t.Errorf("negative cpus accepted: %s", errs)
	}
	ctx := context.Background()
	st, err := store.Open(ctx, filepath.Join(state, "corral.db"), store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	p, err := st.ProjectByName(ctx, "box")
	if err != nil {
		t.Fatal(err)
	}
	want := store.MachineLimits{Memory: 512 << 20, CPUMillis: 1500, Pids: 99, Tmp: 64 << 20}
	if p.Image != "debian" || p.Limits != want {
		t.Fatalf("machine spec: %q %+v, want debian %+v", p.Image, p.Limits, want)
	}

	upper := filepath.Join(state, "worker", "uppers", id)
	if err := os.MkdirAll(filepath.Join(upper, "upper", "usr"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(upper+".image", []byte("sha256:x"), 0o600); err != nil {
		t.Fatal(err)
	}
	acct, err := st.AccountByName(ctx, "alice")
	if err != nil {
		t.Fatal(err)
	}
	l, err := st.CreateLease(ctx, store.NewLease{Project: p.ID, Account: acct.ID, Kind: "terminal", TTL: time.Hour}, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if _, errs, status := cli("project", "reset", "box", "--state", state); status == 0 || !strings.Contains(errs, "in use") {
		t.Errorf("reset while leased: %d %s", status, errs)
	}
	if _, err := os.Stat(upper); err != nil {
		t.Fatalf("upper layer removed while leased: %v", err)
	}
	if _, err := st.ReleaseLease(ctx, l.ID, time.Now()); err != nil {
		t.Fatal(err)
	}
	mustCLI(t, "project", "reset", "box", "--state", state)
	for _, p := range []string{upper, upper + ".image"} {
		if _, err := os.Lstat(p); !os.IsNotExist(err) {
			t.Errorf("%s after reset: %v", p, err)
		}
	}
}
