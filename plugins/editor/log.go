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

// Log page sizes.
const (
	DefaultLogLimit = 50
	MaxLogLimit     = 1000
	// LogOutputLimit bounds one page's output; a page that would exceed
	// it is cut to the commits that fit (and HasMore is set).
	LogOutputLimit = 8 << 20
)

// LogOptions select a page of history.
type LogOptions struct {
	// Ref is the revision (or range, "main..topic") to list. Empty means
	// HEAD.
	Ref string
	// Skip is how many commits to skip from the newest. Negative is
	// refused.
	Skip int
	// Limit is the page size. Zero means DefaultLogLimit; more than
	// MaxLogLimit or negative is refused.
	Limit int
	// Path, if not empty, limits history to commits touching it (a
	// literal path relative to the repository root).
	Path string
}

// Log is a page of history (api.GitLog: its fields and JSON).
type Log = api.GitLog

// Commit is one commit of a log (api.GitCommit: its fields and JSON).
type Commit = api.GitCommit

// logFormat prints each commit as its fields separated by US (0x1f), the
// raw message last (so that it may contain anything but NUL); -z ends
// each commit with NUL.
const logFormat = "%H%x1f%P%x1f%an%x1f%ae%x1f%aI%x1f%cI%x1f%B"

// Log lists a page of commits of opts.Ref in project on behalf of actor.
// An unknown ref is ErrUnknownRevision; a branch without commits is an
// empty page.
func (e *Editor) Log(ctx context.Context, actor sandbox.Actor, project int64, opts LogOptions) (*Log, error) {
	ref := opts.Ref
	if ref == "" {
		ref = "HEAD"
	}
	if err := checkRef("ref", ref); err != nil {
		return nil, err
	}
	p, err := cleanPath(opts.Path)
	if err != nil {
		return nil, err
	}
	limit := opts.Limit
	switch {
	case limit == 0:
		limit = DefaultLogLimit
	case limit < 0 || limit > MaxLogLimit:
		return nil, fmt.Errorf("%w: limit %d is not within 1..%d", ErrBadInput, limit, MaxLogLimit)
	}
	if opts.Skip < 0 {
		return nil, fmt.Errorf("%w: skip %d is negative", ErrBadInput, opts.Skip)
	}
	g, err := e.session(ctx, actor, project)
	if err != nil {
		return nil, err
	}
	args := []string{"log", "-z", "--format=" + logFormat, "--no-color", "--no-ext-diff", "--no-textconv",
		"--skip=" + strconv.Itoa(opts.Skip), "--max-count=" + strconv.Itoa(limit+1),
		"--end-of-options", ref, "--"}
	if p != "" {
		args = append(args, p)
	}
	out, err := g.run(ctx, LogOutputLimit, true, args...)
	if errors.Is(err, errNotRepo) {
		return &Log{IsRepo: false}, nil
	}
	if err != nil {
		return nil, err
	}
	if !out.overflowed && !out.ok() {
		// HEAD of a branch with no commit yet is an empty history.
		if opts.Ref == "" && out.exit(128) {
			unborn, err := g.unbornHead(ctx)
			if err != nil {
				return nil, err
			}
			if unborn {
				return &Log{IsRepo: true, Commits: []Commit{}}, nil
			}
		}
		if unknownRevision(out) {
			return nil, revisionError(out)
		}
		return nil, out.gitError("log")
	}
	commits, err := parseLog(out.stdout, out.overflowed)
	if err != nil {
		return nil, err
	}
	if out.overflowed && len(commits) == 0 {
		return nil, fmt.Errorf("editor: log: one commit is larger than the page limit of %d bytes", LogOutputLimit)
	}
	lg := &Log{IsRepo: true, Commits: commits, HasMore: out.overflowed}
	if len(lg.Commits) > limit {
		lg.Commits, lg.HasMore = lg.Commits[:limit], true
	}
	return lg, nil
}

// parseLog parses git log -z --format=logFormat output. If partial is true
// the output was cut and an incomplete last commit is dropped.
func parseLog(out string, partial bool) ([]Commit, error) {
	commits := []Commit{}
	recs := strings.Split(out, "\x00")
	if last := recs[len(recs)-1]; partial || last == "" || last == "\n" {
		// The last record is incomplete (partial) or empty (terminator).
		recs = recs[:len(recs)-1]
	}
	for _, rec := range recs {
		rec = strings.TrimPrefix(rec, "\n")
		f := strings.SplitN(rec, "\x1f", 7)
		if len(f) != 7 {
			return nil, fmt.Errorf("editor: log: malformed commit record (%d fields)", len(f))
		}
		subject, body := splitMessage(f[6])
		c := Commit{
			Hash: f[0], Parents: strings.Fields(f[1]),
			AuthorName: f[2], AuthorEmail: f[3], AuthorDate: f[4], CommitterDate: f[5],
			Subject: subject, Body: body,
		}
		if c.Parents == nil {
			c.Parents = []string{}
		}
		commits = append(commits, c)
	}
	return commits, nil
}

// splitMessage splits a raw commit message as git's %s and %b do: the
// subject is the first paragraph with its lines joined by spaces, the body
// what follows the blank lines after it.
func splitMessage(msg string) (subject, body string) {
	lines := strings.Split(strings.TrimRight(msg, "\n"), "\n")
	i := 0
	for i < len(lines) && strings.TrimSpace(lines[i]) == "" {
		i++
	}
	var subj []string
	for ; i < len(lines) && strings.TrimSpace(lines[i]) != ""; i++ {
		subj = append(subj, strings.TrimSpace(lines[i]))
	}
	for i < len(lines) && strings.TrimSpace(lines[i]) == "" {
		i++
	}
	if i < len(lines) {
		body = strings.Join(lines[i:], "\n") + "\n"
	}
	return strings.Join(subj, " "), body
}

// unbornHead reports whether HEAD names a branch that has no commit yet.
func (g *gitRunner) unbornHead(ctx context.Context) (bool, error) {
	ref, err := g.run(ctx, 4096, false, "symbolic-ref", "-q", "HEAD")
	if err != nil {
		return false, err
	}
	if !ref.ok() {
		return false, nil // detached
	}
	head, err := g.run(ctx, 4096, false, "rev-parse", "-q", "--verify", "HEAD")
	if err != nil {
		return false, err
	}
	return head.exit(1), nil
}
