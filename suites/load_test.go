package suites

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/corral-sandbox/corral/client"
	"github.com/corral-sandbox/corral/internal/testenv"
	"github.com/corral-sandbox/corral/internal/testworker"
	"github.com/corral-sandbox/corral/sandbox"
	"github.com/corral-sandbox/corral/store"
)

// TestLoadMixedOutcomes runs many concurrent commands through the daemon
// with mixed outcomes — success, nonzero, timeout, overflow, cancel — and
// checks that every outcome is exactly what was asked for and that nothing
// is left behind: no goroutine, descriptor, session or live lease.
// Bounded: 100 commands; with -corral.full: 500.
func TestLoadMixedOutcomes(t *testing.T) {
	n := 100
	if *full {
		n = 500
	}
	const projects = 8
	s := newStack(t, projects, testworker.Options{MaxSessions: n/projects + 8})
	ctx := context.Background()
	// Warm every machine, and the pools (store connections, HTTP
	// connections), so the baseline counts only what a leak would add.
	var warm sync.WaitGroup
	for i := 0; i < 4*projects; i++ {
		warm.Add(1)
		go func(i int) {
			defer warm.Done()
			_, _ = s.client.RunCommand(ctx, s.projects[i%projects].ID, client.CommandRequest{Command: argv("true")})
		}(i)
	}
	warm.Wait()
	s.client.HTTPClient().CloseIdleConnections()
	time.Sleep(100 * time.Millisecond)
	// The store's pool of read connections grows on demand up to its bound;
	// its files are not counted as leaks.
	fdsBefore := fdTargets()
	goroutines, fds := runtime.NumGoroutine(), countNonStoreFDs(fdsBefore)

	kinds := []string{"success", "nonzero", "timeout", "overflow", "cancel"}
	want := map[string]int{}
	got := map[string]int{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for i := 0; i < n; i++ {
		kind := kinds[i%len(kinds)]
		want[kind]++
		p := s.projects[i%projects]
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			outcome := runOne(ctx, s.client, p.ID, kind, i)
			mu.Lock()
			got[outcome]++
			mu.Unlock()
		}(i)
	}
	wg.Wait()
	for _, k := range kinds {
		if got[k] != want[k] {
			t.Errorf("outcome %s: got %d, want %d (all: %v)", k, got[k], want[k], got)
		}
	}

	// The journal agrees: every command has a finished row of its kind.
	testenv.WaitFor(t, 20*time.Second, "journal rows settled", func() bool {
		rows := journal(t, s)
		if len(rows) < n+4*projects {
			return false
		}
		for _, r := range rows {
			if r.End.Outcome == "" {
				return false
			}
		}
		return true
	})
	byKind := map[string]int{}
	for _, r := range journal(t, s) {
		switch {
		case r.End.Outcome == store.OutcomeExit && *r.End.Code == 0:
			byKind["exit0"]++
		case r.End.Outcome == store.OutcomeExit:
			byKind["nonzero"]++
		case r.End.Outcome == store.OutcomeError:
			byKind[r.End.ErrorKind]++
		}
	}
	if byKind["exit0"] != want["success"]+4*projects || byKind["nonzero"] != want["nonzero"] ||
		byKind["timeout"] != want["timeout"] || byKind["overflow"] != want["overflow"] || byKind["abort"] != want["cancel"] {
		t.Errorf("journal outcomes %v, want %v", byKind, want)
	}

	// Nothing left behind. (Idle keep-alive connections of the client are
	// not the daemon's; close them first.)
	s.client.HTTPClient().CloseIdleConnections()
	testenv.WaitFor(t, 10*time.Second, "no live lease", func() bool {
		c, _ := s.core.Leases().LiveCount(ctx)
		return c == 0
	})
	testenv.WaitFor(t, 10*time.Second, "no session in any machine", func() bool {
		for _, m := range s.worker.Machines() {
			if m.Sessions != 0 {
				return false
			}
		}
		return true
	})
	testenv.WaitFor(t, 10*time.Second, fmt.Sprintf("goroutines back to the baseline %d", goroutines), func() bool {
		return runtime.NumGoroutine() <= goroutines+2
	})
	testenv.WaitFor(t, 10*time.Second, fmt.Sprintf("descriptors back to the baseline %d", fds), func() bool {
		return countNonStoreFDs(fdTargets()) <= fds+2
	})
	if t.Failed() {
		t.Logf("goroutines %d, descriptors %d\nbefore: %v\nafter:  %v", runtime.NumGoroutine(), countFDs(), fdsBefore, fdTargets())
	}
}

func argv(a ...string) sandbox.Command {
	return sandbox.Command{Type: "argv", File: a[0], Args: a[1:]}
}

// runOne runs one command of the given kind and classifies its outcome.
func runOne(ctx context.Context, c *client.Client, project int64, kind string, i int) string {
	req := client.CommandRequest{TimeoutMs: 20000}
	switch kind {
	case "success":
		req.Command = argv("echo", fmt.Sprint(i))
	case "nonzero":
		req.Command = argv("sh", "-c", "exit 3")
	case "timeout":
		req.Command, req.TimeoutMs = argv("sleep", "30"), 300
	case "overflow":
		req.Command, req.OutputLimit = argv("yes"), sandbox.OutputLimit{Combined: 1000}
	case "cancel":
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, 400*time.Millisecond)
		defer cancel()
		req.Command = argv("sleep", "30")
	}
	res, err := c.RunCommand(ctx, project, req)
	switch {
	case err == nil && res.Code != nil && *res.Code == 0 && res.Stdout == fmt.Sprintln(i):
		return "success"
	case err == nil && res.Code != nil && *res.Code == 3:
		return "nonzero"
	case apiKind(err) == "timeout":
		return "timeout"
	case apiKind(err) == "overflow":
		return "overflow"
	case kind == "cancel" && errors.Is(err, context.DeadlineExceeded):
		return "cancel"
	}
	return fmt.Sprintf("unexpected(%s): %+v %v", kind, res, err)
}

func journal(t *testing.T, s *stack) []store.JournalEntry {
	var all []store.JournalEntry
	for _, p := range s.projects {
		rows, err := s.core.Store().ListJournal(context.Background(), store.JournalFilter{Project: p.ID, Limit: 100000})
		must(t, err)
		all = append(all, rows...)
	}
	return all
}

func countNonStoreFDs(targets []string) int {
	n := 0
	for _, t := range targets {
		if !strings.Contains(t, "corral.db") {
			n++
		}
	}
	return n
}
