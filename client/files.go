package client

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"

	"github.com/coder/websocket"

	"github.com/corral-sandbox/corral/api"
)

// Files of a project (the daemon's files API). Paths are guest paths: for
// a managed project absolute in its machine (/workspace/x, /home/corral/y)
// or relative to the workspace; for a host project under /workspace (its
// root) or relative to it. User, where a method takes one, is a user of a
// managed project's machine (a name or uid; empty is the machine's
// default); host projects take none. Errors of the API are *Error (404 not
// found, 403 permission denied, 400 a refused path, 507 the disk is full).

// FileInfo describes a file (api.File).
type FileInfo = api.File

// FileList is a directory and its entries.
type FileList = api.FileList

// FileEvent is one event of WatchFiles: Type "create", "modify",
// "delete", "rename" (From is the old path) or "overflow".
type FileEvent = api.FileEvent

func filesURL(projectID int64, op string, q url.Values) string {
	p := fmt.Sprintf("/v1/projects/%d/files", projectID)
	if op != "" {
		p += "/" + op
	}
	return p + "?" + q.Encode()
}

func fileQuery(path, user string) url.Values {
	q := url.Values{"path": {path}}
	if user != "" {
		q.Set("user", user)
	}
	return q
}

// ReadFile opens the file at path for reading, streamed: the caller reads
// and closes the body. size is the file's size as the daemon announced it.
func (c *Client) ReadFile(ctx context.Context, projectID int64, path, user string) (body io.ReadCloser, info FileInfo, err error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.URL(filesURL(projectID, "", fileQuery(path, user))), nil)
	if err != nil {
		return nil, FileInfo{}, fmt.Errorf("client: %w", err)
	}
	req.Header = c.Header()
	resp, err := c.http.Do(req)
	if err != nil {
		return nil, FileInfo{}, fmt.Errorf("client: read %s: %w", path, err)
	}
	if resp.StatusCode != http.StatusOK {
		defer resp.Body.Close()
		data, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
		return nil, FileInfo{}, decodeError(resp.StatusCode, resp.Header, data)
	}
	info = FileInfo{Path: path, Type: "file", Size: resp.ContentLength, Mode: resp.Header.Get("X-Corral-Mode")}
	if t, err := http.ParseTime(resp.Header.Get("Last-Modified")); err == nil {
		info.MTime = t
	}
	return resp.Body, info, nil
}

