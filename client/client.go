// Package client is the Go client of corral's daemon API.
//
//	c, err := client.New("/var/lib/corral/corral.sock", token)
//	res, err := c.RunCommand(ctx, projectID, client.CommandRequest{
//		Command: api.Command{Type: "argv", File: "git", Args: []string{"status"}},
//	})
//
// RunCommand returns the API's result type for every completed command (a
// nonzero exit included) and a *Error, which carries the API's kind,
// status and partial output, for everything else. The types of requests
// and answers are package api's (this package names them by alias), so
// that the client builds on every GOOS.
//
// Every operation of the daemon's OpenAPI document (docs/openapi.json) has
// a method named after it (CreateProject for createProject, OpenSession
// for openSession, …); Do and DialWebSocket reach any other path. Every
// error answer is a *Error, which errors.Is matches against ErrForbidden,
// ErrNotFound, ErrBusy and the other sentinels by status:
//
//	if _, err := c.Project(ctx, id); errors.Is(err, client.ErrForbidden) { … }
//
// OpenSession runs one command over a WebSocket with its standard streams
// (and optionally a terminal):
//
//	s, err := c.OpenSession(ctx, id, client.SessionRequest{Argv: []string{"sh"}, Stdout: os.Stdout, Stderr: os.Stderr})
//	go io.Copy(s.Stdin(), os.Stdin)
//	exit, err := s.Wait()
package client

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/corral-sandbox/corral/api"
)

// Client talks to one daemon as one account. It is safe for concurrent
// use. The zero value is not usable; use New.
type Client struct {
	base  *url.URL
	token string
	http  *http.Client
}

// New returns a client of the daemon at addr: a Unix socket path (anything
// containing a '/' that is not a URL), "unix:PATH", a "host:port", or an
// http(s) URL. token is the bearer token; empty sends none.
func New(addr, token string) (*Client, error) {
	c := &Client{token: token}
	switch {
	case strings.HasPrefix(addr, "http://"), strings.HasPrefix(addr, "https://"):
		u, err := url.Parse(addr)
		if err != nil {
			return nil, fmt.Errorf("client: daemon address: %w", err)
		}
		c.base = u
		c.http = &http.Client{}
	case strings.HasPrefix(addr, "unix:"), strings.Contains(addr, "/"):
		path := strings.TrimPrefix(addr, "unix:")
		c.base = &url.URL{Scheme: "http", Host: "corral"}
		c.http = &http.Client{Transport: &http.Transport{
			DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
				var d net.Dialer
				return d.DialContext(ctx, "unix", path)
			},
		}}
	case addr != "":
		c.base = &url.URL{Scheme: "http", Host: addr}
		c.http = &http.Client{}
	default:
		return nil, errors.New("client: no daemon address")
	}
	return c, nil
}

// HTTPClient returns the http.Client the client uses (for WebSocket dials).
func (c *Client) HTTPClient() *http.Client { return c.http }

// WithToken returns a client of the same daemon, over the same connections,
// that authenticates with token (empty sends none).
func (c *Client) WithToken(token string) *Client {
	c2 := *c
	c2.token = token
	return &c2
}

// WithHTTPClient returns a client of the same daemon that sends its
// requests with hc: a transport of the caller's (an in-process one, a
// proxy's). hc must not be nil.
func (c *Client) WithHTTPClient(hc *http.Client) *Client {
	c2 := *c
	c2.http = hc
	return &c2
}

// URL returns the absolute URL of an API path such as "/v1/projects" or
// "/v1/projects/3/sessions?tty=1". path is taken as already escaped: a
// query after '?' is kept as the query, and escapes such as %2F (from
// url.PathEscape) stay escapes, never escaped twice.
func (c *Client) URL(path string) string {
	u := *c.base
	p, query, hasQuery := strings.Cut(path, "?")
	u.RawQuery, u.ForceQuery = query, hasQuery && query == ""
	u.Fragment, u.RawFragment = "", ""
	escaped := strings.TrimSuffix(u.EscapedPath(), "/") + p
	if unescaped, err := url.PathUnescape(escaped); err == nil {
		u.Path, u.RawPath = unescaped, escaped
	} else {
		// Not a valid escape: taken literally (and escaped on output).
		u.Path, u.RawPath = strings.TrimSuffix(u.Path, "/")+p, ""
	}
	return u.String()
}

