package editor

import (
	"context"
	"errors"
	"fmt"

	"github.com/corral-sandbox/corral/sandbox"

	"github.com/corral-sandbox/corral/api"
)

// Diff and Show size caps.
const (
	// DefaultMaxBytes is the cap when a MaxBytes (or Show's max) is zero.
	DefaultMaxBytes = 1 << 20
	// MaxMaxBytes is the largest cap a caller may ask for.
	MaxMaxBytes = 16 << 20
)

// DiffOptions select what to compare.
//
//   - From and To empty: the working tree against the index; with Staged,
//     the index against HEAD.
//   - From only: the working tree against From; with Staged, the index
//     against From.
//   - From and To: From against To (Staged is refused).
//
// To without From is refused.
type DiffOptions struct {
	From   string
	To     string
	Staged bool
	// Path, if not empty, limits the diff to it (a literal path relative
	// to the repository root).
	Path string
	// MaxBytes caps the returned patch. Zero means DefaultMaxBytes; more
	// than MaxMaxBytes or negative is refused.
	MaxBytes int64
}

// Diff is a unified diff (api.GitDiff: its fields and JSON).
type Diff = api.GitDiff

// Diff runs git diff in project on behalf of actor; see DiffOptions. An
// unknown ref is ErrUnknownRevision.
func (e *Editor) Diff(ctx context.Context, actor sandbox.Actor, project int64, opts DiffOptions) (*Diff, error) {
	args := []string{"diff", "--no-ext-diff", "--no-textconv", "--no-color", "--find-renames",
		"--ignore-submodules=dirty"}
	switch {
	case opts.To != "" && opts.From == "":
		return nil, fmt.Errorf("%w: to without from", ErrBadInput)
	case opts.To != "" && opts.Staged:
		return nil, fmt.Errorf("%w: staged compares the index, not two refs", ErrBadInput)
	}
	if opts.Staged {
		args = append(args, "--cached")
	}
	args = append(args, "--end-of-options")
	if opts.From != "" {
		if err := checkRef("from", opts.From); err != nil {
			return nil, err
		}
		args = append(args, opts.From)
	}
	if opts.To != "" {
		if err := checkRef("to", opts.To); err != nil {
			return nil, err
		}
		args = append(args, opts.To)
	}
	p, err := cleanPath(opts.Path)
	if err != nil {
		return nil, err
	}
	args = append(args, "--")
	if p != "" {
		args = append(args, p)
	}
	max, err := capBytes(opts.MaxBytes)
	if err != nil {
		return nil, err
	}
	g, err := e.session(ctx, actor, project)
	if err != nil {
		return nil, err
	}
	worktree := opts.To == "" && !opts.Staged
	d, err := g.diff(ctx, worktree, max, args)
	if errors.Is(err, errNotRepo) {
		return &Diff{IsRepo: false}, nil
	}
	return d, err
}

func (g *gitRunner) diff(ctx context.Context, worktree bool, max int64, args []string) (*Diff, error) {
	if worktree {
		if err := g.neutralizeFilters(ctx); err != nil {
			return nil, err
		}
	}
	// One byte more than the cap tells a diff of exactly max bytes from a
	// longer one.
	out, err := g.run(ctx, max+1, true, args...)
	if err != nil {
		return nil, err
	}
	if !out.overflowed && !out.ok() {
		if unknownRevision(out) {
			return nil, revisionError(out)
		}
		return nil, out.gitError("diff")
	}
	d := &Diff{IsRepo: true, Patch: out.stdout, Truncated: out.overflowed, Redacted: out.redacted}
	if int64(len(d.Patch)) > max {
		d.Patch, d.Truncated = cut(d.Patch, max), true
	}
	return d, nil
}

// capBytes applies the default and bounds of a caller's size cap.
func capBytes(n int64) (int64, error) {
	switch {
	case n == 0:
		return DefaultMaxBytes, nil
	case n < 0 || n > MaxMaxBytes:
		return 0, fmt.Errorf("%w: max %d is not within 1..%d", ErrBadInput, n, MaxMaxBytes)
	}
	return n, nil
}
