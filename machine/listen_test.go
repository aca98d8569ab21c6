package machine

import (
	"errors"
	"testing"
)

// TestListenUnsupported: a worker that did not announce net-listen is not
// sent one.
func TestListenUnsupported(t *testing.T) {
	g, _ := setup(t, Options{})
	if _, err := g.Listen(ctxT(t), project, 3128); !errors.Is(err, ErrUnsupported) {
		t.Errorf("Listen = %v, want ErrUnsupported", err)
	}
}