// Header returns the headers every request carries (the bearer token).
func (c *Client) Header() http.Header {
	h := http.Header{}
	if c.token != "" {
		h.Set("Authorization", "Bearer "+c.token)
	}
	return h
}

// Error is an error answer of the API: its pinned body
// {"error":{"kind","message","stdout","stderr"}} and the HTTP status. Kind
// is an api.ErrorKind: a command's kind for a command that did not
// complete, otherwise one of the API's kinds ("unauthorized", "forbidden",
// "notFound", "invalid", "unavailable", ...); an answer that is not a pinned error
// body (a proxy's, say) has Kind "http" and the start of the body as its
// Message.
//
// errors.Is matches an *Error against the sentinels ErrUnauthorized,
// ErrForbidden, ErrNotFound, ErrInvalid, ErrRequestTooLarge, ErrConflict,
// ErrBusy and ErrUnavailable by status (so that a 429 "prepare" is
// ErrBusy and a 400 "prepare" is ErrInvalid), and any two *Error values
// with the same Kind when the target has no status.
type Error struct {
	Status  int
	Kind    string
	Message string
	Stdout  string
	Stderr  string
	// Reason is a start error's reason: "notFound" (no such program),
	// "notExecutable" or empty.
	Reason string
	// RetryAfter is the Retry-After of a 429 answer (zero otherwise).
	RetryAfter time.Duration
}

func (e *Error) Error() string {
	return fmt.Sprintf("corral daemon: %d %s: %s", e.Status, e.Kind, e.Message)
}

// Is reports whether target is a sentinel of e's status (see Error), or
// an *Error without a status whose Kind is e's.
func (e *Error) Is(target error) bool {
	t, ok := target.(*Error)
	if !ok {
		return false
	}
	if sentinelStatus, ok := sentinels[t]; ok {
		return e.Status == sentinelStatus
	}
	return t.Status == 0 && t.Kind != "" && t.Kind == e.Kind
}

// Sentinels of the daemon's error statuses, for errors.Is: each is its
// kind's (api.ErrorKind.Status).
var (
	ErrInvalid         = sentinel(api.KindInvalid)
	ErrUnauthorized    = sentinel(api.KindUnauthorized)
	ErrForbidden       = sentinel(api.KindForbidden)
	ErrNotFound        = sentinel(api.KindNotFound)
	ErrConflict        = sentinel(api.KindConflict)
	ErrRequestTooLarge = sentinel(api.KindRequestTooLarge)
	ErrBusy            = sentinel(api.KindBusy)
	ErrUnavailable     = sentinel(api.KindUnavailable)
)

// sentinels maps each sentinel to its status.
var sentinels = map[*Error]int{}

func sentinel(k api.ErrorKind) *Error {
	e := &Error{Kind: string(k), Message: strconv.Itoa(k.Status())}
	sentinels[e] = k.Status()
	return e
}

// CommandRequest is the body of a command request; see api.CommandRequest
// for each field's zero value. Stdin is sent whole in the request, so it is bounded
// by the daemon's limit (16 MiB by default). With Encoding
// EncodingBase64 the output travels as base64, and the client decodes it:
// the result's and an *Error's Stdout and Stderr, and the chunks
// StreamCommand's callbacks see, are then the exact bytes the command
// wrote.
type CommandRequest = api.CommandRequest

// CommandResult is a command that ran to completion.
type CommandResult = api.CommandResult

// EncodingBase64 is CommandRequest.Encoding for binary-safe output.
const EncodingBase64 = api.EncodingBase64

// MediaNDJSON is the media type of a streamed command answer.
const MediaNDJSON = api.MediaNDJSON

// RunCommand runs one bounded command in project id (runCommand) and
// returns its result: every completed command, whatever its exit code. Any other
// outcome is a *Error (with the partial output of a command that started),
// or a transport error of the HTTP request. Cancelling ctx closes the
// request, which makes the daemon abort the command.
func (c *Client) RunCommand(ctx context.Context, projectID int64, req CommandRequest) (*CommandResult, error) {
	return c.StreamCommand(ctx, projectID, req, nil, nil)
}

