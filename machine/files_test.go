package machine

import (
	"errors"
	"strings"
	"testing"
)

// TestFilesUnsupported: a worker that did not announce files is sent no
// file request: every file call fails with ErrUnsupported.
func TestFilesUnsupported(t *testing.T) {
	g, _ := setup(t, Options{})
	r := FileRequest{Project: project, Path: "/workspace/x"}
	ctx := ctxT(t)
	calls := map[string]error{}
	_, _, calls["open"] = g.OpenFile(ctx, r)
	_, calls["write"] = g.WriteFile(ctx, r, 0, strings.NewReader("x"))
	_, calls["stat"] = g.StatFile(ctx, r)
	_, _, _, calls["list"] = g.ListFiles(ctx, r, 1, 0)
	_, calls["mkdir"] = g.Mkdir(ctx, r, 0, false)
	calls["remove"] = g.RemoveFile(ctx, r, false)
	calls["rename"] = g.RenameFile(ctx, r, "/workspace/y")
	_, _, _, calls["watch"] = g.WatchFiles(ctx, r, false)
	for name, err := range calls {
		if !errors.Is(err, ErrUnsupported) {
			t.Errorf("%s = %v, want ErrUnsupported", name, err)
		}
	}
}
