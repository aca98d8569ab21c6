package store

import (
	"context"
	"errors"
	"path/filepath"
	"testing"
	"time"
)

func TestEgress(t *testing.T) {
	ctx := context.Background()
	s, err := Open(ctx, filepath.Join(t.TempDir(), "corral.db"), Options{Migrate: true})
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
}
