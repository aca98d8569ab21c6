package client

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/corral-sandbox/corral/api"
)

// seen is one request a fake daemon received.
type seen struct {
	method, path, query, auth, contentType string
	body                                   map[string]any
}

// fakeDaemon answers every request with status and body, recording it.
func fakeDaemon(t *testing.T, status int, body string, header http.Header) (*Client, *seen) {
	t.Helper()
	got := &seen{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		*got = seen{method: r.Method, path: r.URL.EscapedPath(), query: r.URL.RawQuery, auth: r.Header.Get("Authorization"), contentType: r.Header.Get("Content-Type")}
		if b, _ := io.ReadAll(r.Body); len(b) > 0 {
			if err := json.Unmarshal(b, &got.body); err != nil {
				t.Errorf("%s %s: body %q is not a JSON object", r.Method, r.URL, b)
			}
		}
		for k, v := range header {
			w.Header()[k] = v
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		io.WriteString(w, body)
	}))
	t.Cleanup(srv.Close)
	c, err := New(srv.URL, "tok")
	if err != nil {
		t.Fatal(err)
	}
	return c, got
}

var created = time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)

// TestMethods calls every method against a fake daemon: the request it
// sends (method, escaped path, query, body, token) and the answer it
// decodes.
func TestMethods(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name        string
		status      int
		answer      string
		call        func(c *Client) (any, error)
		method      string
		path, query string
		body        map[string]any
		want        any
	}{
		{"Health", 200, `{"status":"ok","sandbox":"ok","worker":"connected"}`,
			func(c *Client) (any, error) { return c.Health(ctx) },
			"GET", "/healthz", "", nil, &Health{Status: "ok", Sandbox: "ok", Worker: "connected"}},
		{"Whoami", 200, `{"id":1,"name":"alice","created":"2026-12-01T10:00:00Z"}`,
			func(c *Client) (any, error) { return c.Whoami(ctx) },
			"GET", "/v1/whoami", "", nil, &Account{ID: 1, Name: "alice", Created: created}},
		{"CreateAccount", 201, `{"id":2,"name":"bob","created":"2026-12-01T10:00:00Z"}`,
			func(c *Client) (any, error) { return c.CreateAccount(ctx, "bob") },
			"POST", "/v1/accounts", "", map[string]any{"name": "bob"}, &Account{ID: 2, Name: "bob", Created: created}},
		{"CreateToken", 201, `{"id":3,"accountId":2,"name":"ci","token":"corral_x"}`,
			func(c *Client) (any, error) { return c.CreateToken(ctx, "b/ob", "ci") },
			"POST", "/v1/accounts/b%2Fob/tokens", "", map[string]any{"name": "ci"}, &Token{ID: 3, AccountID: 2, Name: "ci", Token: "corral_x"}},
		{"Projects", 200, `[{"id":4,"name":"box","kind":"managed","created":"2026-12-01T10:00:00Z","role":"owner","machine":{"image":"base","limits":{}}}]`,
			func(c *Client) (any, error) { return c.Projects(ctx) },
			"GET", "/v1/projects", "", nil, []Project{{ID: 4, Name: "box", Kind: "managed", Created: created, Role: "owner", Machine: &Machine{Image: "base"}}}},
		{"CreateProject", 201, `{"id":4,"name":"box","kind":"managed","created":"2026-12-01T10:00:00Z","role":"owner"}`,
			func(c *Client) (any, error) {
				return c.CreateProject(ctx, ProjectRequest{Name: "box", Git: "https://example.com/r.git", ExportRemotes: []string{"github.com/o/*"}})
			},
			"POST", "/v1/projects", "", map[string]any{"name": "box", "git": "https://example.com/r.git", "exportRemotes": []any{"github.com/o/*"}},
			&Project{ID: 4, Name: "box", Kind: "managed", Created: created, Role: "owner"}},
		{"Project", 200, `{"id":5,"name":"web","kind":"host","root":"/srv/web","created":"2026-12-01T10:00:00Z","role":"member"}`,
			func(c *Client) (any, error) { return c.Project(ctx, 5) },
			"GET", "/v1/projects/5", "", nil, &Project{ID: 5, Name: "web", Kind: "host", Root: "/srv/web", Created: created, Role: "member"}},
		{"DeleteProject", 204, ``,
			func(c *Client) (any, error) { return nil, c.DeleteProject(ctx, 5) },
			"DELETE", "/v1/projects/5", "", nil, nil},
		{"SetMachine", 200, `{"image":"debian","limits":{"memory":1024,"cpuMillis":1500}}`,
			func(c *Client) (any, error) {
				return c.SetMachine(ctx, 4, Machine{Image: "debian", Limits: Limits{Memory: 1024, CPUMillis: 1500}})
			},
			"PUT", "/v1/projects/4/machine", "", map[string]any{"image": "debian", "limits": map[string]any{"memory": 1024.0, "cpuMillis": 1500.0}},
			&Machine{Image: "debian", Limits: Limits{Memory: 1024, CPUMillis: 1500}}},
		{"ResetMachine", 204, ``,
			func(c *Client) (any, error) { return nil, c.ResetMachine(ctx, 4) },
			"POST", "/v1/projects/4/reset", "", nil, nil},
		{"Members", 200, `[{"accountId":1,"account":"alice","role":"owner","trusted":false,"created":"2026-12-01T10:00:00Z"}]`,
			func(c *Client) (any, error) { return c.Members(ctx, 4) },
			"GET", "/v1/projects/4/members", "", nil, []Member{{AccountID: 1, Account: "alice", Role: "owner", Created: created}}},
		{"AddMember", 201, `{"accountId":2,"account":"bob","role":"owner","trusted":false,"created":"2026-12-01T10:00:00Z"}`,
			func(c *Client) (any, error) { return nil, c.AddMember(ctx, 4, "bob", true) },
			"POST", "/v1/projects/4/members", "", map[string]any{"account": "bob", "role": "owner"}, nil},
		{"RunCommand", 200, `{"stdout":"hi\n","stderr":"","code":0,"signal":null}`,
			func(c *Client) (any, error) {
				return c.RunCommand(ctx, 4, CommandRequest{Command: api.Command{Type: "argv", File: "echo", Args: []string{"hi"}}, TimeoutMs: 500})
			},
			"POST", "/v1/projects/4/commands", "", map[string]any{"command": map[string]any{"type": "argv", "file": "echo", "args": []any{"hi"}}, "timeoutMs": 500.0, "outputLimit": map[string]any{}},
			&api.CommandResult{Stdout: "hi\n", Code: new(int)}},
		{"Sites", 200, `[{"name":"web","projectId":4,"port":8000,"publishedBy":1,"published":"2026-12-01T10:00:00Z"}]`,
			func(c *Client) (any, error) { return c.Sites(ctx, 4) },
			"GET", "/v1/projects/4/sites", "", nil, []Site{{Name: "web", ProjectID: 4, Port: 8000, PublishedBy: 1, Published: created}}},
		{"PublishSite", 200, `{"name":"web","projectId":4,"port":8000,"publishedBy":1,"published":"2026-12-01T10:00:00Z"}`,
			func(c *Client) (any, error) { return nil, c.PublishSite(ctx, 4, "web", 8000) },
			"PUT", "/v1/projects/4/sites/web", "", map[string]any{"port": 8000.0}, nil},
		{"UnpublishSite", 204, ``,
			func(c *Client) (any, error) { return nil, c.UnpublishSite(ctx, 4, "web") },
			"DELETE", "/v1/projects/4/sites/web", "", nil, nil},
		{"SiteURL", 200, `{"url":"https://web.d/?corral-site-token=T","expires":"2026-12-01T10:00:00Z"}`,
			func(c *Client) (any, error) { return c.SiteURL(ctx, 4, "web", "/a?b=1", time.Minute) },
			"POST", "/v1/projects/4/sites/web/url", "", map[string]any{"path": "/a?b=1", "expiresInSeconds": 60.0}, "https://web.d/?corral-site-token=T"},
		{"Export", 200, `{"pushed":true,"head":"abc","remote":"https://github.com/o/r"}`,
			func(c *Client) (any, error) {
				return c.Export(ctx, 4, ExportRequest{Remote: "https://github.com/o/r", Branch: "main", ExpectedHead: "abc"})
			},
			"POST", "/v1/projects/4/export", "", map[string]any{"remote": "https://github.com/o/r", "branch": "main", "expectedHead": "abc"},
			&ExportResult{Pushed: true, Head: "abc", Remote: "https://github.com/o/r"}},
		{"Git", 200, `{"isRepo":false}`,
			func(c *Client) (any, error) {
				var out map[string]any
				err := c.Git(ctx, 4, "show", url.Values{"rev": {"HEAD"}, "path": {"a b?.go"}}, &out)
				return out, err
			},
			"GET", "/v1/projects/4/git/show", "path=a+b%3F.go&rev=HEAD", nil, map[string]any{"isRepo": false}},
		{"Egress", 200, `{"mode":"none","allow":[],"deny":[]}`,
			func(c *Client) (any, error) { return c.Egress(ctx, 4) },
			"GET", "/v1/projects/4/egress", "", nil, &EgressPolicy{Mode: "none", Allow: []string{}, Deny: []string{}}},
		{"SetEgress", 200, `{"mode":"proxy","allow":["pypi.org"],"deny":[]}`,
			func(c *Client) (any, error) {
				return c.SetEgress(ctx, 4, EgressPolicy{Mode: "proxy", Allow: []string{"pypi.org"}})
			},
			"PUT", "/v1/projects/4/egress", "", map[string]any{"mode": "proxy", "allow": []any{"pypi.org"}, "deny": nil},
			&EgressPolicy{Mode: "proxy", Allow: []string{"pypi.org"}, Deny: []string{}}},
		{"EgressLog", 200, `[{"id":1,"account":1,"protocol":"http","name":"pypi.org","addr":"1.2.3.4","port":443,"verdict":"allowed","rule":"pypi.org","bytesIn":1,"bytesOut":2,"startedAt":"2026-12-01T10:00:00Z","durationMs":3}]`,
			func(c *Client) (any, error) { return c.EgressLog(ctx, 4, 10) },
			"GET", "/v1/projects/4/egress/log", "limit=10", nil,
			[]EgressLogEntry{{ID: 1, Account: 1, Protocol: "http", Name: "pypi.org", Addr: "1.2.3.4", Port: 443, Verdict: "allowed", Rule: "pypi.org", BytesIn: 1, BytesOut: 2, StartedAt: created, DurationMS: 3}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, got := fakeDaemon(t, tc.status, tc.answer, nil)
			v, err := tc.call(c)
			if err != nil {
				t.Fatal(err)
			}
			if got.method != tc.method || got.path != tc.path || got.query != tc.query || got.auth != "Bearer tok" {
				t.Errorf("sent %s %s?%s (auth %q), want %s %s?%s", got.method, got.path, got.query, got.auth, tc.method, tc.path, tc.query)
			}
			if !reflect.DeepEqual(got.body, tc.body) {
				t.Errorf("body %#v, want %#v", got.body, tc.body)
			}
			if tc.body != nil && got.contentType != "application/json" {
				t.Errorf("content type %q", got.contentType)
			}
			if tc.want != nil && !reflect.DeepEqual(v, tc.want) {
				t.Errorf("answer %#v, want %#v", v, tc.want)
			}
		})
	}
}

