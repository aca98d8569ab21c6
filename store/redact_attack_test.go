package store

import (
	"context"
	"strings"
	"testing"
)

// TestRedactLeaksNoPassword: whatever form a store URL takes — the URL's
// user information, a password or sslpassword parameter, libpq's
// keyword/value form with a quoted value holding spaces, spaces around
// '=', or password first — the secret is in neither Redact's answer nor
// the error of a store that cannot be opened with it (before: the tail of
// a quoted password, an sslpassword and a spaced "password = x" were
// echoed; "password=… host=…" was taken for a SQLite file name).
func TestRedactLeaksNoPassword(t *testing.T) {
	const secret = "s3cr3t"
	for _, in := range []string{
		"postgres://u:s3cr3t@db/corral",
		"postgres://u@db/corral?password=s3cr3t",
		"postgres://u@db/corral?sslpassword=s3cr3t&sslmode=disable",
		"host=/nonexistent password='my s3cr3t' dbname=corral",
		`host=/nonexistent password='it\'s s3cr3t' dbname=corral`,
		"host=/nonexistent password = s3cr3t dbname=corral",
		"host=/nonexistent sslpassword=s3cr3t dbname=corral",
		"password=s3cr3t host=/nonexistent dbname=corral",
		"host=/nonexistent password='unterminated s3cr3t",
	} {
		if got := Redact(in); strings.Contains(got, secret) {
			t.Errorf("Redact(%q) = %q", in, got)
		}
		if scheme, _, err := SplitURL(in); err == nil && scheme != SchemePostgres {
			t.Errorf("SplitURL(%q): scheme %q, want postgres", in, scheme)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5e9)
		st, err := Open(ctx, in, Options{ConnectTimeout: 1e9})
		cancel()
		if err == nil {
			st.Close()
			t.Errorf("Open(%q) succeeded", in)
			continue
		}
		if strings.Contains(err.Error(), secret) {
			t.Errorf("Open(%q): %v", in, err)
		}
	}
}
