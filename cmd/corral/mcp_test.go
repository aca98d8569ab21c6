package main

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/corral-sandbox/corral/daemon"
	"github.com/corral-sandbox/corral/internal/testworker"
	"github.com/corral-sandbox/corral/projects"
	"github.com/corral-sandbox/corral/worker"
)

// mcpEnv is a real daemon over a real worker (both in this test process)
// with two accounts.
type mcpEnv struct {
	state, sock    string
	alice, mallory string // tokens (ids 1 and 2)
}

func newMCPEnv(t *testing.T) *mcpEnv {
	t.Helper()
	state, err := os.MkdirTemp("", "cm")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(state) })
	if err := os.MkdirAll(projects.WorkspacesDir(state), 0o711); err != nil {
		t.Fatal(err)
	}
	// Started first, so that it stops after the daemon.
	tw := testworker.Start(t, testworker.Options{ProjectsRoot: projects.WorkspacesDir(state), Limits: worker.Limits{Memory: 256 << 20, Pids: 128}})
	e := &mcpEnv{state: state}
	for _, name := range []string{"alice", "mallory"} {
		mustCLI(t, "account", "create", name, "--state", state)
	}
	e.alice = mustCLI(t, "token", "create", "alice", "--state", state)
	e.mallory = mustCLI(t, "token", "create", "mallory", "--state", state)
	e.sock = startDaemonConfig(t, daemon.Config{StateDir: state, WorkerSocket: tw.Socket})
	return e
}

// stdio runs `corral mcp` (this test binary as corral) as token's account
// and connects the SDK's client to it over stdio.
func (e *mcpEnv) stdio(t *testing.T, token string, projectID int64) *mcp.ClientSession {
	t.Helper()
	args := []string{"mcp", "--daemon", e.sock}
	if projectID != 0 {
		args = append(args, "--project-id", strconv.FormatInt(projectID, 10))
	}
	cmd := exec.Command(os.Args[0], args...)
	cmd.Env = append(os.Environ(), "CORRAL_TEST_AS_MAIN=1", "CORRAL_TOKEN="+token)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	s, err := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "1"}, nil).Connect(context.Background(), &mcp.CommandTransport{Command: cmd}, nil)
	if err != nil {
		t.Fatalf("corral mcp: %v\n%s", err, stderr.String())
	}
	t.Cleanup(func() {
		s.Close()
		if t.Failed() {
			t.Logf("corral mcp's stderr:\n%s", stderr.String())
		}
	})
	return s
}

// bearer adds a bearer token to every request.
type bearer struct {
	token string
	next  http.RoundTripper
}

func (b bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+b.token)
	return b.next.RoundTrip(r)
}

// http connects the SDK's client to the daemon's /v1/mcp as token's
// account, over streamable HTTP.
func (e *mcpEnv) http(t *testing.T, token string) *mcp.ClientSession {
	t.Helper()
	tr := &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", e.sock)
	}}
	t.Cleanup(tr.CloseIdleConnections)
	s, err := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "1"}, nil).Connect(context.Background(), &mcp.StreamableClientTransport{
		Endpoint:   "http://corral/v1/mcp",
		HTTPClient: &http.Client{Transport: bearer{token, tr}},
		MaxRetries: -1,
	}, nil)
	if err != nil {
		t.Fatalf("connect to /v1/mcp: %v", err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// call calls a tool; a protocol error fails t (a tenant's mistake must be
// a tool error).
func call(t *testing.T, s *mcp.ClientSession, name string, args map[string]any) *mcp.CallToolResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	res, err := s.CallTool(ctx, &mcp.CallToolParams{Name: name, Arguments: args})
	if err != nil {
		t.Fatalf("%s %v: protocol error: %v", name, args, err)
	}
	return res
}

// resultText is the text of a result's content.
func resultText(res *mcp.CallToolResult) string {
	var b strings.Builder
	for _, c := range res.Content {
		if tc, ok := c.(*mcp.TextContent); ok {
			b.WriteString(tc.Text)
		}
	}
	return b.String()
}

// ok calls a tool that must succeed and decodes its structured result.
func ok(t *testing.T, s *mcp.ClientSession, name string, args map[string]any, out any) {
	t.Helper()
	res := call(t, s, name, args)
	if res.IsError {
		t.Fatalf("%s %v: tool error: %s", name, args, resultText(res))
	}
	b, err := json.Marshal(res.StructuredContent)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, out); err != nil {
		t.Fatalf("%s: %v: %s", name, err, b)
	}
}

