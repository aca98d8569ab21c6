package daemon

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/corral-sandbox/corral/export"
	"github.com/corral-sandbox/corral/machine"
	"github.com/corral-sandbox/corral/plugin"
	"github.com/corral-sandbox/corral/plugins/editor"
	"github.com/corral-sandbox/corral/plugins/lsp"
	"github.com/corral-sandbox/corral/plugins/sites"
	"github.com/corral-sandbox/corral/projects"
	"github.com/corral-sandbox/corral/sandbox"
	"github.com/corral-sandbox/corral/store"
)

// TestErrorTable pins the one translation of errors into statuses.
func TestErrorTable(t *testing.T) {
	for _, tc := range []struct {
		err    error
		status int
		kind   string
	}{
		{fmt.Errorf("x: %w", store.ErrNotFound), 404, KindNotFound},
		{store.ErrExists, 409, KindConflict},
		{store.ErrProjectBusy, 409, KindConflict},
		{machine.ErrNoPrivilegedTransport, 503, KindUnavailable},
		{plugin.ErrAbsent, 503, KindUnavailable},
		{sandbox.ErrUnavailable, 503, KindUnavailable},
		{sites.ErrTaken, 409, KindConflict},
		{sites.ErrInvalid, 400, KindInvalid},
		{lsp.ErrUnknownServer, 404, KindNotFound},
		{lsp.ErrUnsupportedProject, 400, KindInvalid},
		{export.ErrTooLarge, 413, KindTooLarge},
		{export.ErrRejected, 409, KindRejected},
		{fmt.Errorf("%w: x", export.ErrRemoteNotAllowed), 403, KindForbidden},
		{projects.ErrHostPath, 403, KindForbidden},
		{export.ErrNotRepository, 409, KindNotRepository},
		{&export.HeadMovedError{Branch: "main", Expected: "a", Actual: "b"}, 409, KindHeadMoved},
		{fmt.Errorf("open: %w", sandbox.ErrNotStarted), 422, string(sandbox.KindStart)},
		{&siteDialError{errors.New("refused")}, 502, KindBadGateway},
		{&siteDialError{machine.ErrNoPrivilegedTransport}, 503, KindUnavailable},
		{&siteDialError{context.Canceled}, StatusClientClosed, string(sandbox.KindAbort)},
		{&sandbox.CommandError{Kind: sandbox.KindPrepare, Cause: sandbox.ErrBusy}, 429, string(sandbox.KindPrepare)},
		{&sandbox.CommandError{Kind: sandbox.KindPrepare, Cause: sandbox.ErrDenied}, 403, string(sandbox.KindPrepare)},
		{&sandbox.CommandError{Kind: sandbox.KindTransport, Cause: machine.ErrUnavailable}, 503, string(sandbox.KindTransport)},
		{&sandbox.CommandError{Kind: sandbox.KindTimeout, Cause: context.DeadlineExceeded}, 504, string(sandbox.KindTimeout)},
		{&sandbox.CommandError{Kind: sandbox.KindOverflow}, 413, string(sandbox.KindOverflow)},
		{&editor.Error{Kind: editor.KindUnknownRevision}, 404, KindUnknownRevision},
		{&editor.Error{Kind: editor.KindInvalid}, 400, KindInvalid},
		{&editor.Error{Kind: editor.KindTimeout, Cause: &sandbox.CommandError{Kind: sandbox.KindTimeout, Stdout: "https://u:p@h/"}}, 504, string(sandbox.KindTimeout)},
		{&editor.Error{Kind: editor.KindInternal, Message: "git read failed"}, 500, KindInternal},
		{errors.New("secret detail"), 500, KindInternal},
	} {
		ae := toAPIError(tc.err)
		if ae.Status != tc.status || ae.Kind != tc.kind {
			t.Errorf("%v: %d %s, want %d %s", tc.err, ae.Status, ae.Kind, tc.status, tc.kind)
		}
	}
	if ae := toAPIError(&editor.Error{Kind: editor.KindTimeout, Message: "git did not finish in time", Cause: &sandbox.CommandError{Kind: sandbox.KindTimeout, Stdout: "https://u:p@h/"}}); ae.Stdout != "" || ae.Message != "git did not finish in time" {
		t.Errorf("an editor error's cause leaked: %+v", ae)
	}
	if ae := toAPIError(errors.New("secret detail")); ae.Message != "internal error" {
		t.Errorf("an unclassified error's message is sent: %q", ae.Message)
	}
	rec := httptest.NewRecorder()
	writeError(rec, toAPIError(&sandbox.CommandError{Kind: sandbox.KindPrepare, Message: "busy", Cause: sandbox.ErrBusy}))
	if rec.Code != http.StatusTooManyRequests || rec.Header().Get("Retry-After") == "" {
		t.Errorf("busy: %d, Retry-After %q", rec.Code, rec.Header().Get("Retry-After"))
	}
	if want := `{"error":{"kind":"prepare","message":"busy","stdout":"","stderr":""}}` + "\n"; rec.Body.String() != want {
		t.Errorf("body %q, want %q", rec.Body.String(), want)
	}
}
