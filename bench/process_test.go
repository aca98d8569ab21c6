package main

import (
	"context"
	"os"
	"testing"
)

// TestProcessStartRows runs the "background start → first output" rows
// with a few samples against a real worker and a real daemon app: every
// sample sees its process's first chunk.
func TestProcessStartRows(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: host commands are confined, managed ones need the worker")
	}
	dir := t.TempDir()
	w, err := startWorker(dir, "")
	if err != nil {
		t.Fatal(err)
	}
	defer w.stop()
	ctx := context.Background()
	cr, err := buildCorral(ctx, dir, w)
	if err != nil {
		t.Fatal(err)
	}
	defer cr.core.Close()
	rows, err := measureProcessStart(ctx, cr, 20)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range rows {
		if r.skip != "" || r.failures != 0 || r.st.n != 20 {
			t.Errorf("%s: skip %q, %d failures (%v), %d samples", r.name, r.skip, r.failures, r.firstErr, r.st.n)
			continue
		}
		t.Logf("%s: p50 %s p99 %s", r.name, ms(r.st.p50), ms(r.st.p99))
	}
}
