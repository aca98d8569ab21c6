package main

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"path"
	"path/filepath"
	"strings"
	"testing"

	"github.com/corral-sandbox/corral/client"
)

// hostileFiles is a machine that lies: its listings name entries as it
// pleases.
type hostileFiles struct {
	lists map[string][]client.FileInfo
}

func (h *hostileFiles) read(ctx context.Context, p string) (io.ReadCloser, error) {
	return io.NopCloser(strings.NewReader("pwned")), nil
}
func (h *hostileFiles) write(ctx context.Context, p string, mode uint32, r io.Reader) error {
	return errors.New("read-only")
}
func (h *hostileFiles) stat(ctx context.Context, p string) (client.FileInfo, error) {
	return client.FileInfo{Name: path.Base(p), Path: p, Type: "dir", Mode: "0755"}, nil
}
func (h *hostileFiles) list(ctx context.Context, p string) ([]client.FileInfo, error) {
	return h.lists[p], nil
}
func (h *hostileFiles) mkdir(ctx context.Context, p string, mode uint32) error {
	return errors.New("read-only")
}

// TestCpFromHostileMachine: entry names a machine returns are single path
// elements or the copy fails; nothing is written outside the destination
// (the docker cp class of escapes), and a directory listing itself never
// recurses forever.
func TestCpFromHostileMachine(t *testing.T) {
	for _, name := range []string{"../escaped", "../../escaped", "a/../../escaped", "/tmp/escaped", ".", "..", "", "x\x00y"} {
		t.Run(strings.ReplaceAll(name, "/", "|"), func(t *testing.T) {
			base := t.TempDir()
			dst := filepath.Join(base, "in", "dst")
			if err := os.MkdirAll(dst, 0o755); err != nil {
				t.Fatal(err)
			}
			typ := "file"
			if name == "." || name == ".." {
				typ = "dir"
			}
			h := &hostileFiles{lists: map[string][]client.FileInfo{
				"/workspace/d":   {{Name: name, Path: "/workspace/d/x", Type: typ, Mode: "0644"}},
				"/workspace/d/x": {{Name: name, Path: "/workspace/d/x", Type: typ, Mode: "0644"}},
			}}
			var stderr bytes.Buffer
			err := cpFromProject(context.Background(), h, "/workspace/d", dst, io.Discard, &stderr)
			if err == nil {
				t.Errorf("copy of an entry named %q succeeded", name)
			}
			// Nothing but dst/d (maybe empty) exists under base.
			_ = filepath.Walk(base, func(p string, fi os.FileInfo, err error) error {
				if err != nil {
					return nil
				}
				rel, _ := filepath.Rel(base, p)
				switch rel {
				case ".", "in", "in/dst", "in/dst/d":
					return nil
				}
				t.Errorf("the copy made %s", rel)
				return nil
			})
			if _, err := os.Lstat("/tmp/escaped"); err == nil && name == "/tmp/escaped" {
				os.Remove("/tmp/escaped")
			}
		})
	}
}