// TestTypedErrors checks that error answers decode into *Error values
// that errors.Is matches by status, with the pinned body's fields, the
// Retry-After of a 429, and a non-pinned body kept readable.
func TestTypedErrors(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		status   int
		body     string
		header   http.Header
		sentinel error
		kind     string
		retry    time.Duration
	}{
		{400, `{"error":{"kind":"prepare","message":"bad env","stdout":"","stderr":""}}`, nil, ErrInvalid, "prepare", 0},
		{401, `{"error":{"kind":"unauthorized","message":"a bearer token is required","stdout":"","stderr":""}}`, http.Header{"Www-Authenticate": {`Bearer realm="corral"`}}, ErrUnauthorized, "unauthorized", 0},
		{403, `{"error":{"kind":"forbidden","message":"project 9: no such project, or you are not a member of it","stdout":"","stderr":""}}`, nil, ErrForbidden, "forbidden", 0},
		{404, `{"error":{"kind":"notFound","message":"no such site","stdout":"","stderr":""}}`, nil, ErrNotFound, "notFound", 0},
		{409, `{"error":{"kind":"headMoved","message":"branch main is at b","stdout":"","stderr":""}}`, nil, ErrConflict, "headMoved", 0},
		{413, `{"error":{"kind":"requestTooLarge","message":"too big","stdout":"","stderr":""}}`, nil, ErrRequestTooLarge, "requestTooLarge", 0},
		{429, `{"error":{"kind":"prepare","message":"budget","stdout":"","stderr":""}}`, http.Header{"Retry-After": {"1"}}, ErrBusy, "prepare", time.Second},
		{503, `{"error":{"kind":"unavailable","message":"no privileged transport in this process","stdout":"","stderr":""}}`, nil, ErrUnavailable, "unavailable", 0},
		{502, "<html>bad gateway</html>", nil, nil, "http", 0},
	} {
		c, _ := fakeDaemon(t, tc.status, tc.body, tc.header)
		_, err := c.Project(ctx, 9)
		var e *Error
		if !errors.As(err, &e) || e.Status != tc.status || e.Kind != tc.kind || e.RetryAfter != tc.retry || e.Message == "" {
			t.Errorf("%d: err %v (%+v)", tc.status, err, e)
			continue
		}
		if tc.sentinel != nil && !errors.Is(err, tc.sentinel) {
			t.Errorf("%d: %v is not %v", tc.status, err, tc.sentinel)
		}
		for _, other := range []error{ErrInvalid, ErrUnauthorized, ErrForbidden, ErrNotFound, ErrConflict, ErrRequestTooLarge, ErrBusy, ErrUnavailable} {
			if other != tc.sentinel && errors.Is(err, other) {
				t.Errorf("%d: %v matches %v too", tc.status, err, other)
			}
		}
		if !errors.Is(err, &Error{Kind: tc.kind}) || errors.Is(err, &Error{Kind: "other"}) {
			t.Errorf("%d: kind matching of %v", tc.status, err)
		}
	}
	// A command's error keeps its partial output.
	c, _ := fakeDaemon(t, 504, `{"error":{"kind":"timeout","message":"timed out","stdout":"part","stderr":"e"}}`, nil)
	_, err := c.RunCommand(ctx, 1, CommandRequest{Command: api.Command{Type: "argv", File: "sleep"}})
	var e *Error
	if !errors.As(err, &e) || e.Kind != "timeout" || e.Stdout != "part" || e.Stderr != "e" || !strings.Contains(e.Error(), "504 timeout") {
		t.Fatalf("%v", err)
	}
}
