// Package client is the Go client of corral's daemon API.
//
//	c, err := client.New("/var/lib/corral/corral.sock", token)
//	res, err := c.RunCommand(ctx, projectID, client.CommandRequest{
//		Command: sandbox.Command{Type: "argv", File: "git", Args: []string{"status"}},
//	})
//
// RunCommand returns the sandbox's own result type for every completed
// command (a nonzero exit included) and a *Error, which carries the API's
// kind, status and partial output, for everything else.
package client

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"time"
	"strings"

	"github.com/corral-sandbox/corral/sandbox"
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

// URL returns the absolute URL of an API path such as "/v1/projects".
func (c *Client) URL(path string) string {
	u := *c.base
	u.Path = strings.TrimSuffix(u.Path, "/") + path
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
// is a sandbox.ErrorKind for a command that did not complete, otherwise
// one of the daemon's kinds ("unauthorized", "forbidden", "notFound",
// "invalid", "unavailable", ...).
type Error struct {
	Status  int
	Kind    string
	Message string
	Stdout  string
	Stderr  string
}

func (e *Error) Error() string {
	return fmt.Sprintf("corral daemon: %d %s: %s", e.Status, e.Kind, e.Message)
}

// CommandRequest is the body of a command request; see the daemon's
// CommandRequest for each field's zero value.
type CommandRequest struct {
	Command     sandbox.Command     `json:"command"`
	Cwd         string              `json:"cwd,omitempty"`
	User        string              `json:"user,omitempty"`
	LeaseKind   sandbox.LeaseKind   `json:"leaseKind,omitempty"`
	TimeoutMs   int64               `json:"timeoutMs,omitempty"`
	OutputLimit sandbox.OutputLimit `json:"outputLimit"`
}

// RunCommand runs one bounded command in project id and returns its
// result: every completed command, whatever its exit code. Any other
// outcome is a *Error (with the partial output of a command that started),
// or a transport error of the HTTP request. Cancelling ctx closes the
// request, which makes the daemon abort the command.
func (c *Client) RunCommand(ctx context.Context, projectID int64, req CommandRequest) (*sandbox.CommandResult, error) {
	var res sandbox.CommandResult
	if err := c.Do(ctx, http.MethodPost, "/v1/projects/"+strconv.FormatInt(projectID, 10)+"/commands", req, &res); err != nil {
		return nil, err
	}
	return &res, nil
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
		return decodeError(resp.StatusCode, data)
	}
	if out == nil || len(data) == 0 {
		return nil
	}
	if err := json.Unmarshal(data, out); err != nil {
		return fmt.Errorf("client: %s %s: decode answer: %w", method, path, err)
	}
	return nil
}

func decodeError(status int, data []byte) *Error {
	var e sandbox.ErrorBody
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
	return &Error{Status: status, Kind: e.Kind, Message: e.Message, Stdout: e.Stdout, Stderr: e.Stderr}
}

// Project is a project as the API shows it.
type Project struct {
	ID   int64  `json:"id"`
	Name string `json:"name"`
	Kind string `json:"kind"`
	Root string `json:"root,omitempty"`
	Role string `json:"role,omitempty"`
}

// CreateProject creates a project owned by the client's account. kind is
// "managed" or "host"; see the daemon's ProjectRequest.
func (c *Client) CreateProject(ctx context.Context, req ProjectRequest) (*Project, error) {
	var p Project
	if err := c.Do(ctx, http.MethodPost, "/v1/projects", req, &p); err != nil {
		return nil, err
	}
	return &p, nil
}

// ProjectRequest is the body of CreateProject.
type ProjectRequest struct {
	Name string `json:"name"`
	Kind string `json:"kind,omitempty"`
	Root string `json:"root,omitempty"`
	From string `json:"from,omitempty"`
	Git  string `json:"git,omitempty"`
}

// Projects lists the client's account's projects.
func (c *Client) Projects(ctx context.Context) ([]Project, error) {
	var ps []Project
	if err := c.Do(ctx, http.MethodGet, "/v1/projects", nil, &ps); err != nil {
		return nil, err
	}
	return ps, nil
}

// AddMember adds the named account to project id.
func (c *Client) AddMember(ctx context.Context, projectID int64, account string, owner bool) error {
	req := map[string]any{"account": account}
	if owner {
		req["role"] = "owner"
	}
	return c.Do(ctx, http.MethodPost, "/v1/projects/"+strconv.FormatInt(projectID, 10)+"/members", req, nil)
}

// PublishSite publishes port of project id under name (/sites/{name}/).
func (c *Client) PublishSite(ctx context.Context, projectID int64, name string, port int) error {
	return c.Do(ctx, http.MethodPut, "/v1/projects/"+strconv.FormatInt(projectID, 10)+"/sites/"+url.PathEscape(name), map[string]int{"port": port}, nil)
}

// SiteURL returns a signed URL that opens path ("" means "/") of project
// id's site name in a browser, on the site's own origin, valid for ttl
// (zero means the daemon's default, 5 min; at most 1 h). The daemon needs
// a sites domain (corral daemon --sites-domain); the URL is bound to the
// caller's account and token and works only while both may visit the site.
func (c *Client) SiteURL(ctx context.Context, projectID int64, name, path string, ttl time.Duration) (string, error) {
	var out struct {
		URL string `json:"url"`
	}
	req := map[string]any{"path": path, "expiresInSeconds": int(ttl / time.Second)}
	err := c.Do(ctx, http.MethodPost, "/v1/projects/"+strconv.FormatInt(projectID, 10)+"/sites/"+url.PathEscape(name)+"/url", req, &out)
	return out.URL, err
}