// StreamCommand is RunCommand with the answer streamed (Accept:
// application/x-ndjson) when onStdout or onStderr is non-nil: each is
// called with the chunks of its stream as they arrive, in order, from the
// goroutine that called StreamCommand (never concurrently); p is valid only
// during the call. The result and the errors are those of an unstreamed
// request; an error that ended a streamed answer (the command started,
// then timed out, say) is a *Error whose Status is 200, the status the
// answer had.
func (c *Client) StreamCommand(ctx context.Context, projectID int64, req CommandRequest, onStdout, onStderr func(p []byte)) (*CommandResult, error) {
	path := "/v1/projects/" + strconv.FormatInt(projectID, 10) + "/commands"
	var res CommandResult
	var err error
	if onStdout != nil || onStderr != nil {
		err = c.streamCommand(ctx, path, req, &res, onStdout, onStderr)
	} else {
		err = c.Do(ctx, http.MethodPost, path, req, &res)
	}
	if req.Encoding == EncodingBase64 {
		var e *Error
		if errors.As(err, &e) {
			_ = decodeOutput(&e.Stdout, &e.Stderr)
		} else if err == nil {
			err = decodeOutput(&res.Stdout, &res.Stderr)
		}
	}
	if err != nil {
		return nil, err
	}
	return &res, nil
}

// decodeOutput decodes base64 output in place.
func decodeOutput(stdout, stderr *string) error {
	for _, p := range []*string{stdout, stderr} {
		b, err := base64.StdEncoding.DecodeString(*p)
		if err != nil {
			return fmt.Errorf("client: decode base64 output: %w", err)
		}
		*p = string(b)
	}
	return nil
}

// streamCommand sends a command request asking for a streamed answer and
// reads it: chunks to the callbacks, the last line into res or an *Error.
func (c *Client) streamCommand(ctx context.Context, path string, creq CommandRequest, res *CommandResult, onStdout, onStderr func([]byte)) error {
	b, err := json.Marshal(creq)
	if err != nil {
		return fmt.Errorf("client: encode request: %w", err)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.URL(path), bytes.NewReader(b))
	if err != nil {
		return fmt.Errorf("client: %w", err)
	}
	req.Header = c.Header()
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", MediaNDJSON+", application/json")
	resp, err := c.http.Do(req)
	if err != nil {
		return fmt.Errorf("client: POST %s: %w", path, err)
	}
	defer resp.Body.Close()
	body := io.LimitReader(resp.Body, 256<<20)
	if mt, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type")); resp.StatusCode != http.StatusOK || mt != MediaNDJSON {
		data, err := io.ReadAll(body)
		if err != nil {
			return fmt.Errorf("client: POST %s: read answer: %w", path, err)
		}
		if resp.StatusCode/100 != 2 {
			return decodeError(resp.StatusCode, resp.Header, data)
		}
		if err := json.Unmarshal(data, res); err != nil {
			return fmt.Errorf("client: POST %s: decode answer: %w", path, err)
		}
		return nil
	}
	binary := creq.Encoding == EncodingBase64
	br := bufio.NewReaderSize(body, 64<<10)
	for {
		line, err := br.ReadBytes('\n')
		if err != nil {
			if err == io.EOF {
				err = io.ErrUnexpectedEOF
			}
			return fmt.Errorf("client: POST %s: streamed answer ended without a result: %w", path, err)
		}
		var m map[string]json.RawMessage
		if err := json.Unmarshal(line, &m); err != nil {
			return fmt.Errorf("client: POST %s: decode streamed line: %w", path, err)
		}
		if _, ok := m["error"]; ok {
			return decodeError(resp.StatusCode, nil, line)
		}
		if _, ok := m["code"]; ok {
			if err := json.Unmarshal(line, res); err != nil {
				return fmt.Errorf("client: POST %s: decode answer: %w", path, err)
			}
			return nil
		}
		for _, s := range []struct {
			name string
			fn   func([]byte)
		}{{"stdout", onStdout}, {"stderr", onStderr}} {
			raw, ok := m[s.name]
			if !ok {
				continue
			}
			var chunk string
			if err := json.Unmarshal(raw, &chunk); err != nil {
				return fmt.Errorf("client: POST %s: decode streamed %s: %w", path, s.name, err)
			}
			p := []byte(chunk)
			if binary {
				if p, err = base64.StdEncoding.DecodeString(chunk); err != nil {
					return fmt.Errorf("client: POST %s: decode streamed %s: %w", path, s.name, err)
				}
			}
			if s.fn != nil {
				s.fn(p)
			}
		}
	}
}

