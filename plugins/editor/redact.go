package editor

import (
	"errors"

	"github.com/corral-sandbox/corral/internal/redact"
	"github.com/corral-sandbox/corral/sandbox"
)

// Redacted replaces secrets (the userinfo of URLs, tokens) in every
// output; it is the marker of corral's one redactor (internal/redact).
const Redacted = redact.Marker

// redactError returns err with the output and message of a CommandError
// redacted. Other errors are returned as they are (their messages hold no
// command output).
func redactError(err error) error {
	var ce *sandbox.CommandError
	if !errors.As(err, &ce) {
		return err
	}
	cp := *ce
	cp.Message = redact.String(cp.Message)
	cp.Stdout = redact.String(cp.Stdout)
	cp.Stderr = redact.String(cp.Stderr)
	return &cp
}