// toolError calls a tool that must fail with a tool error containing want.
func toolError(t *testing.T, s *mcp.ClientSession, name string, args map[string]any, want string) {
	t.Helper()
	res := call(t, s, name, args)
	if txt := resultText(res); !res.IsError || !strings.Contains(txt, want) {
		t.Errorf("%s %v: IsError %v, %q; want a tool error with %q", name, args, res.IsError, txt, want)
	}
}

// with returns args with more keys.
func with(args map[string]any, more map[string]any) map[string]any {
	out := map[string]any{}
	for k, v := range args {
		out[k] = v
	}
	for k, v := range more {
		out[k] = v
	}
	return out
}

type mcpProject struct {
	ID   int64  `json:"id"`
	Name string `json:"name"`
}

// project creates a project with create_project.
func project(t *testing.T, s *mcp.ClientSession, name string) mcpProject {
	t.Helper()
	var p mcpProject
	ok(t, s, "create_project", map[string]any{"name": name}, &p)
	return p
}

type mcpProcess struct {
	ID    string `json:"id"`
	State string `json:"state"`
	Exit  *struct {
		Code   *int    `json:"code"`
		Signal *string `json:"signal"`
	} `json:"exit"`
}

// TestMCPCannotReachAnotherAccount: a second account's token reaches the
// first account's project through no tool, over stdio (with the project
// as its default, too) and over the daemon's /v1/mcp, and what it tried
// changed nothing there.
func TestMCPCannotReachAnotherAccount(t *testing.T) {
	e := newMCPEnv(t)
	alice := e.http(t, e.alice)
	p := project(t, alice, "private")
	own := map[string]any{"project_id": p.ID}
	var fi map[string]any
	ok(t, alice, "write_file", with(own, map[string]any{"path": "secret", "content": "alice's"}), &fi)
	var proc mcpProcess
	ok(t, alice, "start_process", with(own, map[string]any{"command": "echo started; sleep 300"}), &proc)

	cases := map[string]map[string]any{
		"run_command":         {"command": "cat secret"},
		"start_process":       {"command": "cat secret"},
		"list_processes":      {},
		"read_process_output": {"process_id": proc.ID},
		"signal_process":      {"process_id": proc.ID, "signal": "KILL"},
		"kill_process":        {"process_id": proc.ID},
		"read_file":           {"path": "secret"},
		"write_file":          {"path": "secret", "content": "mallory's"},
		"list_files":          {},
		"stat_file":           {"path": "secret"},
	}
	faces := []struct {
		name    string
		s       *mcp.ClientSession
		project map[string]any
	}{
		{"http", e.http(t, e.mallory), own},
		{"stdio", e.stdio(t, e.mallory, 0), own},
		{"stdio default project", e.stdio(t, e.mallory, p.ID), map[string]any{}},
	}
	for _, f := range faces {
		t.Run(f.name, func(t *testing.T) {
			tools, err := f.s.ListTools(context.Background(), nil)
			if err != nil {
				t.Fatal(err)
			}
			var walked int
			for _, tool := range tools.Tools {
				schema, _ := json.Marshal(tool.InputSchema)
				if !strings.Contains(string(schema), `"project_id"`) {
					continue
				}
				args, found := cases[tool.Name]
				if !found {
					t.Errorf("tool %s takes a project and has no case here", tool.Name)
					continue
				}
				walked++
				toolError(t, f.s, tool.Name, with(f.project, args), "not a member")
			}
			if walked != len(cases) {
				t.Errorf("walked %d project tools, have %d cases", walked, len(cases))
			}
			var l struct{ Projects []mcpProject }
			ok(t, f.s, "list_projects", nil, &l)
			if len(l.Projects) != 0 {
				t.Errorf("mallory lists %v", l.Projects)
			}
		})
	}

	var page struct {
		Output string
		State  string
	}
	ok(t, alice, "read_process_output", with(own, map[string]any{"process_id": proc.ID}), &page)
	if page.State != "running" || page.Output != "started\n" {
		t.Errorf("alice's process after the attack: %+v", page)
	}
	var content struct{ Content string }
	ok(t, alice, "read_file", with(own, map[string]any{"path": "secret"}), &content)
	if content.Content != "alice's" {
		t.Errorf("alice's file after the attack: %q", content.Content)
	}
	ok(t, alice, "kill_process", with(own, map[string]any{"process_id": proc.ID}), &proc)

	// /v1/mcp itself needs a valid token.
	for _, tok := range []string{"", "not-a-token"} {
		req, _ := http.NewRequest("POST", "http://corral/v1/mcp", strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"tools/list"}`))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		if tok != "" {
			req.Header.Set("Authorization", "Bearer "+tok)
		}
		resp, err := unixClient(e.sock).Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusUnauthorized {
			t.Errorf("/v1/mcp with token %q: %d", tok, resp.StatusCode)
		}
	}
}

// TestMCPRevokedToken: revoking the token ends the tool calls in flight
// (a command) on both faces within the session checker's second, and every
// later call fails.
func TestMCPRevokedToken(t *testing.T) {
	e := newMCPEnv(t)
	hs := e.http(t, e.alice)
	p := project(t, hs, "revoked")
	faces := map[string]*mcp.ClientSession{"http": hs, "stdio": e.stdio(t, e.alice, p.ID)}
	type ended struct {
		face string
		res  *mcp.CallToolResult
		err  error
		took time.Duration
	}
	done := make(chan ended, len(faces))
	for face, s := range faces {
		go func() {
			start := time.Now()
			res, err := s.CallTool(context.Background(), &mcp.CallToolParams{Name: "run_command", Arguments: map[string]any{
				"project_id": p.ID, "command": "touch " + face + "; exec sleep 120", "timeout_seconds": 300}})
			done <- ended{face, res, err, time.Since(start)}
		}()
	}
	// Both commands run once they made their files.
	for face := range faces {
		for deadline := time.Now().Add(time.Minute); call(t, hs, "stat_file", map[string]any{"project_id": p.ID, "path": face}).IsError; {
			if time.Now().After(deadline) {
				t.Fatalf("the command via %s did not start", face)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	revoked := time.Now()
	mustCLI(t, "token", "revoke", "1", "--state", e.state)
	for range faces {
		d := <-done
		if d.err != nil || !d.res.IsError || !strings.Contains(resultText(d.res), "token revoked") {
			t.Errorf("%s: the command after the revocation: %v %v", d.face, d.err, d.res)
			continue
		}
		t.Logf("%s: the command ended %v after the revocation (it ran %v)", d.face, time.Since(revoked).Round(time.Millisecond), d.took.Round(time.Millisecond))
	}
	// Later calls: the daemon refuses /v1/mcp; corral mcp's tools answer
	// the API's 401.
	if _, err := hs.CallTool(context.Background(), &mcp.CallToolParams{Name: "list_projects"}); err == nil || !strings.Contains(err.Error(), "Unauthorized") {
		t.Errorf("http after the revocation: %v", err)
	}
	toolError(t, faces["stdio"], "list_projects", nil, "401")
}

// TestMCPTools drives every tool through both faces: `corral mcp` over
// stdio (with a default project) and the daemon's /v1/mcp (naming it).
func TestMCPTools(t *testing.T) {
	e := newMCPEnv(t)
	hs := e.http(t, e.alice)
	p, q := project(t, hs, "viastdio"), project(t, hs, "viahttp")
	t.Run("stdio", func(t *testing.T) { exerciseTools(t, e.stdio(t, e.alice, p.ID), map[string]any{}) })
	t.Run("http", func(t *testing.T) { exerciseTools(t, hs, map[string]any{"project_id": q.ID}) })
}

func exerciseTools(t *testing.T, s *mcp.ClientSession, project map[string]any) {
	const dir = "d"
	// Commands: a nonzero exit is a result; long output is cut with a
	// marker; a timeout is a tool error with the output so far.
	var run struct {
		Code      *int
		Signal    string
		Error     string
		Stdout    string
		Stderr    string
		Truncated bool
	}
	ok(t, s, "run_command", with(project, map[string]any{"command": "echo out; echo err >&2; exit 3"}), &run)
	if run.Code == nil || *run.Code != 3 || run.Stdout != "out\n" || run.Stderr != "err\n" || run.Truncated {
		t.Errorf("run_command: %+v", run)
	}
	ok(t, s, "run_command", with(project, map[string]any{"argv": []string{"sh", "-c", "head -c 100000 /dev/zero | tr '\\0' a; echo; echo end"}}), &run)
	if !run.Truncated || !strings.HasPrefix(run.Stdout, "aaaa") || !strings.HasSuffix(run.Stdout, "a\nend\n") ||
		!strings.Contains(run.Stdout, "[corral: ") || !strings.Contains(run.Stdout, "read_file") || len(run.Stdout) > 33<<10 {
		t.Errorf("long output: truncated %v, %d bytes, %.100q…%q", run.Truncated, len(run.Stdout), run.Stdout, run.Stdout[max(0, len(run.Stdout)-300):])
	}
	res := call(t, s, "run_command", with(project, map[string]any{"command": "echo begun; exec sleep 30", "timeout_seconds": 1}))
	if txt := resultText(res); !res.IsError || !strings.Contains(txt, `"error":"timeout`) || !strings.Contains(txt, `"stdout":"begun\n"`) {
		t.Errorf("timeout: IsError %v %s", res.IsError, txt)
	}

	// Files: text, bytes, pages that never split a character, missing
	// parents made.
	var fi struct {
		Type string
		Size int64
	}
	text := strings.Repeat("é, ", 40) + "end"
	ok(t, s, "write_file", with(project, map[string]any{"path": dir + "/a/b.txt", "content": text}), &fi)
	if fi.Type != "file" || fi.Size != int64(len(text)) {
		t.Errorf("write_file: %+v", fi)
	}
	var pg struct {
		Content    string
		Encoding   string
		NextOffset int64 `json:"next_offset"`
		More       bool
		Note       string
	}
	var got string
	for off, n := int64(0), 0; ; n++ {
		ok(t, s, "read_file", with(project, map[string]any{"path": dir + "/a/b.txt", "offset": off, "max_bytes": 7}), &pg)
		if pg.Encoding != "utf-8" || (pg.More && !strings.Contains(pg.Note, "offset "+strconv.FormatInt(pg.NextOffset, 10))) || n > len(text) {
			t.Fatalf("page at %d: %+v", off, pg)
		}
		got += pg.Content
		off = pg.NextOffset
		if !pg.More {
			break
		}
	}
	if got != text {
		t.Errorf("pages: %q, want %q", got, text)
	}
	all := make([]byte, 256)
	for i := range all {
		all[i] = byte(i)
	}
	ok(t, s, "write_file", with(project, map[string]any{"path": dir + "/bytes", "content": base64.StdEncoding.EncodeToString(all), "encoding": "base64", "mode": "0600"}), &fi)
	ok(t, s, "read_file", with(project, map[string]any{"path": dir + "/bytes"}), &pg)
	if pg.Encoding != "base64" || pg.Content != base64.StdEncoding.EncodeToString(all) || pg.More {
		t.Errorf("bytes: %+v", pg)
	}
	var st struct{ Type, Mode string }
	ok(t, s, "stat_file", with(project, map[string]any{"path": "/workspace/" + dir + "/bytes"}), &st)
	if st.Type != "file" || st.Mode != "0600" {
		t.Errorf("stat_file: %+v", st)
	}
	var ls struct {
		Entries []struct{ Name, Type string }
	}
	ok(t, s, "list_files", with(project, map[string]any{"path": dir}), &ls)
	if len(ls.Entries) != 2 {
		t.Errorf("list_files: %+v", ls.Entries)
	}

	// Background processes: output by offset, waiting for the end, a
	// signal, a kill.
	var proc mcpProcess
	ok(t, s, "start_process", with(project, map[string]any{"command": "echo one; echo two; echo three"}), &proc)
	var out struct {
		Output     string
		NextOffset int64 `json:"next_offset"`
		More       bool
		State      string
		Exit       *struct{ Code *int }
	}
	ok(t, s, "read_process_output", with(project, map[string]any{"process_id": proc.ID, "wait_seconds": 30}), &out)
	if out.Output != "one\ntwo\nthree\n" || out.State != "exited" || out.Exit == nil || out.Exit.Code == nil || *out.Exit.Code != 0 || out.More {
		t.Errorf("read_process_output to the end: %+v", out)
	}
	ok(t, s, "read_process_output", with(project, map[string]any{"process_id": proc.ID, "offset": 4, "max_bytes": 4}), &out)
	if out.Output != "two\n" || out.NextOffset != 8 || !out.More {
		t.Errorf("read_process_output from 4: %+v", out)
	}
	ok(t, s, "start_process", with(project, map[string]any{"argv": []string{"sleep", "300"}}), &proc)
	ok(t, s, "signal_process", with(project, map[string]any{"process_id": proc.ID, "signal": "TERM"}), &proc)
	ok(t, s, "read_process_output", with(project, map[string]any{"process_id": proc.ID, "wait_seconds": 30}), &out)
	if out.State == "running" {
		t.Errorf("after TERM: %+v", out)
	}
	var l struct{ Processes []mcpProcess }
	ok(t, s, "list_processes", project, &l)
	if len(l.Processes) != 2 {
		t.Errorf("list_processes: %+v", l)
	}
	ok(t, s, "kill_process", with(project, map[string]any{"process_id": proc.ID}), &proc)
	toolError(t, s, "read_process_output", with(project, map[string]any{"process_id": proc.ID}), "404")
}

