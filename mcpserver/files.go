package mcpserver

import (
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"path"
	"strconv"
	"unicode/utf8"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/corral-sandbox/corral/client"
)

// PathArgs name a file of a project, as a user of its machine.
type PathArgs struct {
	ProjectArg
	Path string `json:"path" jsonschema:"the file's path: absolute in the machine (/workspace/x, /tmp/y) or relative to the workspace"`
	User string `json:"user,omitempty" jsonschema:"the machine's user to act as, a name or uid (default: the image's user)"`
}

// check returns the project of a call naming a file.
func (p PathArgs) check(t *tools) (int64, error) {
	return t.projectAnd(p.ProjectArg, "path", p.Path, "")
}

// ReadArgs are read_file's arguments.
type ReadArgs struct {
	PathArgs
	PageArgs
}

// FilePage is read_file's result.
type FilePage struct {
	Content string `json:"content"`
	// Encoding is "utf-8" when the bytes read are text, else "base64".
	Encoding string `json:"encoding" jsonschema:"utf-8 when content is the bytes as text, base64 when they are not valid UTF-8"`
	Size     int64  `json:"size" jsonschema:"the file's size"`
	Page
}

// WriteArgs are write_file's arguments.
type WriteArgs struct {
	PathArgs
	Content  string `json:"content" jsonschema:"the file's new content"`
	Encoding string `json:"encoding,omitempty" jsonschema:"utf-8 (the default: content is the text) or base64 (content is the bytes in base64)"`
	Mode     string `json:"mode,omitempty" jsonschema:"the file's permissions in octal, such as 0755 (default 0644)"`
}

// ListArgs are list_files' arguments.
type ListArgs struct {
	ProjectArg
	Path  string `json:"path,omitempty" jsonschema:"the directory (default: the workspace, /workspace)"`
	User  string `json:"user,omitempty" jsonschema:"the machine's user to act as, a name or uid (default: the image's user)"`
	Depth int    `json:"depth,omitempty" jsonschema:"how many levels to list (default 1: the directory's own entries)"`
	Limit int    `json:"limit,omitempty" jsonschema:"the most entries to return"`
}

// FileListing is list_files' result.
type FileListing struct {
	client.FileList
	Note string `json:"note,omitempty" jsonschema:"how to see what was not listed"`
}

func (t *tools) addFileTools(s *mcp.Server) {
	add(s, t, "read_file", fmt.Sprintf(`Read a file of the project's machine from offset: at most max_bytes (default %d, at most %d) bytes. Text comes as is (encoding utf-8), other bytes in base64. Continue with offset=next_offset while more is true.`, ResultText, MaxResultText),
		t.readFile)
	add(s, t, "write_file", fmt.Sprintf(`Replace a file of the project's machine with content (at most %s), atomically, creating missing parent directories. Returns the new file's description.`, size(MaxWrite)),
		t.writeFile)
	add(s, t, "list_files", fmt.Sprintf(`List a directory of the project's machine, depth levels down (default 1, at most 32): at most limit entries (default %d, at most %d).`, DefaultListEntries, MaxListEntries),
		t.listFiles)
	add(s, t, "stat_file", "Describe a file of the project's machine (type, size, mode, modification time, a symlink's target) without following a final symlink.",
		func(ctx context.Context, api API, in PathArgs) (client.FileInfo, error) {
			id, err := in.check(t)
			if err != nil {
				return client.FileInfo{}, err
			}
			return api.StatFile(ctx, id, in.Path, in.User)
		})
}

