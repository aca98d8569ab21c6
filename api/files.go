package api

import (
	"strconv"
	"time"
)

// The files API of a project: paths are guest paths (for a managed project
// absolute in its machine, /workspace/x, or relative to the workspace; for
// a host project under /workspace, its root, or relative to it).

// The types of File.
const (
	FileTypeFile    = "file"
	FileTypeDir     = "dir"
	FileTypeSymlink = "symlink"
	FileTypeOther   = "other"
)

// File describes a file.
type File struct {
	Name string `json:"name"`
	// Path is the file's guest path (/workspace/...).
	Path string `json:"path"`
	// Type is FileTypeFile, FileTypeDir, FileTypeSymlink or FileTypeOther.
	Type string `json:"type"`
	Size int64  `json:"size"`
	// Mode is the permission bits, with set-id and sticky bits, as an
	// octal string ("0644").
	Mode  string    `json:"mode"`
	MTime time.Time `json:"mtime"`
	// Target is a symlink's target.
	Target string `json:"target,omitempty"`
}

// IsDir reports whether f is a directory.
func (f File) IsDir() bool { return f.Type == FileTypeDir }

// Perm returns f's mode as a number (0 if it does not parse).
func (f File) Perm() uint32 {
	v, _ := strconv.ParseUint(f.Mode, 8, 32)
	return uint32(v)
}

// FileList answers GET …/files/list: a directory and its entries.
type FileList struct {
	Dir       File   `json:"dir"`
	Entries   []File `json:"entries"`
	Truncated bool   `json:"truncated"`
}

// FileMkdirRequest is the body of POST …/files/mkdir.
type FileMkdirRequest struct {
	Path string `json:"path"`
	// Mode is octal ("0755", the default).
	Mode    string `json:"mode,omitempty"`
	Parents bool   `json:"parents,omitempty"`
	User    string `json:"user,omitempty"`
}

// FileRemoveRequest is the body of POST …/files/remove.
type FileRemoveRequest struct {
	Path      string `json:"path"`
	Recursive bool   `json:"recursive,omitempty"`
	User      string `json:"user,omitempty"`
}

// FileRenameRequest is the body of POST …/files/rename.
type FileRenameRequest struct {
	From string `json:"from"`
	To   string `json:"to"`
	User string `json:"user,omitempty"`
}

// FileEvent is one message of the files watch WebSocket: Type is
// "create", "modify", "delete", "rename" (From is the old path) or
// "overflow" (the kernel dropped events).
type FileEvent struct {
	Type  string `json:"type"`
	Path  string `json:"path,omitempty"`
	From  string `json:"from,omitempty"`
	IsDir bool   `json:"isDir,omitempty"`
}
