package editorplugin

import (
	"errors"
	"regexp"
	"strings"
	"sync"

	"github.com/corral-sandbox/corral/sandbox"
)

// Redacted replaces the userinfo of URLs in every output.
const Redacted = "[REDACTED]"

// urlUserinfo matches a URL's scheme and userinfo: everything after "://"
// up to the last '@' before a '/', whitespace or a control character. The
// match is greedy so that an unencoded '@' inside a password is covered.
var urlUserinfo = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`([A-Za-z][A-Za-z0-9+.\-]*://)[^\s/\x00-\x1f\x7f]*@`) })

// redact removes the userinfo (user name and password, or token) of every
// URL-like substring of s: https://user:secret@host/x becomes
// https://[REDACTED]@host/x.
func redact(s string) string {
	if !strings.Contains(s, "://") || !strings.Contains(s, "@") {
		return s
	}
	return urlUserinfo().ReplaceAllString(s, "${1}"+Redacted+"@")
}

// redactError returns err with the output and message of a CommandError
// redacted. Other errors are returned as they are (their messages hold no
// command output).
func redactError(err error) error {
	var ce *sandbox.CommandError
	if !errors.As(err, &ce) {
		return err
	}
	cp := *ce
	cp.Message = redact(cp.Message)
	cp.Stdout = redact(cp.Stdout)
	cp.Stderr = redact(cp.Stderr)
	return &cp
}
