package editorplugin

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/corral-sandbox/corral/sandbox"
)

// StatusLimit bounds the output of git status; beyond it the entries are
// cut and Status.Truncated is set.
const StatusLimit = 8 << 20

// Status is a repository's working-tree status.
//
// If IsRepo is false the project directory is not a Git repository and
// every other field is empty.
type Status struct {
	IsRepo bool    `json:"isRepo"`
	Branch *Branch `json:"branch,omitempty"`
	// Entries lists changed, untracked and conflicted paths in git's
	// order. Never nil for a repository.
	Entries []Entry `json:"entries"`
	// Truncated reports that git listed more than StatusLimit bytes of
	// entries: Entries holds the ones that fit.
	Truncated bool `json:"truncated,omitempty"`
}

// Branch is the branch header of a status.
type Branch struct {
	// OID is the commit HEAD points at; empty when Initial.
	OID string `json:"oid,omitempty"`
	// Initial reports a branch with no commit yet.
	Initial bool `json:"initial,omitempty"`
	// Head is the current branch's name; empty when Detached.
	Head     string `json:"head,omitempty"`
	Detached bool   `json:"detached,omitempty"`
	// Upstream is the upstream branch ("origin/main"), if one is set.
	Upstream string `json:"upstream,omitempty"`
	// Ahead and Behind count commits relative to the upstream. Both are
	// nil when there is no upstream or it does not resolve (gone).
	Ahead  *int `json:"ahead,omitempty"`
	Behind *int `json:"behind,omitempty"`
}

// EntryKind classifies a status entry (the first field of porcelain v2).
type EntryKind string

// The kinds of status entries.
const (
	// EntryOrdinary ("1"): a changed tracked path.
	EntryOrdinary EntryKind = "ordinary"
	// EntryRenamed ("2", R): a renamed path; OrigPath is the old name.
	EntryRenamed EntryKind = "renamed"
	// EntryCopied ("2", C): a copied path; OrigPath is the source.
	EntryCopied EntryKind = "copied"
	// EntryUnmerged ("u"): a conflicted path; Stages holds its sides.
	EntryUnmerged EntryKind = "unmerged"
	// EntryUntracked ("?").
	EntryUntracked EntryKind = "untracked"
	// EntryIgnored ("!"), listed only when git is asked for ignored files.
	EntryIgnored EntryKind = "ignored"
)

// Entry is one path of a status.
//
// Index and Worktree are git's one-letter states of the path in the index
// (relative to HEAD) and in the working tree (relative to the index):
// "." unmodified, "M" modified, "T" type changed, "A" added, "D" deleted,
// "R" renamed, "C" copied, "U" updated but unmerged; "?" and "!" for
// untracked and ignored paths.
type Entry struct {
	Kind     EntryKind `json:"kind"`
	Path     string    `json:"path"`
	Index    string    `json:"index"`
	Worktree string    `json:"worktree"`
	// OrigPath is a rename's or copy's source path.
	OrigPath string `json:"origPath,omitempty"`
	// Score is a rename's or copy's similarity, in percent.
	Score int `json:"score,omitempty"`
	// Submodule is git's submodule state ("S<c><m><u>"); empty for
	// ordinary files.
	Submodule string `json:"submodule,omitempty"`
	// Modes and object names of ordinary, renamed and copied entries:
	// in HEAD, in the index and (mode only) in the working tree.
	ModeHead     string `json:"modeHead,omitempty"`
	ModeIndex    string `json:"modeIndex,omitempty"`
	ModeWorktree string `json:"modeWorktree,omitempty"`
	OIDHead      string `json:"oidHead,omitempty"`
	OIDIndex     string `json:"oidIndex,omitempty"`
	// Conflicted is true for unmerged entries. Conflict names the kind of
	// conflict from its two letters ("both modified", "deleted by them",
	// ...), and Stages holds stage 1 (base), 2 (ours) and 3 (theirs); a
	// stage absent from the index has mode 000000.
	Conflicted bool    `json:"conflicted,omitempty"`
	Conflict   string  `json:"conflict,omitempty"`
	Stages     []Stage `json:"stages,omitempty"`
}

// Stage is one side of a conflicted path.
type Stage struct {
	Stage int    `json:"stage"`
	Mode  string `json:"mode"`
	OID   string `json:"oid"`
}

var conflicts = map[string]string{
	"DD": "both deleted",
	"AU": "added by us",
	"UD": "deleted by them",
	"UA": "added by them",
	"DU": "deleted by us",
	"AA": "both added",
	"UU": "both modified",
}

// Status runs git status --porcelain=v2 --branch -z --untracked-files=all
// in project on behalf of actor and parses it. Renames are detected; the
// working trees of submodules are not inspected (only their commits).
func (e *Editor) Status(ctx context.Context, actor sandbox.Actor, project int64) (*Status, error) {
	g, err := e.session(ctx, actor, project)
	if err != nil {
		return nil, err
	}
	st, err := g.status(ctx)
	if errors.Is(err, errNotRepo) {
		return &Status{IsRepo: false}, nil
	}
	return st, err
}

func (g *gitRunner) status(ctx context.Context) (*Status, error) {
	if err := g.neutralizeFilters(ctx); err != nil {
		return nil, err
	}
	out, err := g.run(ctx, StatusLimit, true, "status", "--porcelain=v2", "--branch", "-z",
		"--untracked-files=all", "--find-renames", "--ignore-submodules=dirty")
	if err != nil {
		return nil, err
	}
	if !out.overflowed && !out.ok() {
		return nil, out.gitError("status")
	}
	st, err := parseStatus(out.stdout, out.overflowed)
	if err != nil {
		return nil, err
	}
	st.Truncated = out.overflowed
	return st, nil
}

