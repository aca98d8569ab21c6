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
	for _, k := range []string{"host=", "hostaddr=", "dbname=", "user=", "port=", "service=", "password=", "sslpassword="} {
		if strings.HasPrefix(s, k) {
			return true
		}
	}
	return false
}

// Redact returns a store URL fit for logs and errors: a URL's password
// (in its user information, or a password or sslpassword parameter, in
// either form) is replaced by "xxxxx"; anything else is returned as it
// is, except a keyword/value string it cannot read, which it does not
// echo.
func Redact(rawURL string) string {
	if isKeywordValue(rawURL) {
		return redactKeywords(rawURL)
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
	changed := false
	for k := range q {
		if secretKey(k) {
			q.Set(k, "xxxxx")
			changed = true
		}
	}
	if changed {
		u.RawQuery = q.Encode()
	}
	return u.String()
}

// secretKey reports whether a connection parameter's value is a secret:
// password, and sslpassword (the client key's).
func secretKey(k string) bool { return k == "password" || k == "sslpassword" }

// redactKeywords is Redact of libpq's keyword/value form, read as libpq
// reads it: key, optional spaces, '=', optional spaces, and a value that
// is either single-quoted (with \' and \\ escapes) or runs to the next
// space. What it cannot read is not echoed at all.
func redactKeywords(s string) string {
	const space = " \t\n\r\f\v"
	var out []string
	for {
		s = strings.TrimLeft(s, space)
		if s == "" {
			return strings.Join(out, " ")
		}
		eq := strings.IndexByte(s, '=')
		if eq < 0 {
			return "(unparsable connection string)"
		}
		key := strings.TrimRight(s[:eq], space)
		if key == "" || strings.ContainsAny(key, space) {
			return "(unparsable connection string)"
		}
		s = strings.TrimLeft(s[eq+1:], space)
		var val string
		if strings.HasPrefix(s, "'") {
			end := -1
			for i := 1; i < len(s); i++ {
				if s[i] == '\\' {
					i++
					continue
				}
				if s[i] == '\'' {
					end = i
					break
				}
			}
			if end < 0 {
				return "(unparsable connection string)"
			}
			val, s = s[:end+1], s[end+1:]
		} else {
			n := strings.IndexAny(s, space)
			if n < 0 {
				n = len(s)
			}
			val, s = s[:n], s[n:]
		}
		if secretKey(key) {
			val = "xxxxx"
		}
		out = append(out, key+"="+val)
	}
}
