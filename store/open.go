package store

import (
	"context"
	"fmt"
	"net/url"
	"path/filepath"
	"strings"
)

// The schemes of store URLs.
const (
	// SchemeSQLite starts an SQLite store URL: "sqlite:PATH", PATH
	// relative to the working directory or absolute.
	SchemeSQLite = "sqlite"
	// SchemePostgres starts a PostgreSQL store URL ("postgresql" is the
	// same).
	SchemePostgres = "postgres"
)

// DefaultFile is the SQLite database's name in a state directory.
const DefaultFile = "corral.db"

// DefaultURL is the store URL of a state directory: its SQLite file,
// "sqlite:STATE/corral.db".
func DefaultURL(stateDir string) string {
	return SchemeSQLite + ":" + filepath.Join(stateDir, DefaultFile)
}

// Open opens the store rawURL names (see the package documentation for
// the forms): an SQLite file, or a PostgreSQL database. A string that is
// none of the URL forms is an SQLite file's path. With opts.Migrate it
// creates (SQLite) and migrates the schema first; without, it refuses a
// schema other than the one this binary knows (a *SchemaError). On error
// nothing stays open, and the error never holds a password.
func Open(ctx context.Context, rawURL string, opts Options) (Store, error) {
	scheme, rest, err := SplitURL(rawURL)
	if err != nil {
		return nil, err
	}
	switch scheme {
	case SchemePostgres:
		s, err := openPostgres(ctx, rest, opts)
		if err != nil {
			return nil, err
		}
		return s, nil
	default:
		s, err := openSQLite(ctx, rest, opts)
		if err != nil {
			return nil, err
		}
		return s, nil
	}
}

// SplitURL returns the backend a store URL names (SchemeSQLite or
// SchemePostgres) and what that backend opens: the SQLite file's path, or
// the PostgreSQL connection string as given. An empty URL, "sqlite:" with
// no path, or a scheme corral does not know is an error (that names the
// URL redacted).
func SplitURL(rawURL string) (scheme, target string, err error) {
	switch {
	case rawURL == "":
		return "", "", fmt.Errorf("store: empty store URL")
	case strings.HasPrefix(rawURL, "postgres://"), strings.HasPrefix(rawURL, "postgresql://"):
		return SchemePostgres, rawURL, nil
	case strings.HasPrefix(rawURL, SchemeSQLite+":"):
		path := strings.TrimPrefix(rawURL, SchemeSQLite+":")
		path = strings.TrimPrefix(path, "//") // sqlite:///abs/path, as some tools write it
		if path == "" {
			return "", "", fmt.Errorf("store: %q names no file", rawURL)
		}
		return SchemeSQLite, path, nil
	case isKeywordValue(rawURL):
		return SchemePostgres, rawURL, nil
	}
	if i := strings.Index(rawURL, "://"); i > 0 && !strings.ContainsAny(rawURL[:i], `/\`) {
		return "", "", fmt.Errorf("store: %s: unknown scheme %q (want sqlite:PATH or postgres://...)", Redact(rawURL), rawURL[:i])
	}
	return SchemeSQLite, rawURL, nil
}

// isKeywordValue reports whether s is a libpq keyword/value connection
// string ("host=/run/postgresql dbname=corral ...").
func isKeywordValue(s string) bool {
	for _, k := range []string{"host=", "hostaddr=", "dbname=", "user=", "port=", "service="} {
		if strings.HasPrefix(s, k) {
			return true
		}
	}
	return false
}

// Redact returns a store URL fit for logs and errors: a URL's password
// (in its user information, or a password parameter) is replaced by
// "xxxxx"; anything else is returned as it is.
func Redact(rawURL string) string {
	if isKeywordValue(rawURL) {
		var out []string
		for _, f := range strings.Fields(rawURL) {
			if k, _, ok := strings.Cut(f, "="); ok && k == "password" {
				f = k + "=xxxxx"
			}
			out = append(out, f)
		}
		return strings.Join(out, " ")
	}
	if !strings.Contains(rawURL, "://") {
		return rawURL
	}
	u, err := url.Parse(rawURL)
	if err != nil {
		// Unparsable: keep the scheme alone rather than risk a password.
		scheme, _, _ := strings.Cut(rawURL, "://")
		return scheme + "://(unparsable URL)"
	}
	if _, ok := u.User.Password(); ok {
		u.User = url.UserPassword(u.User.Username(), "xxxxx")
	}
	q := u.Query()
	if q.Has("password") {
		q.Set("password", "xxxxx")
		u.RawQuery = q.Encode()
	}
	return u.String()
}
