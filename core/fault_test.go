package core_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/corral-sandbox/corral/core"
	"github.com/corral-sandbox/corral/internal/testworker"
	"github.com/corral-sandbox/corral/sandbox"
	"github.com/corral-sandbox/corral/sandbox/sandboxtest"
	"github.com/corral-sandbox/corral/store"
)

// TestWorkerKilledMidCommand: kill -9 of the worker while commands run
// gives every caller a transport error within a second, the journal records
// the interruption before any caller settles, no process survives, and the
// next command (on a restarted worker) succeeds.
func TestWorkerKilledMidCommand(t *testing.T) {
	w := testworker.StartProcess(t)
	e := build(t, core.Options{}, w)
	ctl, err := e.core.Sandbox()
	must(t, err)
	ctx := context.Background()
	// The token is the sleep's duration, so it shows in its command line.
	tok := fmt.Sprintf("100.%d", time.Now().UnixNano()%1e9)

	const n = 3
	type outcome struct {
		err      error
		at       time.Time
		journalI bool // the journal said interrupted when the caller settled
	}
	results := make(chan outcome, n)
	var started sync.WaitGroup
	started.Add(n)
	for i := 0; i < n; i++ {
		go func() {
			var once sync.Once
			_, err := ctl.RunCommand(ctx, e.input(e.managed, "sh", "-c", "echo up; sleep "+tok+" & exec sleep "+tok), &e.actor,
				&sandbox.RunOptions{Timeout: 30 * time.Second, OnStart: func(sandbox.StartInfo) error {
					once.Do(started.Done)
					return nil
				}})
			o := outcome{err: err, at: time.Now()}
			rows, _ := e.core.Store().ListJournal(ctx, store.JournalFilter{Project: e.managed.ID})
			all := len(rows) > 0
			for _, r := range rows {
				if r.End.Outcome != store.OutcomeInterrupted {
					all = false
				}
			}
			o.journalI = all
			results <- o
		}()
	}
	started.Wait()
	// Let the commands really start inside the machine.
	deadline := time.Now().Add(10 * time.Second)
	for countProcs(tok) < 2*n {
		if time.Now().After(deadline) {
			t.Fatalf("only %d of %d sleeps started", countProcs(tok), 2*n)
		}
		time.Sleep(10 * time.Millisecond)
	}
	killed := time.Now()
	w.Kill()
	for i := 0; i < n; i++ {
		o := <-results
		if sandbox.KindOf(o.err) != sandbox.KindTransport {
			t.Errorf("caller %d: %v, want a transport error", i, o.err)
		}
		t.Logf("caller %d settled after %v", i, o.at.Sub(killed))
		if d := o.at.Sub(killed); d > time.Second {
			t.Errorf("caller %d settled %v after the kill", i, d)
		}
		if !o.journalI {
			t.Errorf("caller %d settled before the journal recorded the interruption", i)
		}
	}
	sandboxtest.AssertNoProcesses(t, tok)
	if live := e.liveLeases(t); live != 0 {
		t.Errorf("%d live leases after the callers settled", live)
	}

	// A new worker on the same socket: the gateway reconnects.
	w.Start(t)
	var res *sandbox.CommandResult
	for i := 0; i < 50; i++ {
		res, err = ctl.RunCommand(ctx, e.input(e.managed, "echo", "again"), &e.actor, nil)
		if err == nil {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err != nil || res.Stdout != "again\n" {
		t.Fatalf("after restart: %+v %v", res, err)
	}
}

func countProcs(token string) int {
	n := 0
	for _, p := range procCmdlines() {
		if len(p) > 5 && p[:5] == "sleep" && contains(p, token) {
			n++
		}
	}
	return n
}
