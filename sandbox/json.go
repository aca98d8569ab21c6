package sandbox

import (
	"io"

	"github.com/corral-sandbox/corral/api"
)

// ErrorBody is the pinned JSON form of a command that did not complete
// (see [api.ErrorBody]).
type ErrorBody = api.ErrorBody

// Body returns e's pinned JSON form (Cause and Cleanup do not cross a
// process boundary).
func (e *CommandError) Body() ErrorBody {
	return ErrorBody{Kind: string(e.Kind), Message: e.Message, Stdout: e.Stdout, Stderr: e.Stderr, Reason: string(e.Reason)}
}

// MarshalJSON writes e's pinned body (see ErrorBody).
func (e *CommandError) MarshalJSON() ([]byte, error) { return e.Body().MarshalJSON() }

// UnmarshalJSON decodes a pinned error body into e's Kind, Message, Stdout
// and Stderr; Cause and Cleanup are cleared. A body without a kind is an
// error.
func (e *CommandError) UnmarshalJSON(b []byte) error {
	var body ErrorBody
	if err := body.UnmarshalJSON(b); err != nil {
		return err
	}
	*e = CommandError{Kind: ErrorKind(body.Kind), Message: body.Message, Stdout: body.Stdout, Stderr: body.Stderr, Reason: StartReason(body.Reason)}
	return nil
}

// WriteJSON streams e's pinned body to w (see ErrorBody.WriteJSON).
func (e *CommandError) WriteJSON(w io.Writer, escapeHTML bool) error {
	return e.Body().WriteJSON(w, escapeHTML)
}
