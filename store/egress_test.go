package store

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"
)

func TestEgress(t *testing.T) {
	eachBackend(t, func(t *testing.T, d *testDB) {
		ctx := context.Background()
		s, err := Open(ctx, d.url, Options{Migrate: true})
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		p, err := s.CreateProject(ctx, NewProject{Kind: ProjectManaged, Name: "p", Root: "/x"})
		if err != nil {
			t.Fatal(err)
		}
		if v, err := s.EgressPolicy(ctx, p.ID); err != nil || v != "" {
			t.Fatalf("new project: %q, %v", v, err)
		}
		for _, pol := range []string{`{"mode":"proxy","allow":["a.b"]}`, `{"mode":"none"}`} {
			if err := s.SetEgressPolicy(ctx, p.ID, pol); err != nil {
				t.Fatal(err)
			}
			if v, err := s.EgressPolicy(ctx, p.ID); err != nil || v != pol {
				t.Fatalf("policy %q, %v; want %q", v, err, pol)
			}
		}
		if err := s.SetEgressPolicy(ctx, 999, `{}`); !errors.Is(err, ErrNotFound) {
			t.Errorf("unknown project: %v", err)
		}
		if err := s.SetEgressPolicy(ctx, p.ID, `not json`); err == nil {
			t.Error("stored a policy that is not JSON")
		}
		start := time.UnixMilli(time.Now().UnixMilli())
		for i, v := range []string{"allowed", "denied"} {
			if _, err := s.AppendEgress(ctx, EgressEntry{Account: 1, Project: p.ID, Protocol: "http", Name: "a.b",
				Addr: "1.2.3.4", Port: 80 + i, Verdict: v, Rule: "a.b", BytesIn: 10, BytesOut: 5, StartedAt: start,
				Duration: 1500 * time.Millisecond}); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := s.AppendEgress(ctx, EgressEntry{Project: p.ID, Verdict: "maybe"}); err == nil {
			t.Error("stored an unknown verdict")
		}
		log, err := s.EgressLog(ctx, p.ID, 10)
		if err != nil || len(log) != 2 {
			t.Fatalf("log %+v, %v", log, err)
		}
		if e := log[0]; e.Verdict != "denied" || e.Port != 81 || e.BytesIn != 10 || !e.StartedAt.Equal(start) || e.Duration != 1500*time.Millisecond {
			t.Errorf("newest row %+v", e)
		}
		if log, _ := s.EgressLog(ctx, p.ID, 1); len(log) != 1 {
			t.Errorf("limit 1: %d rows", len(log))
		}
		if err := s.DeleteProject(ctx, p.ID); err != nil {
			t.Fatal(err)
		}
		if log, _ := s.EgressLog(ctx, p.ID, 0); len(log) != 2 {
			t.Errorf("the journal did not survive its project: %d rows", len(log))
		}
	})
}

// TestEgressJournalBounded is an attack: a machine in proxy mode opening
// denied connections in a loop (about 2,000 a second from one Python
// loop) wrote one row each, so that one guest grew the daemon's database,
// outside every machine limit, by gigabytes an hour. A project keeps its
// newest rows only (maxEgressRows, checked every egressPruneEvery
// appends); other projects' rows are untouched.
func TestEgressJournalBounded(t *testing.T) {
	eachBackend(t, func(t *testing.T, d *testDB) {
		ctx := context.Background()
		s, err := Open(ctx, d.url, Options{Migrate: true})
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		defer func(n int64) { maxEgressRows = n }(maxEgressRows)
		maxEgressRows = 100
		quiet := EgressEntry{Account: 1, Project: 1, Protocol: "http", Name: "a.b", Verdict: "allowed"}
		for range 10 {
			if _, err := s.AppendEgress(ctx, quiet); err != nil {
				t.Fatal(err)
			}
		}
		var last int64
		for i := range 1000 {
			id, err := s.AppendEgress(ctx, EgressEntry{Account: 2, Project: 2, Protocol: "http", Name: "denied.example",
				Port: i, Verdict: "denied", Rule: "no allow rule"})
			if err != nil {
				t.Fatal(err)
			}
			last = id
		}
		if n := d.queryInt(t, "SELECT count(*) FROM egress_log WHERE project = 2"); n < maxEgressRows || n > maxEgressRows+egressPruneEvery {
			t.Errorf("the spamming project keeps %d rows; want %d to %d", n, maxEgressRows, maxEgressRows+egressPruneEvery)
		}
		if log, err := s.EgressLog(ctx, 2, 1); err != nil || len(log) != 1 || log[0].ID != last {
			t.Errorf("newest row %+v, %v; want id %d", log, err, last)
		}
		if log, err := s.EgressLog(ctx, 1, 100); err != nil || len(log) != 10 {
			t.Errorf("the quiet project's rows: %d, %v", len(log), err)
		}
	})
}

// TestJournalArgvBounded is an attack: a command's argv was journaled
// whole, so that an account sending commands with a megabyte of arguments
// (a request body's worth, split into arguments under the kernel's 128 KiB
// per string) grew the daemon's database by a megabyte per command, as
// fast as its commands start. A row keeps at most MaxJournalArgv bytes of
// argv, its cut marked.
func TestJournalArgvBounded(t *testing.T) {
	eachBackend(t, func(t *testing.T, d *testDB) {
		ctx := context.Background()
		s, err := Open(ctx, d.url, Options{Migrate: true})
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		big := []string{"echo"}
		for range 10 {
			big = append(big, strings.Repeat("A", 100<<10))
		}
		many := append([]string{"true"}, make([]string, 300000)...) // empty strings
		for name, argv := range map[string][]string{"long": big, "many": many} {
			if _, err := s.JournalStart(ctx, JournalCommand{Account: 1, Project: 1, Lease: name, LeaseKind: "terminal", Argv: argv}); err != nil {
				t.Fatal(err)
			}
			if n := d.queryInt(t, "SELECT length(argv) FROM journal WHERE lease = ?", name); n > MaxJournalArgv+256 {
				t.Errorf("%s: journaled %d bytes of argv", name, n)
			}
			list, err := s.ListJournal(ctx, JournalFilter{Lease: name})
			if err != nil || len(list) != 1 {
				t.Fatalf("%s: %+v, %v", name, list, err)
			}
			got := list[0].Argv
			if got[0] != argv[0] || !strings.Contains(got[len(got)-1], "not journaled") {
				t.Errorf("%s: argv starts %q, ends %.80q", name, got[0], got[len(got)-1])
			}
		}
		small := []string{"git", "status"}
		if _, err := s.JournalStart(ctx, JournalCommand{Account: 1, Project: 1, Lease: "small", LeaseKind: "terminal", Argv: small}); err != nil {
			t.Fatal(err)
		}
		if list, err := s.ListJournal(ctx, JournalFilter{Lease: "small"}); err != nil || len(list) != 1 || strings.Join(list[0].Argv, " ") != "git status" {
			t.Errorf("small argv: %+v, %v", list, err)
		}
	})
}