func (t *tools) readFile(ctx context.Context, api API, in ReadArgs) (FilePage, error) {
	id, err := in.check(t)
	if err != nil {
		return FilePage{}, err
	}
	limit, err := pageSize(in.MaxBytes)
	if err != nil {
		return FilePage{}, err
	}
	if in.Offset < 0 {
		return FilePage{}, fmt.Errorf("offset %d is negative", in.Offset)
	}
	body, info, err := api.ReadFile(ctx, id, in.Path, in.User)
	if err != nil {
		return FilePage{}, err
	}
	defer body.Close()
	out := FilePage{Size: info.Size, Page: Page{Offset: in.Offset, NextOffset: in.Offset}, Encoding: "utf-8"}
	if in.Offset >= info.Size {
		return out, nil
	}
	if _, err := io.CopyN(io.Discard, body, in.Offset); err != nil {
		return FilePage{}, fmt.Errorf("reading %s: %w", in.Path, err)
	}
	// One byte more than the page, to see whether a character continues.
	data, err := io.ReadAll(io.LimitReader(body, int64(limit)+utf8.UTFMax))
	if err != nil {
		return FilePage{}, fmt.Errorf("reading %s: %w", in.Path, err)
	}
	if p := page(data, limit); utf8.Valid(p) {
		out.Content = string(p)
		out.NextOffset += int64(len(p))
	} else {
		data = data[:min(len(data), limit)]
		out.Content, out.Encoding = base64.StdEncoding.EncodeToString(data), "base64"
		out.NextOffset += int64(len(data))
	}
	if out.More = out.NextOffset < info.Size; out.More {
		out.Note = fmt.Sprintf("[corral: the file has %d bytes; this is bytes %d to %d: call read_file with offset %d for the rest]", info.Size, out.Offset, out.NextOffset, out.NextOffset)
	}
	return out, nil
}

func (t *tools) writeFile(ctx context.Context, api API, in WriteArgs) (client.FileInfo, error) {
	id, err := in.check(t)
	if err != nil {
		return client.FileInfo{}, err
	}
	data := []byte(in.Content)
	switch in.Encoding {
	case "", "utf-8":
	case "base64":
		if data, err = base64.StdEncoding.DecodeString(in.Content); err != nil {
			return client.FileInfo{}, fmt.Errorf("content is not valid base64: %w", err)
		}
	default:
		return client.FileInfo{}, fmt.Errorf("encoding %q is neither utf-8 nor base64", in.Encoding)
	}
	if len(data) > MaxWrite {
		return client.FileInfo{}, fmt.Errorf("content has %d bytes, more than %d: write the file in parts (and join them with run_command)", len(data), MaxWrite)
	}
	var mode uint64
	if in.Mode != "" {
		if mode, err = strconv.ParseUint(in.Mode, 8, 32); err != nil || mode > 0o777 {
			return client.FileInfo{}, fmt.Errorf("mode %q is not an octal mode between 0 and 0777", in.Mode)
		}
	}
	fi, err := api.WriteFile(ctx, id, in.Path, in.User, uint32(mode), bytes.NewReader(data))
	if errors.Is(err, client.ErrNotFound) {
		// A missing parent directory.
		if _, merr := api.Mkdir(ctx, id, path.Dir(in.Path), in.User, 0, true); merr == nil {
			fi, err = api.WriteFile(ctx, id, in.Path, in.User, uint32(mode), bytes.NewReader(data))
		}
	}
	return fi, err
}

func (t *tools) listFiles(ctx context.Context, api API, in ListArgs) (FileListing, error) {
	id, err := t.project(in.ProjectArg)
	if err != nil {
		return FileListing{}, err
	}
	limit := in.Limit
	switch {
	case limit == 0:
		limit = DefaultListEntries
	case limit < 0 || limit > MaxListEntries:
		return FileListing{}, fmt.Errorf("limit %d is not between 1 and %d", limit, MaxListEntries)
	}
	if in.Depth < 0 {
		return FileListing{}, fmt.Errorf("depth %d is negative", in.Depth)
	}
	l, err := api.ListFiles(ctx, id, in.Path, in.User, in.Depth, limit)
	if err != nil {
		return FileListing{}, err
	}
	out := FileListing{FileList: *l}
	if out.Entries == nil {
		out.Entries = []client.FileInfo{}
	}
	if l.Truncated {
		out.Note = fmt.Sprintf("[corral: only the first %d entries are listed: list a subdirectory, a smaller depth, or a larger limit (at most %d)]", len(l.Entries), MaxListEntries)
	}
	return out, nil
}
