package store

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"
)

// Store URLs choose the backend; a password never reaches an error.
func TestSplitURLAndRedact(t *testing.T) {
	for _, c := range []struct{ url, scheme, target string }{
		{"sqlite:/var/lib/corral/corral.db", SchemeSQLite, "/var/lib/corral/corral.db"},
		{"sqlite:///var/lib/corral/corral.db", SchemeSQLite, "/var/lib/corral/corral.db"},
		{"sqlite:rel.db", SchemeSQLite, "rel.db"},
		{"/state/corral.db", SchemeSQLite, "/state/corral.db"},
		{"postgres://u:pw@db/corral", SchemePostgres, "postgres://u:pw@db/corral"},
		{"postgresql:///corral?host=/run/postgresql", SchemePostgres, "postgresql:///corral?host=/run/postgresql"},
		{"host=/run/postgresql dbname=corral", SchemePostgres, "host=/run/postgresql dbname=corral"},
	} {
		scheme, target, err := SplitURL(c.url)
		if err != nil || scheme != c.scheme || target != c.target {
			t.Errorf("SplitURL(%q) = %q, %q, %v; want %q, %q", c.url, scheme, target, err, c.scheme, c.target)
		}
	}
	for _, bad := range []string{"", "sqlite:", "mysql://u:secret@db/x"} {
		if _, _, err := SplitURL(bad); err == nil || strings.Contains(err.Error(), "secret") {
			t.Errorf("SplitURL(%q) = %v; want an error without the password", bad, err)
		}
	}
	for in, want := range map[string]string{
		"postgres://u:secret@db:5432/corral?sslmode=disable": "postgres://u:xxxxx@db:5432/corral?sslmode=disable",
		"postgres://db/corral?password=secret&user=u":        "postgres://db/corral?password=xxxxx&user=u",
		"host=db password=secret dbname=corral":              "host=db password=xxxxx dbname=corral",
		"sqlite:/s/corral.db":                                "sqlite:/s/corral.db",
	} {
		if got := Redact(in); got != want {
			t.Errorf("Redact(%q) = %q; want %q", in, got, want)
		}
	}
	// A server that cannot be reached: the error names it, without the
	// password, and says it is unavailable.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err := Open(ctx, "postgres://corral:hunter2@/corral?host=/nonexistent&connect_timeout=2", Options{})
	if err == nil || strings.Contains(err.Error(), "hunter2") || !strings.Contains(err.Error(), "xxxxx") {
		t.Fatalf("Open(unreachable) = %v; want an error naming the URL redacted", err)
	}
	if !errors.Is(err, ErrUnavailable) {
		t.Errorf("Open(unreachable) = %v; want ErrUnavailable", err)
	}
}
