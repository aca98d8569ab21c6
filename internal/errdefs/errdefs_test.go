package errdefs

import (
	"errors"
	"fmt"
	"testing"
)

type own struct{}

func (own) Error() string { return "own" }
func (own) Class() string { return "busy" }

func TestKindOf(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want Kind
	}{
		{nil, ""},
		{errors.New("plain"), ""},
		{ErrNotFound, NotFound},
		{fmt.Errorf("store: account %q: %w", "bob", ErrNotFound), NotFound},
		{Wrap(errors.New("x"), Conflict), Conflict},
		{fmt.Errorf("outer: %w", Wrap(fmt.Errorf("inner: %w", ErrNotFound), Forbidden)), Forbidden},
		{errors.Join(errors.New("a"), ErrUnavailable), Unavailable},
		{fmt.Errorf("wrapped: %w", own{}), Busy},
	} {
		if got := KindOf(tc.err); got != tc.want {
			t.Errorf("KindOf(%v) = %q, want %q", tc.err, got, tc.want)
		}
	}
	if Wrap(nil, Invalid) != nil {
		t.Error("Wrap(nil) is not nil")
	}
	if !errors.Is(fmt.Errorf("x: %w", ErrBusy), ErrBusy) || errors.Is(New(Busy, "busy"), ErrBusy) {
		t.Error("sentinels are not distinct errors.Is targets")
	}
}
