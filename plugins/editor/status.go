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

// StatusLimit bounds the output of git status; beyond it the entries are
// cut and Status.Truncated is set.
const StatusLimit = 8 << 20

// Status is a repository's working-tree status (api.GitStatus: its fields and JSON).
type Status = api.GitStatus

// Branch is the branch header of a status (api.GitBranch: its fields and JSON).
type Branch = api.GitBranch

// EntryKind classifies a status entry (api.GitEntryKind: its fields and JSON).
type EntryKind = api.GitEntryKind

// The kinds of status entries.
const (
	EntryOrdinary  = api.GitEntryOrdinary
	EntryRenamed   = api.GitEntryRenamed
	EntryCopied    = api.GitEntryCopied
	EntryUnmerged  = api.GitEntryUnmerged
	EntryUntracked = api.GitEntryUntracked
	EntryIgnored   = api.GitEntryIgnored
)

// Entry is one path of a status (api.GitEntry: its fields and JSON).
type Entry = api.GitEntry

// Stage is one side of a conflicted path (api.GitStage: its fields and JSON).
type Stage = api.GitStage

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
