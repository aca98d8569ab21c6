package api

import "encoding/json"

// The answers of the editor's read-only Git reads (GET
// /v1/projects/{id}/git/status, log, diff and show).

// GitStatus is a repository's working-tree status.
//
// If IsRepo is false the project directory is not a Git repository and
// every other field is empty.
type GitStatus struct {
	IsRepo bool       `json:"isRepo"`
	Branch *GitBranch `json:"branch,omitempty"`
	// Entries lists changed, untracked and conflicted paths in git's
	// order. Never nil for a repository.
	Entries []GitEntry `json:"entries"`
	// Truncated reports that git listed more than the editor's limit (8 MiB) of
	// entries: Entries holds the ones that fit.
	Truncated bool `json:"truncated,omitempty"`
}

// GitBranch is the branch header of a status.
type GitBranch struct {
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

// GitEntryKind classifies a status entry (the first field of porcelain v2).
type GitEntryKind string

// The kinds of status entries.
const (
	// GitEntryOrdinary ("1"): a changed tracked path.
	GitEntryOrdinary GitEntryKind = "ordinary"
	// GitEntryRenamed ("2", R): a renamed path; OrigPath is the old name.
	GitEntryRenamed GitEntryKind = "renamed"
	// GitEntryCopied ("2", C): a copied path; OrigPath is the source.
	GitEntryCopied GitEntryKind = "copied"
	// GitEntryUnmerged ("u"): a conflicted path; Stages holds its sides.
	GitEntryUnmerged GitEntryKind = "unmerged"
	// GitEntryUntracked ("?").
	GitEntryUntracked GitEntryKind = "untracked"
	// GitEntryIgnored ("!"), listed only when git is asked for ignored files.
	GitEntryIgnored GitEntryKind = "ignored"
)

// GitEntry is one path of a status.
//
// Index and Worktree are git's one-letter states of the path in the index
// (relative to HEAD) and in the working tree (relative to the index):
// "." unmodified, "M" modified, "T" type changed, "A" added, "D" deleted,
// "R" renamed, "C" copied, "U" updated but unmerged; "?" and "!" for
// untracked and ignored paths.
type GitEntry struct {
	Kind     GitEntryKind `json:"kind"`
	Path     string       `json:"path"`
	Index    string       `json:"index"`
	Worktree string       `json:"worktree"`
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
	Conflicted bool       `json:"conflicted,omitempty"`
	Conflict   string     `json:"conflict,omitempty"`
	Stages     []GitStage `json:"stages,omitempty"`
}

// GitStage is one side of a conflicted path.
type GitStage struct {
	Stage int    `json:"stage"`
	Mode  string `json:"mode"`
	OID   string `json:"oid"`
}

// GitLog is a page of history.
//
// If IsRepo is false the project directory is not a Git repository and
// every other field is empty.
type GitLog struct {
	IsRepo bool `json:"isRepo"`
	// Commits lists the page, newest first. Never nil for a repository
	// (empty for a branch with no commit yet).
	Commits []GitCommit `json:"commits"`
	// HasMore reports that commits follow this page (request the next one
	// with Skip + len(Commits)).
	HasMore bool `json:"hasMore"`
}

// GitCommit is one commit of a log.
type GitCommit struct {
	Hash          string   `json:"hash"`
	Parents       []string `json:"parents"`
	AuthorName    string   `json:"authorName"`
	AuthorEmail   string   `json:"authorEmail"`
	AuthorDate    string   `json:"authorDate"`    // strict ISO 8601
	CommitterDate string   `json:"committerDate"` // strict ISO 8601
	// Subject is the message's first paragraph, its lines joined by
	// spaces; Body is the rest.
	Subject string `json:"subject"`
	Body    string `json:"body"`
}

// GitDiff is a unified diff.
//
// If IsRepo is false the project directory is not a Git repository and
// every other field is empty.
type GitDiff struct {
	IsRepo bool `json:"isRepo"`
	// Patch is git's unified diff (without external diff drivers or
	// textconv), at most the requested max bytes long.
	Patch string `json:"patch"`
	// Truncated reports that the diff was longer than the requested max and Patch
	// was cut (at a line end where possible).
	Truncated bool `json:"truncated"`
	// Redacted reports that credentials were removed from Patch.
	Redacted bool `json:"redacted,omitempty"`
}

// GitFile is a file's content at a ref.
//
// If IsRepo is false the project directory is not a Git repository and
// every other field is empty.
type GitFile struct {
	IsRepo bool   `json:"isRepo"`
	Ref    string `json:"ref,omitempty"`
	Path   string `json:"path,omitempty"`
	// OID is the blob's object name; Mode its file mode ("100644",
	// "100755", or "120000" for a symbolic link, whose content is its
	// target).
	OID  string `json:"oid,omitempty"`
	Mode string `json:"mode,omitempty"`
	// Size is the blob's full size in bytes.
	Size int64 `json:"size"`
	// Binary reports a file with a NUL byte in its first 8000 bytes;
	// Content is then empty.
	Binary bool `json:"binary"`
	// Content is the file as UTF-8 text (invalid bytes replaced by
	// U+FFFD), at most the requested max bytes.
	Content string `json:"content"`
	// Truncated reports that the file is longer than max and Content was
	// cut.
	Truncated bool `json:"truncated"`
	// Redacted reports that credentials were removed from Content.
	Redacted bool `json:"redacted,omitempty"`
}

// notRepoJSON is the whole JSON form of a result whose IsRepo is false.
var notRepoJSON = []byte(`{"isRepo":false}`)

// MarshalJSON encodes s; a status of a directory that is not a repository
// is exactly {"isRepo":false}.
func (s GitStatus) MarshalJSON() ([]byte, error) {
	if !s.IsRepo {
		return notRepoJSON, nil
	}
	type plain GitStatus
	if s.Entries == nil {
		s.Entries = []GitEntry{}
	}
	return json.Marshal(plain(s))
}

// MarshalJSON encodes l; a log of a directory that is not a repository is
// exactly {"isRepo":false}.
func (l GitLog) MarshalJSON() ([]byte, error) {
	if !l.IsRepo {
		return notRepoJSON, nil
	}
	type plain GitLog
	if l.Commits == nil {
		l.Commits = []GitCommit{}
	}
	return json.Marshal(plain(l))
}

// MarshalJSON encodes d; a diff of a directory that is not a repository is
// exactly {"isRepo":false}.
func (d GitDiff) MarshalJSON() ([]byte, error) {
	if !d.IsRepo {
		return notRepoJSON, nil
	}
	type plain GitDiff
	return json.Marshal(plain(d))
}

// MarshalJSON encodes f; a file of a directory that is not a repository is
// exactly {"isRepo":false}.
func (f GitFile) MarshalJSON() ([]byte, error) {
	if !f.IsRepo {
		return notRepoJSON, nil
	}
	type plain GitFile
	return json.Marshal(plain(f))
}
