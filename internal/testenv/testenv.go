// Package testenv holds the helpers corral's tests share, so that no
// package writes its own: waiting for a condition (like tailscale's
// tstest.WaitFor).
package testenv

import (
	"testing"
	"time"
)

// PollInterval is how often Eventually asks its condition again.
const PollInterval = 10 * time.Millisecond

// Eventually calls cond until it reports true, every PollInterval, for at
// most d; it reports whether cond did. cond is called at least once.
func Eventually(d time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(PollInterval)
	}
	return true
}

// WaitFor waits until cond reports true, for at most d, and fails the test
// at once (t.Fatalf, naming what) if it never does.
func WaitFor(t testing.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	if !Eventually(d, cond) {
		t.Fatalf("timed out after %v waiting for %s", d, what)
	}
}