// TestMCPBadInput: a tenant's mistakes are tool errors that say what to
// change, never protocol errors, on both faces.
func TestMCPBadInput(t *testing.T) {
	e := newMCPEnv(t)
	hs := e.http(t, e.alice)
	pa := map[string]any{"project_id": project(t, hs, "bad").ID}
	cases := []struct {
		tool string
		args map[string]any
		want string
	}{
		{"run_command", pa, "give command"},
		{"run_command", with(pa, map[string]any{"command": "true", "argv": []string{"true"}}), "not both"},
		{"run_command", with(pa, map[string]any{"command": "true", "timeout_seconds": 100000}), "timeout_seconds"},
		{"run_command", with(pa, map[string]any{"command": 5}), "command"},
		{"run_command", with(pa, map[string]any{"command": "true", "shell": "bash"}), "shell"},
		{"run_command", map[string]any{"project_id": -1, "command": "true"}, "not a project id"},
		{"run_command", with(pa, map[string]any{"command": "true", "cwd": "/nonexistent"}), "nonexistent"},
		{"read_file", with(pa, map[string]any{"path": "x", "offset": -1}), "negative"},
		{"read_file", with(pa, map[string]any{"path": "missing"}), "404"},
		{"read_file", with(pa, map[string]any{"path": "x", "max_bytes": 1 << 30}), "max_bytes"},
		{"write_file", with(pa, map[string]any{"path": "x", "content": "!!", "encoding": "base64"}), "base64"},
		{"write_file", with(pa, map[string]any{"path": "x", "content": "", "mode": "999"}), "mode"},
		{"write_file", with(pa, map[string]any{"path": "/proc/x", "content": ""}), ""},
		{"read_process_output", with(pa, map[string]any{"process_id": "proc_nope"}), "404"},
		{"read_process_output", pa, "process_id"},
		{"signal_process", with(pa, map[string]any{"process_id": "proc_nope"}), "signal"},
		{"list_files", with(pa, map[string]any{"limit": 100000}), "limit"},
		{"create_project", map[string]any{"name": ""}, "name"},
		{"create_project", map[string]any{"name": "../x"}, "400"},
		{"no_such_tool", nil, ""},
	}
	for face, s := range map[string]*mcp.ClientSession{"http": hs, "stdio": e.stdio(t, e.alice, 0)} {
		t.Run(face, func(t *testing.T) {
			for _, c := range cases {
				if c.tool == "no_such_tool" {
					// An unknown tool is the client's error, reported as
					// such (a protocol error) without ending the session.
					if _, err := s.CallTool(context.Background(), &mcp.CallToolParams{Name: c.tool}); err == nil {
						t.Errorf("unknown tool: no error")
					}
					continue
				}
				toolError(t, s, c.tool, c.args, c.want)
			}
			// No default project: project tools say so.
			toolError(t, s, "list_processes", nil, "project_id is required")
		})
	}
}
