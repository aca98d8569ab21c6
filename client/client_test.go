package client

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"

	"github.com/corral-sandbox/corral/api"
)

func TestURL(t *testing.T) {
	for _, tc := range []struct{ base, path, want string }{
		{"http://h:1", "/v1/projects", "http://h:1/v1/projects"},
		{"http://h:1/", "/v1/projects", "http://h:1/v1/projects"},
		{"http://h:1/api/", "/v1/projects/3/sessions?argv=sh&argv=-c&tty=1", "http://h:1/api/v1/projects/3/sessions?argv=sh&argv=-c&tty=1"},
		{"http://h:1", "/v1/x?", "http://h:1/v1/x?"},
		{"http://h:1", "/v1/projects/3/sites/" + url.PathEscape("a/b c"), "http://h:1/v1/projects/3/sites/a%2Fb%20c"},
		{"http://h:1", "/v1/files?path=" + url.QueryEscape("/a b?c"), "http://h:1/v1/files?path=%2Fa+b%3Fc"},
		{"/run/corral.sock", "/v1/projects?x=1", "http://corral/v1/projects?x=1"},
		// A '?' escaped in a path segment stays in the path; the first bare
		// '?' starts the query, later ones belong to it.
		{"http://h:1", "/v1/projects/3/sites/" + url.PathEscape("a?b") + "/url", "http://h:1/v1/projects/3/sites/a%3Fb/url"},
		{"http://h:1", "/v1/x?a=b?c", "http://h:1/v1/x?a=b?c"},
		{"https://h/base%2Fx/", "/v1/y?z", "https://h/base%2Fx/v1/y?z"},
		{"unix:/run/corral.sock", "/v1/projects/1/git/show?path=a%20b%3F", "http://corral/v1/projects/1/git/show?path=a%20b%3F"},
	} {
		c, err := New(tc.base, "")
		if err != nil {
			t.Fatal(err)
		}
		if got := c.URL(tc.path); got != tc.want {
			t.Errorf("New(%q).URL(%q) = %q, want %q", tc.base, tc.path, got, tc.want)
		}
	}
}

// TestURLReachesServer checks that a query reaches the server as a query.
func TestURLReachesServer(t *testing.T) {
	var got *url.URL
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got = r.URL
		w.Write([]byte("{}"))
	}))
	defer srv.Close()
	c, _ := New(srv.URL, "")
	if err := c.Do(context.Background(), "GET", "/v1/projects/1/sites/"+url.PathEscape("x/y")+"?tty=1&rows=24", nil, nil); err != nil {
		t.Fatal(err)
	}
	if got.EscapedPath() != "/v1/projects/1/sites/x%2Fy" || got.Query().Get("tty") != "1" || got.Query().Get("rows") != "24" {
		t.Fatalf("server saw %s", got)
	}
}

// TestStreamedCommand reads a streamed answer: chunks in order, then the
// result, or an error line.
func TestStreamedCommand(t *testing.T) {
	answer := ""
	var req map[string]any
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Accept") != "application/x-ndjson, application/json" {
			http.Error(w, "not streamed", 400)
			return
		}
		b, _ := io.ReadAll(r.Body)
		req = nil
		_ = json.Unmarshal(b, &req)
		w.Header().Set("Content-Type", "application/x-ndjson")
		io.WriteString(w, answer)
	}))
	defer srv.Close()
	c, _ := New(srv.URL, "")
	var out, errs []string
	cr := CommandRequest{
		Command: api.Command{Type: "argv", File: "x"},
		Stdin:   []byte("\xffin"),
		Env:     map[string]string{"A": "b"},
	}
	onStdout := func(p []byte) { out = append(out, string(p)) }
	onStderr := func(p []byte) { errs = append(errs, string(p)) }
	answer = `{"stdout":"a"}` + "\n" + `{"stderr":"e"}` + "\n" + `{"stdout":"b"}` + "\n" + `{"stdout":"ab","stderr":"e","code":3,"signal":null}` + "\n"
	res, err := c.StreamCommand(context.Background(), 1, cr, onStdout, onStderr)
	if err != nil || *res.Code != 3 || res.Stdout != "ab" || strings.Join(out, "|") != "a|b" || strings.Join(errs, "|") != "e" {
		t.Fatalf("res %+v err %v out %q errs %q", res, err, out, errs)
	}
	if req["stdin"] != "/2lu" || req["env"].(map[string]any)["A"] != "b" {
		t.Fatalf("request %v", req)
	}

	out = nil
	cr.Encoding = EncodingBase64
	answer = `{"stdout":"//4="}` + "\n" + `{"error":{"kind":"timeout","message":"m","stdout":"//4=","stderr":""}}` + "\n"
	_, err = c.StreamCommand(context.Background(), 1, cr, onStdout, onStderr)
	var ae *Error
	if !errors.As(err, &ae) || ae.Status != 200 || ae.Kind != "timeout" || ae.Stdout != "\xff\xfe" || len(out) != 1 || out[0] != "\xff\xfe" {
		t.Fatalf("err %v (%+v) out %q", err, ae, out)
	}

	answer = `{"stdout":"YQ=="}` + "\n"
	if _, err = c.StreamCommand(context.Background(), 1, cr, onStdout, onStderr); err == nil || !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Fatalf("truncated answer: %v", err)
	}
}
