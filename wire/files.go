package wire

// Files (FeatureFiles): requests on the files of a project's machine,
// resolved inside the machine as a session user. The worker opens, the
// client reads and writes: no byte of a file's content crosses protocol 2.
//
//	client                                         worker
//	  │── file-request {id,project,user,op,path,…} ─►│  as the user, inside the
//	  │                                              │  machine's root
//	  │◄──────────────── file-entries {id,entries} … │  zero or more (list, watch)
//	  │◄───────────── file-opened {id,fds:1,…} [fd]  │  read, create, watch; or
//	  │◄────────────────── file-result {id,stat,…}   │  stat, list, mkdir, remove,
//	  │                                              │  rename; or
//	  │◄──────────────────── error {id,code,message} │  a Code of FeatureFiles
//
// Every request is answered by exactly one of file-opened, file-result and
// error, after the file-entries frames that belong to it. The ops:
//
//	op       answer                            what
//	read     file-opened [file opened O_RDONLY] a regular file, final symlink
//	                                            followed (inside the root)
//	create   file-opened [temp file O_WRONLY]  a new file ".corral-put-*"
//	         + "tmp": its path                 ("mode") in path's directory;
//	                                            the client writes it, fsyncs
//	                                            and renames it over path
//	stat     file-result {stat}                lstat: a final symlink is
//	                                            reported as one
//	list     file-entries…, file-result        a directory's entries to
//	         {stat, truncated}                 "depth" levels (0 means 1),
//	                                            at most "limit"
//	mkdir    file-result {stat}                "recursive": make parents
//	remove   file-result                       "recursive": a whole tree
//	                                            (symlinks never followed)
//	rename   file-result                       path → "to", replacing
//	watch    file-entries…, file-opened         an inotify descriptor with
//	         [inotify]                         watches on path (and, with
//	                                            "recursive", the directories
//	                                            below it); entries give each
//	                                            watch's "wd" and path
//	watch-add  as watch, carrying the client's  adds watches for path (and
//	         inotify descriptor (file-watch)   below) to that descriptor
//
// Paths are absolute guest paths or relative to the workspace, clean
// (no "." or ".." component, no NUL); they are resolved with openat2's
// RESOLVE_IN_ROOT and RESOLVE_NO_MAGICLINKS against the machine's root, so
// that no symlink leads out of the machine and no /proc magic link is
// followed; files of procfs, sysfs and cgroupfs are refused. Requests
// run with the user's ids (real, effective and filesystem uid and gid,
// supplementary groups; the saved ids stay root's) and no
// capability, on a thread of their own.
//
// watch-add is the frame file-watch {id,project,user,path,recursive,fds:1},
// which carries the inotify descriptor back to the worker; the worker
// closes its copy once it answered.

// FeatureFiles: the client may send file-request and file-watch (see
// [FileRequest]).
const FeatureFiles = "files"

// Message types of FeatureFiles.
const (
	TypeFileRequest = "file-request"
	TypeFileWatch   = "file-watch"
	TypeFileEntries = "file-entries"
	TypeFileOpened  = "file-opened"
	TypeFileResult  = "file-result"
)

// Error codes of file requests (error {id, code, message}).
const (
	CodeNotFound     = "not-found"         // ENOENT
	CodePermission   = "permission-denied" // EACCES, EPERM
	CodeExists       = "exists"            // EEXIST
	CodeNotDirectory = "not-directory"     // ENOTDIR
	CodeIsDirectory  = "is-directory"      // EISDIR, or a read of a directory
	CodeNotEmpty     = "not-empty"         // ENOTEMPTY
	CodeNoSpace      = "no-space"          // ENOSPC, EDQUOT
	// CodeBadPath: a path that is not clean, leads through a magic link
	// (ELOOP, EXDEV), into procfs, sysfs or cgroupfs, or to a file that is
	// not a regular file where one is needed.
	CodeBadPath = "bad-path"
	// CodeFileFailed: any other failure.
	CodeFileFailed = "file-failed"
)

// File request ops ([FileRequest.Op]).
const (
	OpRead   = "read"
	OpCreate = "create"
	OpStat   = "stat"
	OpList   = "list"
	OpMkdir  = "mkdir"
	OpRemove = "remove"
	OpRename = "rename"
	OpWatch  = "watch"
)

