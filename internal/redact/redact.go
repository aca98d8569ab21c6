// Package redact removes secrets from text that corral stores, logs or
// returns: the journal's command lines, the editor's git output, export's
// and project import's git errors, the daemon's messages. It is corral's
// one redactor, so that every seam hides the same things:
//
//   - the userinfo of URL-like substrings, whole: scheme://USERINFO@host
//     becomes scheme://[REDACTED]@host, where USERINFO runs from "://" to
//     the last '@' before a '/', white space or a control character, so an
//     unencoded '@' in a password is covered
//     (https://bob:p@ss@example.com/x becomes
//     https://[REDACTED]@example.com/x);
//   - values of secret-named query parameters (access_token=, token=,
//     password=, api_key=, signature=, ... after '?' or '&');
//   - the value of an Authorization or Proxy-Authorization header, to the
//     end of its line, and the credential after "Bearer ";
//   - corral bearer tokens (store.TokenPrefix followed by the token's
//     alphabet);
//   - the secrets a Redactor was built with, wherever they occur.
//
// Redaction errs toward hiding too much: a URL-like substring whose
// userinfo is odd is hidden in full rather than parsed.
package redact

import (
	"regexp"
	"sort"
	"strings"
	"sync"
)

// Marker replaces every secret.
const Marker = "[REDACTED]"

// TokenPrefix starts every corral bearer token (store.TokenPrefix; a test
// keeps them equal).
const TokenPrefix = "corral_"

// A Redactor removes secrets from strings. The zero value (and a nil
// *Redactor) redacts the patterns in the package documentation and no
// known secret. A Redactor is immutable and safe for concurrent use.
type Redactor struct {
	secrets []string // longest first, so that a secret containing another goes whole
}

// New returns a Redactor that also replaces every occurrence of each
// non-empty secret (an export token, a password the caller holds).
func New(secrets ...string) *Redactor {
	r := &Redactor{}
	for _, s := range secrets {
		if s != "" {
			r.secrets = append(r.secrets, s)
		}
	}
	sort.Slice(r.secrets, func(i, j int) bool { return len(r.secrets[i]) > len(r.secrets[j]) })
	return r
}

var (
	// bearer matches the credential after "Bearer ".
	bearer = sync.OnceValue(func() *regexp.Regexp {
		return regexp.MustCompile(`(?i)(\bbearer\s+)[A-Za-z0-9._~+/=-]+`)
	})
	// authHeader matches an Authorization header's value to the end of the
	// line (git's http.extraHeader, curl -H, logged requests).
	authHeader = sync.OnceValue(func() *regexp.Regexp {
		return regexp.MustCompile(`(?i)(\b(?:proxy-)?authorization\s*:\s*)[^\r\n]+`)
	})
	// queryParam matches a secret-named parameter's value in a query string.
	queryParam = sync.OnceValue(func() *regexp.Regexp {
		return regexp.MustCompile(`(?i)([?&](?:[a-z0-9_.-]*(?:token|password|passwd|secret|api[-_]?key|signature|credential)[a-z0-9_.-]*|sig|key|code)=)[^&#;\s"'<>]+`)
	})
	// corralToken matches a corral bearer token.
	corralToken = sync.OnceValue(func() *regexp.Regexp {
		return regexp.MustCompile(regexp.QuoteMeta(TokenPrefix) + `[A-Za-z0-9_-]{8,}`)
	})
)

// String returns s with every secret replaced by Marker.
func String(s string) string { return (*Redactor)(nil).String(s) }

// String returns s with every secret replaced by Marker.
func (r *Redactor) String(s string) string {
	if r != nil {
		for _, sec := range r.secrets {
			s = strings.ReplaceAll(s, sec, Marker)
		}
	}
	s = userinfo(s)
	if strings.Contains(s, "=") {
		s = queryParam().ReplaceAllString(s, "${1}"+Marker)
	}
	if containsFold(s, "authorization") {
		s = authHeader().ReplaceAllString(s, "${1}"+Marker)
	}
	if containsFold(s, "bearer") {
		s = bearer().ReplaceAllString(s, "${1}"+Marker)
	}
	if strings.Contains(s, TokenPrefix) {
		s = corralToken().ReplaceAllString(s, Marker)
	}
	return s
}

func containsFold(s, sub string) bool {
	return strings.Contains(strings.ToLower(s), sub)
}

// userinfo replaces the userinfo of every URL-like substring of s.
func userinfo(s string) string {
	if !strings.Contains(s, "://") || !strings.Contains(s, "@") {
		return s
	}
	var b strings.Builder
	rest := s
	for {
		i := strings.Index(rest, "://")
		if i < 0 {
			break
		}
		// The scheme: letters, digits, '+', '-', '.' before "://", starting
		// with a letter. Without one this is not a URL.
		j := i
		for j > 0 && isSchemeChar(rest[j-1]) {
			j--
		}
		for j < i && !isLetter(rest[j]) {
			j++
		}
		start := i + 3
		if j == i { // no scheme
			b.WriteString(rest[:start])
			rest = rest[start:]
			continue
		}
		// The authority runs to '/', white space or a control character;
		// its userinfo ends at its last '@'.
		end := start
		for end < len(rest) && !endsAuthority(rest[end]) {
			end++
		}
		at := strings.LastIndexByte(rest[start:end], '@')
		if at < 0 {
			b.WriteString(rest[:end])
			rest = rest[end:]
			continue
		}
		b.WriteString(rest[:start])
		b.WriteString(Marker)
		rest = rest[start+at:] // from the '@'
	}
	b.WriteString(rest)
	return b.String()
}

func isLetter(c byte) bool { return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' }

func isSchemeChar(c byte) bool {
	return isLetter(c) || c >= '0' && c <= '9' || c == '+' || c == '-' || c == '.'
}

func endsAuthority(c byte) bool {
	return c == '/' || c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f' || c < 0x20 || c == 0x7f
}

// secretArg matches command-line arguments that carry a secret in their
// value: --password=x, TOKEN=x, api-key:x.
var secretArg = sync.OnceValue(func() *regexp.Regexp {
	return regexp.MustCompile(`(?i)^(-{0,2}[a-z0-9_.-]*(?:password|passwd|secret|token|api[-_]?key|auth)[a-z0-9_.-]*[=:]\s*)(.+)$`)
})

// secretFlag matches a flag whose next argument is a secret: --token x.
var secretFlag = sync.OnceValue(func() *regexp.Regexp {
	return regexp.MustCompile(`(?i)^-{1,2}[a-z0-9_.-]*(?:password|passwd|secret|token|api[-_]?key)[a-z0-9_.-]*$`)
})

// Argv returns a redacted copy of a command line (see Redactor.Argv).
func Argv(argv []string) []string { return (*Redactor)(nil).Argv(argv) }

// Argv returns a copy of argv with secrets replaced: the argument after
// a secret-named flag (--token x) and the value of a secret-named
// argument (--password=x, PASSWORD=x) entirely, and in every other
// argument what String replaces. argv is not modified.
func (r *Redactor) Argv(argv []string) []string {
	if argv == nil {
		return nil
	}
	out := make([]string, len(argv))
	for i, a := range argv {
		switch {
		case i > 0 && secretFlag().MatchString(argv[i-1]):
			out[i] = Marker
		case secretArg().MatchString(a):
			out[i] = secretArg().ReplaceAllString(a, "${1}"+Marker)
		default:
			out[i] = r.String(a)
		}
	}
	return out
}