// Do sends one JSON request (body nil sends none) and decodes a 2xx JSON
// answer into out (nil discards it). An error answer is a *Error.
func (c *Client) Do(ctx context.Context, method, path string, body, out any) error {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return fmt.Errorf("client: encode request: %w", err)
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.URL(path), rd)
	if err != nil {
		return fmt.Errorf("client: %w", err)
	}
	req.Header = c.Header()
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return fmt.Errorf("client: %s %s: %w", method, path, err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, 256<<20))
	if err != nil {
		return fmt.Errorf("client: %s %s: read answer: %w", method, path, err)
	}
	if resp.StatusCode/100 != 2 {
		return decodeError(resp.StatusCode, resp.Header, data)
	}
	if out == nil || len(data) == 0 {
		return nil
	}
	if err := json.Unmarshal(data, out); err != nil {
		return fmt.Errorf("client: %s %s: decode answer: %w", method, path, err)
	}
	return nil
}

// decodeError decodes an error answer; h (may be nil) gives its
// Retry-After.
func decodeError(status int, h http.Header, data []byte) *Error {
	out := decodeErrorBody(status, data)
	if status == http.StatusTooManyRequests && h != nil {
		if n, err := strconv.Atoi(h.Get("Retry-After")); err == nil && n >= 0 {
			out.RetryAfter = time.Duration(n) * time.Second
		}
	}
	return out
}

func decodeErrorBody(status int, data []byte) *Error {
	var e api.ErrorBody
	if err := e.UnmarshalJSON(data); err != nil {
		msg := strings.TrimSpace(string(data))
		if len(msg) > 512 {
			msg = msg[:512]
		}
		if msg == "" {
			msg = http.StatusText(status)
		}
		return &Error{Status: status, Kind: "http", Message: msg}
	}
	return &Error{Status: status, Kind: e.Kind, Message: e.Message, Stdout: e.Stdout, Stderr: e.Stderr, Reason: e.Reason}
}

// Project is a project as the API shows it.
type Project = api.Project

// CreateProject creates a project owned by the client's account
// (createProject); see ProjectRequest.
func (c *Client) CreateProject(ctx context.Context, req ProjectRequest) (*Project, error) {
	var p Project
	if err := c.Do(ctx, http.MethodPost, "/v1/projects", req, &p); err != nil {
		return nil, err
	}
	return &p, nil
}

// ProjectRequest is the body of CreateProject. Kind is "managed" (the
// default) or "host"; a host project's Root, a managed project's From
// (a host directory copied in) and local Git URLs are host paths, which
// the daemon refuses (403) unless it allows them and an admin granted
// them to the account. Git is a URL cloned into a new managed workspace.
// ExportRemotes narrows the remotes the project may be exported to.
type ProjectRequest = api.ProjectRequest

// Projects lists the client's account's projects (listProjects).
func (c *Client) Projects(ctx context.Context) ([]Project, error) {
	var ps []Project
	if err := c.Do(ctx, http.MethodGet, "/v1/projects", nil, &ps); err != nil {
		return nil, err
	}
	return ps, nil
}

// AddMember adds the named account to project id (addMember; owners
// only), as an owner if owner is true, else as a member.
func (c *Client) AddMember(ctx context.Context, projectID int64, account string, owner bool) error {
	req := api.MemberRequest{Account: account}
	if owner {
		req.Role = api.RoleOwner
	}
	return c.Do(ctx, http.MethodPost, "/v1/projects/"+strconv.FormatInt(projectID, 10)+"/members", req, nil)
}

// PublishSite publishes port of project id under name (publishSite;
// served at /sites/{name}/; 409 for a name another project holds).
func (c *Client) PublishSite(ctx context.Context, projectID int64, name string, port int) error {
	return c.Do(ctx, http.MethodPut, "/v1/projects/"+strconv.FormatInt(projectID, 10)+"/sites/"+url.PathEscape(name), api.SiteRequest{Port: port}, nil)
}

// SiteURL returns a signed URL that opens path ("" means "/") of project
// id's site name in a browser, on the site's own origin, valid for ttl
// (zero means the daemon's default, 5 min; at most 1 h). The daemon needs
// a sites domain (corral daemon --sites-domain); the URL is bound to the
// caller's account and token and works only while both may visit the site.
func (c *Client) SiteURL(ctx context.Context, projectID int64, name, path string, ttl time.Duration) (string, error) {
	var out api.SiteURL
	req := api.SiteURLRequest{Path: path, ExpiresInSeconds: int(ttl / time.Second)}
	err := c.Do(ctx, http.MethodPost, "/v1/projects/"+strconv.FormatInt(projectID, 10)+"/sites/"+url.PathEscape(name)+"/url", req, &out)
	return out.URL, err
}