// FileRequest asks for one operation on a file of the project's machine
// (FeatureFiles).
type FileRequest struct {
	ID      string  `json:"id"`
	Project Project `json:"project"`
	// User is whom the request runs as: a user name or numeric uid of
	// the machine; empty is the machine's default user.
	User string `json:"user,omitempty"`
	Op   string `json:"op"`
	Path string `json:"path"`
	// To is rename's destination.
	To string `json:"to,omitempty"`
	// Mode is the permission bits of mkdir's directory (0 means 0755)
	// and of create's file (0 means 0644; set-id bits are dropped).
	Mode uint32 `json:"mode,omitempty"`
	// Recursive: mkdir makes parents, remove removes a tree, watch
	// watches subdirectories.
	Recursive bool `json:"recursive,omitempty"`
	// Depth is how many levels list descends (0 means 1).
	Depth int `json:"depth,omitempty"`
	// Limit bounds the entries of list and the watches of watch (0 means
	// the worker's bound).
	Limit int `json:"limit,omitempty"`
}

// FileWatch adds watches to the inotify descriptor it carries (one
// descriptor), as FileRequest's watch op does (FeatureFiles).
type FileWatch struct {
	ID        string  `json:"id"`
	Project   Project `json:"project"`
	User      string  `json:"user,omitempty"`
	Path      string  `json:"path"`
	Recursive bool    `json:"recursive,omitempty"`
	Limit     int     `json:"limit,omitempty"`
}

// FileStat describes one file. Path is the guest path the request named
// (for an entry: below it); Type is "file", "dir", "symlink" or "other".
type FileStat struct {
	Name  string `json:"name"`
	Path  string `json:"path"`
	Type  string `json:"type"`
	Size  int64  `json:"size"`
	Mode  uint32 `json:"mode"`  // permission bits and set-id/sticky bits
	MTime int64  `json:"mtime"` // nanoseconds since the Unix epoch
	// Target is a symlink's target, as stored.
	Target string `json:"target,omitempty"`
	// WD is the inotify watch descriptor of a watch's entry.
	WD int `json:"wd,omitempty"`
}

// FileEntries carries part of a list's entries or of a watch's watches;
// more may follow, then the request's answer.
type FileEntries struct {
	ID      string     `json:"id"`
	Entries []FileStat `json:"entries"`
}

// FileOpened answers a read, create or watch and carries one descriptor.
type FileOpened struct {
	ID string `json:"id"`
	// Stat is the opened file's (read) or nil.
	Stat *FileStat `json:"stat,omitempty"`
	// Tmp is the guest path of the temporary file a create made.
	Tmp string `json:"tmp,omitempty"`
	// Truncated: a watch's limit left directories unwatched.
	Truncated bool `json:"truncated,omitempty"`
}

// FileResult answers a stat, list, mkdir, remove, rename or file-watch.
type FileResult struct {
	ID        string    `json:"id"`
	Stat      *FileStat `json:"stat,omitempty"`
	Truncated bool      `json:"truncated,omitempty"`
}

func (FileRequest) Type() string { return TypeFileRequest }
func (FileWatch) Type() string   { return TypeFileWatch }
func (FileEntries) Type() string { return TypeFileEntries }
func (FileOpened) Type() string  { return TypeFileOpened }
func (FileResult) Type() string  { return TypeFileResult }

// newFileMessage is newMessage for FeatureFiles's types.
func newFileMessage(t string) Message {
	switch t {
	case TypeFileRequest:
		return &FileRequest{}
	case TypeFileWatch:
		return &FileWatch{}
	case TypeFileEntries:
		return &FileEntries{}
	case TypeFileOpened:
		return &FileOpened{}
	case TypeFileResult:
		return &FileResult{}
	}
	return nil
}

// fileID returns the id of a FeatureFiles message, and false for any
// other message.
func fileID(m Message) (string, bool) {
	switch m := m.(type) {
	case *FileRequest:
		return m.ID, true
	case *FileWatch:
		return m.ID, true
	case *FileEntries:
		return m.ID, true
	case *FileOpened:
		return m.ID, true
	case *FileResult:
		return m.ID, true
	}
	return "", false
}
