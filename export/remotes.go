package export

import (
	"fmt"
	"net/url"
	"path"
	"strings"

	"github.com/corral-sandbox/corral/internal/errdefs"
)

// ErrRemoteNotAllowed reports a remote that no allowed pattern matches (or
// an exporter with no allowed remotes at all). It is returned before any
// network use and before anything runs in the machine.
var ErrRemoteNotAllowed = errdefs.New(errdefs.Forbidden, "export: remote not allowed")

// Remote patterns (Options.AllowedRemotes, a project's export remotes)
// name remotes without their scheme and user information:
//
//	github.com/org/*        host[:port]/path, path.Match syntax per segment:
//	                        github.com/org/repo and github.com/org/repo.git
//	github.com/org/**       any path below github.com/org/
//	127.0.0.1:8080/git/r    one repository (also r.git)
//	/srv/git/**             host paths and file:// URLs (AllowInsecure)
//
// Hosts compare case-insensitively; a pattern's host with no port matches
// only the scheme's default port.

// ValidRemotePattern reports whether p is a usable remote pattern.
func ValidRemotePattern(p string) error {
	if p == "" || strings.ContainsAny(p, " \t\r\n") || strings.Contains(p, "://") || strings.Contains(p, "@") {
		return fmt.Errorf("export: remote pattern %q: want host[:port]/path or /path, without scheme, user or white space", p)
	}
	glob := strings.TrimSuffix(p, "/**")
	if _, err := path.Match(glob, ""); err != nil {
		return fmt.Errorf("export: remote pattern %q: %w", p, err)
	}
	return nil
}

// remoteKey is what patterns match: host[:port]/path for URLs with a host
// (the host lower-cased, the default port dropped), the path for file
// remotes.
func remoteKey(u *url.URL) string {
	if u.Scheme == "file" {
		return path.Clean(u.Path)
	}
	host := strings.ToLower(u.Hostname())
	if strings.Contains(host, ":") {
		host = "[" + host + "]"
	}
	if port := u.Port(); port != "" && !(u.Scheme == "https" && port == "443") && !(u.Scheme == "http" && port == "80") {
		host += ":" + port
	}
	p := strings.Trim(path.Clean("/"+u.Path), "/")
	if p == "" {
		return host
	}
	return host + "/" + p
}

// matchRemote reports whether key matches pattern.
func matchRemote(pattern, key string) bool {
	if pattern == "" {
		return false
	}
	if i := strings.IndexByte(pattern, '/'); i > 0 {
		pattern = strings.ToLower(pattern[:i]) + pattern[i:]
	} else if i < 0 {
		pattern = strings.ToLower(pattern)
	}
	keys := []string{key}
	if k, ok := strings.CutSuffix(key, ".git"); ok {
		keys = append(keys, k)
	}
	for _, k := range keys {
		if prefix, ok := strings.CutSuffix(pattern, "/**"); ok {
			n := strings.Count(prefix, "/") + 1
			segs := strings.Split(k, "/")
			if prefix == "" { // "/**": every absolute path
				if strings.HasPrefix(k, "/") && len(k) > 1 {
					return true
				}
				continue
			}
			if len(segs) > n {
				if ok, _ := path.Match(prefix, strings.Join(segs[:n], "/")); ok {
					return true
				}
			}
			continue
		}
		if ok, _ := path.Match(pattern, k); ok {
			return true
		}
	}
	return false
}

// allowRemote checks u against the exporter's patterns and, if the
// project has its own, against those too (a project narrows, never
// widens).
func (x *Exporter) allowRemote(u *url.URL, shown string, project []string) error {
	if len(x.opts.AllowedRemotes) == 0 {
		return fmt.Errorf("%w: this daemon allows no export remotes (the operator sets them with --export-remote)", ErrRemoteNotAllowed)
	}
	key := remoteKey(u)
	if !matchAny(x.opts.AllowedRemotes, key) {
		return fmt.Errorf("%w: %s is not among the daemon's export remotes", ErrRemoteNotAllowed, shown)
	}
	if len(project) > 0 && !matchAny(project, key) {
		return fmt.Errorf("%w: %s is not among the project's export remotes", ErrRemoteNotAllowed, shown)
	}
	return nil
}

func matchAny(patterns []string, key string) bool {
	for _, p := range patterns {
		if matchRemote(p, key) {
			return true
		}
	}
	return false
}

// credentialURL is the URL git's credential configuration is scoped to:
// the remote without user information, query or fragment.
func credentialURL(u *url.URL) string {
	c := url.URL{Scheme: u.Scheme, Host: u.Host, Path: u.Path}
	return c.String()
}