// parseStatus parses git status --porcelain=v2 --branch -z output. If
// partial is true the output was cut: an incomplete last record is dropped
// instead of failing.
func parseStatus(out string, partial bool) (*Status, error) {
	st := &Status{IsRepo: true, Entries: []Entry{}}
	fields := strings.Split(out, "\x00")
	// Every record ends with NUL, so the last field is empty unless cut.
	last := fields[len(fields)-1]
	fields = fields[:len(fields)-1]
	if last != "" && !partial {
		return nil, fmt.Errorf("editor: status: output does not end with NUL")
	}
	bad := func(rec string, why string) error {
		if len(rec) > 200 {
			rec = rec[:200] + "…"
		}
		return fmt.Errorf("editor: status: %s: %q", why, rec)
	}
	for i := 0; i < len(fields); i++ {
		rec := fields[i]
		if rec == "" {
			return nil, bad(rec, "empty record")
		}
		switch rec[0] {
		case '#':
			if err := parseBranchHeader(st, rec); err != nil {
				return nil, bad(rec, err.Error())
			}
		case '1':
			// 1 XY sub mH mI mW hH hI path
			f := strings.SplitN(rec, " ", 9)
			if len(f) != 9 || len(f[1]) != 2 {
				return nil, bad(rec, "malformed ordinary entry")
			}
			st.Entries = append(st.Entries, Entry{
				Kind: EntryOrdinary, Path: f[8], Index: f[1][:1], Worktree: f[1][1:],
				Submodule: submodule(f[2]), ModeHead: f[3], ModeIndex: f[4], ModeWorktree: f[5],
				OIDHead: f[6], OIDIndex: f[7],
			})
		case '2':
			// 2 XY sub mH mI mW hH hI Xscore path NUL origPath
			f := strings.SplitN(rec, " ", 10)
			if len(f) != 10 || len(f[1]) != 2 || len(f[8]) < 2 {
				return nil, bad(rec, "malformed rename entry")
			}
			if i+1 >= len(fields) {
				if partial {
					break
				}
				return nil, bad(rec, "rename entry without its original path")
			}
			i++
			kind := EntryRenamed
			switch f[8][0] {
			case 'R':
			case 'C':
				kind = EntryCopied
			default:
				return nil, bad(rec, "unknown rename or copy score")
			}
			score, err := strconv.Atoi(f[8][1:])
			if err != nil {
				return nil, bad(rec, "bad score")
			}
			st.Entries = append(st.Entries, Entry{
				Kind: kind, Path: f[9], OrigPath: fields[i], Score: score,
				Index: f[1][:1], Worktree: f[1][1:],
				Submodule: submodule(f[2]), ModeHead: f[3], ModeIndex: f[4], ModeWorktree: f[5],
				OIDHead: f[6], OIDIndex: f[7],
			})
		case 'u':
			// u XY sub m1 m2 m3 mW h1 h2 h3 path
			f := strings.SplitN(rec, " ", 11)
			if len(f) != 11 || len(f[1]) != 2 {
				return nil, bad(rec, "malformed unmerged entry")
			}
			st.Entries = append(st.Entries, Entry{
				Kind: EntryUnmerged, Path: f[10], Index: f[1][:1], Worktree: f[1][1:],
				Submodule: submodule(f[2]), ModeWorktree: f[6],
				Conflicted: true, Conflict: conflicts[f[1]],
				Stages: []Stage{
					{Stage: 1, Mode: f[3], OID: f[7]},
					{Stage: 2, Mode: f[4], OID: f[8]},
					{Stage: 3, Mode: f[5], OID: f[9]},
				},
			})
		case '?', '!':
			if len(rec) < 3 || rec[1] != ' ' {
				return nil, bad(rec, "malformed untracked entry")
			}
			kind, x := EntryUntracked, "?"
			if rec[0] == '!' {
				kind, x = EntryIgnored, "!"
			}
			st.Entries = append(st.Entries, Entry{Kind: kind, Path: rec[2:], Index: x, Worktree: x})
		default:
			return nil, bad(rec, "unknown record")
		}
	}
	return st, nil
}

// parseBranchHeader parses one "# branch.*" header into st.Branch.
// Headers it does not know ("# stash N", future ones) are ignored.
func parseBranchHeader(st *Status, rec string) error {
	key, val, _ := strings.Cut(strings.TrimPrefix(rec, "# "), " ")
	if !strings.HasPrefix(key, "branch.") {
		return nil
	}
	if st.Branch == nil {
		st.Branch = &Branch{}
	}
	b := st.Branch
	switch key {
	case "branch.oid":
		if val == "(initial)" {
			b.Initial = true
		} else {
			b.OID = val
		}
	case "branch.head":
		if val == "(detached)" {
			b.Detached = true
		} else {
			b.Head = val
		}
	case "branch.upstream":
		b.Upstream = val
	case "branch.ab":
		a, bh, ok := strings.Cut(val, " ")
		if !ok || !strings.HasPrefix(a, "+") || !strings.HasPrefix(bh, "-") {
			return errors.New("malformed ahead/behind")
		}
		ahead, err1 := strconv.Atoi(a[1:])
		behind, err2 := strconv.Atoi(bh[1:])
		if err1 != nil || err2 != nil || ahead < 0 || behind < 0 {
			return errors.New("malformed ahead/behind")
		}
		b.Ahead, b.Behind = &ahead, &behind
	}
	return nil
}

// submodule returns git's submodule field, or "" for a plain path.
func submodule(f string) string {
	if f == "N..." {
		return ""
	}
	return f
}
