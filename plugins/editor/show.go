package editor

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/corral-sandbox/corral/sandbox"

	"github.com/corral-sandbox/corral/api"
)

// binarySniff is how much of a file Show inspects for a NUL byte, as git
// does to call a file binary.
const binarySniff = 8000

// File is a file's content at a ref (api.GitFile: its fields and JSON).
type File = api.GitFile

// Show returns the file at path (relative to the repository root) in ref
// (empty: HEAD) of project, on behalf of actor, with at most max bytes of
// content (zero: DefaultMaxBytes; more than MaxMaxBytes is refused). It is
// git show REF:PATH, done as git ls-tree REF -- PATH (which names the
// blob, its mode and its size) and git cat-file blob OID, so the content
// is the blob's even if the ref moves in between, and no textconv or
// filter applies. A ref or path that does not resolve is
// ErrUnknownRevision, a directory or submodule ErrNotFile.
func (e *Editor) Show(ctx context.Context, actor sandbox.Actor, project int64, ref, path string, max int64) (*File, error) {
	if ref == "" {
		ref = "HEAD"
	}
	if err := checkRef("ref", ref); err != nil {
		return nil, err
	}
	p, err := cleanPath(path)
	if err != nil {
		return nil, err
	}
	if p == "" {
		return nil, fmt.Errorf("%w: path is empty", ErrBadInput)
	}
	max, err = capBytes(max)
	if err != nil {
		return nil, err
	}
	g, err := e.session(ctx, actor, project)
	if err != nil {
		return nil, err
	}
	f, err := g.show(ctx, ref, p, max)
	if errors.Is(err, errNotRepo) {
		return &File{IsRepo: false}, nil
	}
	return f, err
}

func (g *gitRunner) show(ctx context.Context, ref, p string, max int64) (*File, error) {
	out, err := g.run(ctx, 1<<20, false, "ls-tree", "-z", "-l", "--full-tree", "--end-of-options", ref, "--", p)
	if err != nil {
		return nil, err
	}
	if !out.ok() {
		if unknownRevision(out) {
			return nil, revisionError(out)
		}
		return nil, out.gitError("ls-tree")
	}
	f := &File{IsRepo: true, Ref: ref, Path: p}
	var typ, size string
	found := false
	for _, rec := range strings.Split(out.stdout, "\x00") {
		// <mode> SP <type> SP <object> SP+ <size> TAB <path>
		meta, name, ok := strings.Cut(rec, "\t")
		if !ok || name != p {
			continue
		}
		fs := strings.Fields(meta)
		if len(fs) != 4 {
			return nil, fmt.Errorf("editor: ls-tree: malformed entry %q", meta)
		}
		f.Mode, typ, f.OID, size = fs[0], fs[1], fs[2], fs[3]
		found = true
		break
	}
	if !found {
		return nil, fmt.Errorf("%w: %s does not exist in %s", ErrUnknownRevision, p, ref)
	}
	if typ != "blob" {
		return nil, fmt.Errorf("%w: %s is a %s in %s", ErrNotFile, p, typ, ref)
	}
	f.Size, err = strconv.ParseInt(size, 10, 64)
	if err != nil {
		return nil, fmt.Errorf("editor: ls-tree: bad size %q", size)
	}

	// One byte more than the cap tells a file of exactly max bytes from a
	// longer one.
	limit := min(max, f.Size) + 1
	out, err = g.run(ctx, limit, true, "cat-file", "blob", f.OID)
	if err != nil {
		return nil, err
	}
	if !out.overflowed && !out.ok() {
		return nil, out.gitError("cat-file")
	}
	content := out.stdout
	sniff := content[:min(len(content), binarySniff)]
	if strings.IndexByte(sniff, 0) >= 0 {
		f.Binary = true
		f.Truncated = false
		return f, nil
	}
	f.Content, f.Redacted = content, out.redacted
	if out.overflowed || f.Size > max || int64(len(content)) > max {
		f.Content, f.Truncated = cut(content, max), true
	}
	return f, nil
}