// WriteFile replaces the file at path with what r yields, streamed, with
// mode (0 means 0644), atomically: readers see the old file or the whole
// new one. It returns the new file's description.
func (c *Client) WriteFile(ctx context.Context, projectID int64, path, user string, mode uint32, r io.Reader) (FileInfo, error) {
	q := fileQuery(path, user)
	if mode != 0 {
		q.Set("mode", fmt.Sprintf("%04o", mode&0o777))
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPut, c.URL(filesURL(projectID, "", q)), r)
	if err != nil {
		return FileInfo{}, fmt.Errorf("client: %w", err)
	}
	req.Header = c.Header()
	req.Header.Set("Content-Type", "application/octet-stream")
	resp, err := c.http.Do(req)
	if err != nil {
		return FileInfo{}, fmt.Errorf("client: write %s: %w", path, err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return FileInfo{}, fmt.Errorf("client: write %s: %w", path, err)
	}
	if resp.StatusCode != http.StatusOK {
		return FileInfo{}, decodeError(resp.StatusCode, resp.Header, data)
	}
	var fi FileInfo
	if err := json.Unmarshal(data, &fi); err != nil {
		return FileInfo{}, fmt.Errorf("client: write %s: decode answer: %w", path, err)
	}
	return fi, nil
}

// StatFile describes path without following a final symlink.
func (c *Client) StatFile(ctx context.Context, projectID int64, path, user string) (FileInfo, error) {
	var fi FileInfo
	err := c.Do(ctx, http.MethodGet, filesURL(projectID, "stat", fileQuery(path, user)), nil, &fi)
	return fi, err
}

// ListFiles lists directory path to depth levels (0 means 1), at most
// limit entries (0: the daemon's bound, 10,000).
func (c *Client) ListFiles(ctx context.Context, projectID int64, path, user string, depth, limit int) (*FileList, error) {
	q := fileQuery(path, user)
	if depth > 0 {
		q.Set("depth", strconv.Itoa(depth))
	}
	if limit > 0 {
		q.Set("limit", strconv.Itoa(limit))
	}
	var l FileList
	if err := c.Do(ctx, http.MethodGet, filesURL(projectID, "list", q), nil, &l); err != nil {
		return nil, err
	}
	return &l, nil
}

// Mkdir makes directory path with mode (0 means 0755); with parents, its
// missing parents too (an existing directory is then no error).
func (c *Client) Mkdir(ctx context.Context, projectID int64, path, user string, mode uint32, parents bool) (FileInfo, error) {
	body := map[string]any{"path": path, "parents": parents}
	if mode != 0 {
		body["mode"] = fmt.Sprintf("%04o", mode)
	}
	if user != "" {
		body["user"] = user
	}
	var fi FileInfo
	err := c.Do(ctx, http.MethodPost, fmt.Sprintf("/v1/projects/%d/files/mkdir", projectID), body, &fi)
	return fi, err
}

// RemoveFile removes path; a non-empty directory only with recursive.
func (c *Client) RemoveFile(ctx context.Context, projectID int64, path, user string, recursive bool) error {
	body := map[string]any{"path": path, "recursive": recursive}
	if user != "" {
		body["user"] = user
	}
	return c.Do(ctx, http.MethodPost, fmt.Sprintf("/v1/projects/%d/files/remove", projectID), body, nil)
}

// RenameFile renames from to to (replacing a file at to).
func (c *Client) RenameFile(ctx context.Context, projectID int64, from, to, user string) error {
	body := map[string]any{"from": from, "to": to}
	if user != "" {
		body["user"] = user
	}
	return c.Do(ctx, http.MethodPost, fmt.Sprintf("/v1/projects/%d/files/rename", projectID), body, nil)
}

// FileWatch is an open watch: Next returns its events in order.
type FileWatch struct {
	conn *websocket.Conn
}

// WatchFiles watches directory path (and, with recursive, the
// directories below it, including those created later). Close the watch
// when done.
func (c *Client) WatchFiles(ctx context.Context, projectID int64, path, user string, recursive bool) (*FileWatch, error) {
	q := fileQuery(path, user)
	if recursive {
		q.Set("recursive", "1")
	}
	u := c.URL(filesURL(projectID, "watch", q))
	conn, resp, err := websocket.Dial(ctx, u, &websocket.DialOptions{HTTPClient: c.http, HTTPHeader: c.Header()})
	if err != nil {
		if resp != nil && resp.StatusCode/100 != 2 && resp.StatusCode != http.StatusSwitchingProtocols {
			data, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
			return nil, decodeError(resp.StatusCode, resp.Header, data)
		}
		return nil, fmt.Errorf("client: watch %s: %w", path, err)
	}
	conn.SetReadLimit(1 << 20)
	return &FileWatch{conn: conn}, nil
}

// Next blocks for the next event; ctx bounds the wait.
func (w *FileWatch) Next(ctx context.Context) (FileEvent, error) {
	_, b, err := w.conn.Read(ctx)
	if err != nil {
		return FileEvent{}, fmt.Errorf("client: watch: %w", err)
	}
	var ev FileEvent
	if err := json.Unmarshal(b, &ev); err != nil {
		return FileEvent{}, fmt.Errorf("client: watch: %w", err)
	}
	return ev, nil
}

// Close ends the watch. Idempotent.
func (w *FileWatch) Close() error {
	return w.conn.Close(websocket.StatusNormalClosure, "")
}
