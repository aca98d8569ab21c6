package daemon

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/pb33f/libopenapi"
	validator "github.com/pb33f/libopenapi-validator"
	"github.com/pb33f/libopenapi-validator/config"
	liberrors "github.com/pb33f/libopenapi-validator/errors"

	"github.com/corral-sandbox/corral/api"
	"github.com/corral-sandbox/corral/client"
	"github.com/corral-sandbox/corral/docs"
	"github.com/corral-sandbox/corral/export"
	"github.com/corral-sandbox/corral/image/imagetest"
	"github.com/corral-sandbox/corral/internal/testenv"
	"github.com/corral-sandbox/corral/store"
)

// specOp is an operation of docs/openapi.json.
type specOp struct {
	id, method, path string
	re               *regexp.Regexp
	statuses         []string
}

// specOps reads the document's operations (with a regexp matching each
// one's request paths).
func specOps(t *testing.T) []specOp {
	t.Helper()
	var doc struct {
		Paths map[string]map[string]json.RawMessage `json:"paths"`
	}
	if err := json.Unmarshal(docs.OpenAPI, &doc); err != nil {
		t.Fatal(err)
	}
	var ops []specOp
	param := regexp.MustCompile(`\\\{[A-Za-z]+\\\}`)
	for path, item := range doc.Paths {
		re := "^" + param.ReplaceAllString(regexp.QuoteMeta(path), `[^/]+`) + "$"
		if strings.HasSuffix(path, "/{path}") {
			// The Sites gateway's rest of the path may hold slashes.
			re = "^" + param.ReplaceAllString(regexp.QuoteMeta(strings.TrimSuffix(path, "/{path}")), `[^/]+`) + "/.*$"
		}
		for method, raw := range item {
			if !slices.Contains(anyMethod, method) {
				continue
			}
			var op struct {
				ID        string                     `json:"operationId"`
				Responses map[string]json.RawMessage `json:"responses"`
			}
			if err := json.Unmarshal(raw, &op); err != nil {
				t.Fatalf("%s %s: %v", method, path, err)
			}
			o := specOp{id: op.ID, method: strings.ToUpper(method), path: path, re: regexp.MustCompile(re)}
			for s := range op.Responses {
				o.statuses = append(o.statuses, s)
			}
			ops = append(ops, o)
		}
	}
	sort.Slice(ops, func(i, j int) bool { return ops[i].path+ops[i].method < ops[j].path+ops[j].method })
	return ops
}

// TestOpenAPIOperationIDs: every operation has an operationId, and no two
// share one.
func TestOpenAPIOperationIDs(t *testing.T) {
	seen := map[string]string{}
	for _, op := range specOps(t) {
		if op.id == "" {
			t.Errorf("%s %s has no operationId", op.method, op.path)
			continue
		}
		if prev, ok := seen[op.id]; ok {
			t.Errorf("operationId %s names %s and %s %s", op.id, prev, op.method, op.path)
		}
		seen[op.id] = op.method + " " + op.path
	}
}

// specValidator loads docs/openapi.json with a real OpenAPI validator
// (pb33f/libopenapi-validator) and fails t unless the document is valid
// against the OpenAPI 3.1 schema.
func specValidator(t *testing.T) (validator.Validator, libopenapi.Document) {
	t.Helper()
	doc, err := libopenapi.NewDocument(docs.OpenAPI)
	if err != nil {
		t.Fatalf("openapi.json: %v", err)
	}
	// Security is checked by TestOpenAPIMatchesRoutes (and anonymous
	// requests are cases of their own here).
	v, errs := validator.NewValidator(doc, config.WithoutSecurityValidation())
	if len(errs) > 0 {
		t.Fatalf("openapi.json: %v", errs)
	}
	if ok, verrs := v.ValidateDocument(); !ok {
		t.Fatalf("openapi.json is not a valid OpenAPI document:\n%s", validationErrors(verrs))
	}
	return v, doc
}

func validationErrors(errs []*liberrors.ValidationError) string {
	var b strings.Builder
	for _, e := range errs {
		fmt.Fprintf(&b, "  %s: %.300s\n", e.Message, e.Reason)
		for _, s := range e.SchemaValidationErrors {
			fmt.Fprintf(&b, "    %s (%s): %.300s\n", s.FieldPath, s.KeywordLocation, s.Reason)
		}
	}
	return b.String()
}

// TestOpenAPIDocumentValid validates the document alone (no daemon).
func TestOpenAPIDocumentValid(t *testing.T) {
	specValidator(t)
}

// specFixture is the state the conformance cases run against.
type specFixture struct {
	e        *env
	tcp      string // the daemon's TCP address (a second listener)
	tokens   map[string]string
	vars     *strings.Replacer
	lspFound bool
	// proc is the id of the background process the startProcess case
	// started: the {proc} placeholder of the cases after it.
	proc string
	// registry is the host of the test's OCI registry.
	registry string
}

// specCase is one request of the conformance table. Its path may use the
// placeholders {host} (a host project owned by alice), {box} (a managed
// project owned by alice, bob a member, running the site "web"), {repo}
// (a managed Git repository of alice's), {none} (an id no project has),
// {remote} and {head} (the export remote and repo's head), {proc} (the
// background process the first startProcess case started).
type specCase struct {
	op     string // the operationId the request must match
	as     string // "alice", "bob" (member of box), "carol" (no project), "admin", "" (anonymous)
	method string
	path   string
	body   any               // JSON-encoded unless a string or []byte
	header map[string]string // more request headers
	status int
	// badRequest: the request itself breaks the document (the validator
	// must refuse it too), as a 400 case does.
	badRequest bool
	// lenient: the validator's verdict on the request is not asserted
	// (it does not check what the document says of it).
	lenient bool
	// ws dials a WebSocket (status 101 expected on success).
	ws bool
	// tcp sends the request over the TCP listener instead of the socket.
	tcp bool
	// check, if non-nil, checks the answer further.
	check func(t *testing.T, f *specFixture, resp *http.Response, body []byte)
}

// TestOpenAPIConformance starts one real daemon (real worker, real
// machines) and drives every operation of docs/openapi.json: a success
// and at least one documented error each. Each request and each response
// (status, content type, body) is validated against the document by
// libopenapi-validator; every operation with a documented success and a
// documented error must have a case of each.
func TestOpenAPIConformance(t *testing.T) {
	requireRoot(t)
	v, _ := specValidator(t)
	ops := specOps(t)
	f := newSpecFixture(t)

	cases := specCases(f)
	covered := map[string]map[bool]bool{} // op → success/error seen
	for i, c := range cases {
		name := fmt.Sprintf("%02d_%s_%d", i, c.op, c.status)
		ok := t.Run(name, func(t *testing.T) { f.run(t, v, ops, c) })
		if ok {
			if covered[c.op] == nil {
				covered[c.op] = map[bool]bool{}
			}
			covered[c.op][c.status < 400] = true
		}
	}
	for _, op := range ops {
		var success, failure bool
		for _, s := range op.statuses {
			switch {
			case s == "default" || s[0] == '1' || s[0] == '2' || s[0] == '3':
				success = true
			default:
				failure = true
			}
		}
		if success && !covered[op.id][true] {
			t.Errorf("operation %s (%s %s): no passing success case", op.id, op.method, op.path)
		}
		if reason, ok := errorCaseElsewhere[op.id]; ok && failure {
			t.Logf("operation %s: its error case is %s", op.id, reason)
			failure = false
		}
		if failure && !covered[op.id][false] {
			t.Errorf("operation %s (%s %s): no passing error case", op.id, op.method, op.path)
		}
	}
}

// mcpAccept is the Accept header MCP's streamable HTTP transport wants.
var mcpAccept = map[string]string{"Accept": "application/json, text/event-stream"}

// mcpCall is a JSON-RPC request calling an MCP tool without arguments.
func mcpCall(tool string) map[string]any {
	return map[string]any{"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": map[string]any{"name": tool, "arguments": map[string]any{}}}
}

// errorCaseElsewhere names the operations whose documented errors the
// shared daemon cannot produce, and the test that does.
var errorCaseElsewhere = map[string]string{
	// 503 needs a worker that cannot start machines, for a minute.
	"getHealth": "TestHealthzReportsMachineStartFailure",
}

// siteScript answers every method with 200 and the method and path: the
// site the gateway cases reach.
const siteScript = `
import http.server
class H(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def log_message(self, *a): pass
    def answer(self):
        n = int(self.headers.get("Content-Length") or 0)
        if n:
            self.rfile.read(n)
        b = ("%s %s" % (self.command, self.path)).encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(b)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(b)
    do_GET = do_HEAD = do_POST = do_PUT = do_PATCH = do_DELETE = do_OPTIONS = answer
http.server.ThreadingHTTPServer(("127.0.0.1", 8000), H).serve_forever()
`

func newSpecFixture(t *testing.T) *specFixture {
	t.Helper()
	remotes := t.TempDir()
	e := newManagedEnvWith(t, AppOptions{
		Admins:   []string{"admin"},
		MaxStdin: 1 << 10,
		Sites:    SitesOptions{Domain: sitesTestDomain, Scheme: "http"},
		Export:   export.Options{AllowInsecure: true, AllowedRemotes: []string{remotes + "/*"}},
	})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f := &specFixture{e: e, tcp: e.serveOn(ln), tokens: map[string]string{}}
	ctx := context.Background()
	accts := map[string]store.Account{}
	for _, n := range []string{"alice", "bob", "carol", "admin"} {
		accts[n], f.tokens[n] = e.account(n)
	}
	host := e.hostProject("web", accts["alice"])
	box := e.managedProject("box", accts["alice"])
	if _, err := e.st.AddMember(ctx, store.Member{Project: box.ID, Account: accts["bob"].ID, Role: store.RoleMember}); err != nil {
		t.Fatal(err)
	}
	repo := e.managedProject("repo", accts["alice"])
	runGit(t, repo.Root, "init", "-q", "-b", "main")
	head := commitFile(t, repo.Root, "README", "hello\n")
	remote := filepath.Join(remotes, "remote.git")
	runGit(t, "/", "init", "-q", "--bare", remote)
	if err := os.WriteFile(filepath.Join(box.Root, "site.py"), []byte(siteScript), 0o644); err != nil {
		t.Fatal(err)
	}

	// The site "web" of box: its server runs in a session opened with the
	// Go client, for the whole test.
	c := e.client(f.tokens["alice"])
	if err := c.PublishSite(ctx, box.ID, "web", 8000); err != nil {
		t.Fatal(err)
	}
	sctx, cancel := context.WithCancel(ctx)
	var siteErr bytes.Buffer
	sess, err := c.OpenSession(sctx, box.ID, client.SessionRequest{Argv: []string{"python3", "site.py"}, Stderr: &siteErr})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cancel(); sess.Close() })
	testenv.WaitFor(t, 5*time.Second, "the site to answer", func() bool {
		st, _ := e.do(ctx, "GET", "/sites/web/", f.tokens["alice"], nil)
		return st == 200
	})

	f.vars = strings.NewReplacer(
		"{host}", strconv.FormatInt(host.ID, 10),
		"{box}", strconv.FormatInt(box.ID, 10),
		"{repo}", strconv.FormatInt(repo.ID, 10),
		"{none}", "999999",
		"{remote}", remote,
		"{head}", head,
	)
	// An image in a registry of the test's own, for pullImage.
	f.registry = imagetest.Registry(t)
	imagetest.Push(t, f.registry+"/team/tool:v1", imagetest.Image(t, v1.Config{Env: []string{"A=1"}}, imagetest.Layer(t, imagetest.File("tool", "x", 0o755))))
	f.lspFound = goplsInstalled()

	return f
}

// goplsInstalled reports whether the lsp plugin's default server can run
// in a machine (see requireGopls).
func goplsInstalled() bool {
	for _, d := range []string{"/usr/local/bin", "/usr/bin", "/bin"} {
		if _, err := os.Stat(filepath.Join(d, "gopls")); err == nil {
			_, err := os.Stat("/usr/local/go/bin/go")
			return err == nil
		}
	}
	return false
}

// run sends c's request, validates request and response against the
// document, and checks the status.
func (f *specFixture) run(t *testing.T, v validator.Validator, ops []specOp, c specCase) {
	if c.op == "openLSPSession" && c.status == http.StatusSwitchingProtocols && !f.lspFound {
		t.Skip("gopls is not installed where machines find it")
	}
	if c.op == "deleteProject" && c.status == http.StatusNoContent {
		// The project's last leases (a session's, a process's) are
		// released just after their answers: deleting waits for them.
		deadline := time.Now().Add(10 * time.Second)
		for n, _ := f.e.st.LiveLeaseCount(context.Background()); n > 0 && time.Now().Before(deadline); n, _ = f.e.st.LiveLeaseCount(context.Background()) {
			time.Sleep(20 * time.Millisecond)
		}
	}
	path := strings.ReplaceAll(f.vars.Replace(c.path), "{proc}", f.proc)
	var body []byte
	switch b := c.body.(type) {
	case nil:
	case string:
		body = []byte(b)
	case []byte:
		body = b
	default:
		var err error
		if body, err = json.Marshal(b); err != nil {
			t.Fatal(err)
		}
	}
	base := "http://corral"
	if c.tcp {
		base = "http://" + f.tcp
	}
	newReq := func() *http.Request {
		var rd io.Reader
		if body != nil {
			rd = bytes.NewReader(body)
		}
		req, err := http.NewRequest(c.method, base+path, rd)
		if err != nil {
			t.Fatal(err)
		}
		if body != nil {
			req.Header.Set("Content-Type", "application/json")
		}
		if tok := f.tokens[c.as]; tok != "" {
			req.Header.Set("Authorization", "Bearer "+tok)
		}
		for k, v := range c.header {
			req.Header.Set(k, v)
		}
		return req
	}
	// The request is the operation the case names.
	var matched []string
	for _, op := range ops {
		if op.method == c.method && op.re.MatchString(strings.SplitN(path, "?", 2)[0]) {
			matched = append(matched, op.id)
		}
	}
	if !slices.Contains(matched, c.op) {
		t.Fatalf("%s %s is operation %v in the document, not %s", c.method, path, matched, c.op)
	}
	// The request against the document.
	ok, errs := v.ValidateHttpRequest(newReq())
	switch {
	case c.lenient:
	case c.badRequest && ok:
		t.Errorf("the document accepts the bad request %s %s%s", c.method, path, clip(body))
	case !c.badRequest && !ok:
		t.Errorf("the document refuses the request %s %s%s:\n%s", c.method, path, clip(body), validationErrors(errs))
	}

	var resp *http.Response
	var respBody []byte
	if c.ws && c.status == http.StatusSwitchingProtocols {
		req := newReq()
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		conn, r, err := websocket.Dial(ctx, "ws"+strings.TrimPrefix(req.URL.String(), "http"), &websocket.DialOptions{HTTPClient: f.e.http, HTTPHeader: req.Header})
		if err != nil {
			t.Fatalf("dial: %v (%v)", err, r)
		}
		defer conn.CloseNow()
		resp = r
		resp.Request = req
	} else {
		req := newReq()
		if c.ws {
			req.Header.Set("Connection", "Upgrade")
			req.Header.Set("Upgrade", "websocket")
			req.Header.Set("Sec-WebSocket-Version", "13")
			req.Header.Set("Sec-WebSocket-Key", "dGhlIHNhbXBsZSBub25jZQ==")
		}
		hc := f.e.http
		if c.tcp {
			hc = &http.Client{}
		}
		hc = &http.Client{Transport: hc.Transport, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
		r, err := hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer r.Body.Close()
		if respBody, err = io.ReadAll(r.Body); err != nil {
			t.Fatal(err)
		}
		resp = r
	}
	if resp.StatusCode != c.status {
		t.Errorf("%s %s: status %d, want %d: %s", c.method, path, resp.StatusCode, c.status, respBody)
	}
	// The response against the document. A streamed answer's media type
	// (application/x-ndjson) is a sequence of JSON values, each an
	// instance of its schema: each line is validated as the body.
	bodies := [][]byte{respBody}
	if strings.HasPrefix(resp.Header.Get("Content-Type"), api.MediaNDJSON) {
		bodies = bytes.Split(bytes.TrimSuffix(respBody, []byte("\n")), []byte("\n"))
		checkStreamOrder(t, bodies)
	}
	for _, b := range bodies {
		resp.Body = io.NopCloser(bytes.NewReader(b))
		if ok, errs := v.ValidateHttpResponse(newReq(), resp); !ok {
			t.Errorf("%s %s: the answer %d %s breaks the document:\n%s%s", c.method, path, resp.StatusCode, resp.Header.Get("Content-Type"), validationErrors(errs), clip(b))
		}
	}
	if resp.StatusCode >= 400 && c.method != "HEAD" {
		apiError(t, respBody)
	}
	if c.check != nil {
		c.check(t, f, resp, respBody)
	}
}

// checkStreamOrder checks a streamed answer's order: output chunks, then
// exactly one result or error object, last.
func checkStreamOrder(t *testing.T, lines [][]byte) {
	t.Helper()
	for i, l := range lines {
		var m map[string]json.RawMessage
		if err := json.Unmarshal(l, &m); err != nil {
			t.Errorf("line %d %s: %v", i, l, err)
			continue
		}
		_, isResult := m["code"]
		_, isError := m["error"]
		if last := i == len(lines)-1; last != (isResult || isError) {
			t.Errorf("line %d of %d is %s", i+1, len(lines), l)
		}
	}
}

func clip(b []byte) string {
	if len(b) > 400 {
		b = b[:400]
	}
	return "  body: " + string(b)
}

// lines returns the streamed lines of an NDJSON body.
func lines(body []byte) []string {
	var out []string
	sc := bufio.NewScanner(bytes.NewReader(body))
	for sc.Scan() {
		out = append(out, sc.Text())
	}
	return out
}

func cmd(argv ...string) map[string]any { return cmdBody(argv...) }

func with(m map[string]any, kv ...any) map[string]any {
	out := map[string]any{}
	for k, v := range m {
		out[k] = v
	}
	for i := 0; i+1 < len(kv); i += 2 {
		out[kv[i].(string)] = kv[i+1]
	}
	return out
}

// specCases is the conformance table, in the order it runs (later cases
// may rely on earlier ones: the account dave, the project new1). Adding an
// operation to the document means adding its cases here.
func specCases(f *specFixture) []specCase {
	ndjson := map[string]string{"Accept": api.MediaNDJSON}
	octets := map[string]string{"Content-Type": "application/octet-stream"}
	cases := []specCase{
		// Operators.
		{op: "getHealth", method: "GET", path: "/healthz", status: 200},
		{op: "getMetrics", method: "GET", path: "/metrics", status: 200},
		{op: "getMetrics", method: "GET", path: "/metrics", status: 401, tcp: true},
		{op: "getMetrics", as: "alice", method: "GET", path: "/metrics", status: 403, tcp: true},
		{op: "getMetrics", as: "admin", method: "GET", path: "/metrics", status: 200, tcp: true},
		{op: "getOpenAPI", method: "GET", path: "/openapi.json", status: 200},

		// Accounts and tokens.
		{op: "whoami", as: "alice", method: "GET", path: "/v1/whoami", status: 200},
		{op: "whoami", method: "GET", path: "/v1/whoami", status: 401},
		{op: "createAccount", as: "admin", method: "POST", path: "/v1/accounts", body: map[string]string{"name": "dave"}, status: 201},
		{op: "createAccount", as: "admin", method: "POST", path: "/v1/accounts", body: map[string]string{"name": "dave"}, status: 409},
		{op: "createAccount", as: "admin", method: "POST", path: "/v1/accounts", body: map[string]string{"name": ""}, status: 400},
		{op: "createAccount", as: "alice", method: "POST", path: "/v1/accounts", body: map[string]string{"name": "eve"}, status: 403},
		{op: "createAccount", method: "POST", path: "/v1/accounts", body: map[string]string{"name": "eve"}, status: 401},
		{op: "createToken", as: "alice", method: "POST", path: "/v1/accounts/alice/tokens", body: map[string]string{"name": "ci"}, status: 201},
		{op: "createToken", as: "admin", method: "POST", path: "/v1/accounts/dave/tokens", body: map[string]string{"name": "ci"}, status: 201},
		{op: "createToken", as: "alice", method: "POST", path: "/v1/accounts/bob/tokens", body: map[string]string{"name": "ci"}, status: 403},
		{op: "createToken", as: "admin", method: "POST", path: "/v1/accounts/nosuch/tokens", body: map[string]string{"name": "ci"}, status: 404},
		{op: "createToken", as: "alice", method: "POST", path: "/v1/accounts/alice/tokens", body: `{"name":"ci","extra":1}`, status: 400, badRequest: true},

		// Images.
		{op: "pullImage", as: "admin", method: "POST", path: "/v1/images", body: map[string]string{"ref": f.registry + "/team/tool:v1"}, status: 200},
		{op: "pullImage", as: "admin", method: "POST", path: "/v1/images", body: map[string]string{"ref": f.registry + "/team/tool:nope"}, status: 502},
		{op: "pullImage", as: "admin", method: "POST", path: "/v1/images", body: map[string]string{"ref": ""}, status: 400},
		{op: "pullImage", as: "alice", method: "POST", path: "/v1/images", body: map[string]string{"ref": f.registry + "/team/tool:v1"}, status: 403},
		{op: "pullImage", method: "POST", path: "/v1/images", body: map[string]string{"ref": "x"}, status: 401},
		{op: "listImages", as: "admin", method: "GET", path: "/v1/images", status: 200},
		{op: "listImages", as: "alice", method: "GET", path: "/v1/images", status: 403},
		{op: "listImages", method: "GET", path: "/v1/images", status: 401},

		// Projects.
		{op: "listProjects", as: "alice", method: "GET", path: "/v1/projects", status: 200},
		{op: "listProjects", method: "GET", path: "/v1/projects", status: 401},
		{op: "createProject", as: "carol", method: "POST", path: "/v1/projects", body: map[string]string{"name": "new1"}, status: 201},
		{op: "createProject", as: "carol", method: "POST", path: "/v1/projects", body: map[string]string{"name": "new1"}, status: 409},
		{op: "createProject", as: "carol", method: "POST", path: "/v1/projects", body: map[string]string{"name": "h", "kind": "host", "root": "/srv"}, status: 403},
		{op: "createProject", as: "carol", method: "POST", path: "/v1/projects", body: map[string]string{"name": "../x"}, status: 400, badRequest: true},
		{op: "createProject", as: "carol", method: "POST", path: "/v1/projects", body: `{"name":"x","color":"red"}`, status: 400, badRequest: true},
		{op: "createProject", as: "carol", method: "POST", path: "/v1/projects", body: `{"name":"` + strings.Repeat("x", 2<<20) + `"}`, status: 413, badRequest: true},
		{op: "createProject", as: "carol", method: "POST", path: "/v1/projects", body: map[string]string{"name": "y"}, header: map[string]string{"Content-Type": "text/plain"}, status: 415, badRequest: true},
		{op: "getProject", as: "alice", method: "GET", path: "/v1/projects/{box}", status: 200},
		{op: "getProject", as: "alice", method: "GET", path: "/v1/projects/{host}", status: 200},
		{op: "getProject", as: "carol", method: "GET", path: "/v1/projects/{box}", status: 403},
		{op: "getProject", as: "carol", method: "GET", path: "/v1/projects/{none}", status: 403},
		{op: "getProject", as: "alice", method: "GET", path: "/v1/projects/x", status: 400, badRequest: true},
		{op: "getProject", method: "GET", path: "/v1/projects/{box}", status: 401},
		{op: "listMembers", as: "bob", method: "GET", path: "/v1/projects/{box}/members", status: 200},
		{op: "listMembers", as: "carol", method: "GET", path: "/v1/projects/{box}/members", status: 403},
		{op: "addMember", as: "alice", method: "POST", path: "/v1/projects/{repo}/members", body: map[string]string{"account": "bob"}, status: 201},
		{op: "addMember", as: "alice", method: "POST", path: "/v1/projects/{repo}/members", body: map[string]string{"account": "bob"}, status: 409},
		{op: "addMember", as: "alice", method: "POST", path: "/v1/projects/{repo}/members", body: map[string]string{"account": "nosuch"}, status: 404},
		{op: "addMember", as: "alice", method: "POST", path: "/v1/projects/{repo}/members", body: map[string]string{"account": "carol", "role": "god"}, status: 400, badRequest: true},
		{op: "addMember", as: "bob", method: "POST", path: "/v1/projects/{box}/members", body: map[string]string{"account": "carol"}, status: 403},
		{op: "addMember", as: "alice", method: "POST", path: "/v1/projects/{box}/members", body: map[string]any{"account": "carol", "trusted": true}, status: 403},

		// Machines.
		{op: "setMachine", as: "alice", method: "PUT", path: "/v1/projects/{repo}/machine", body: map[string]any{"image": "base", "limits": map[string]any{"memory": 256 << 20, "pids": 128}}, status: 200},
		{op: "setMachine", as: "admin", method: "PUT", path: "/v1/projects/{repo}/machine", body: map[string]any{"limits": map[string]any{"memory": 256 << 20}}, status: 200},
		{op: "setMachine", as: "bob", method: "PUT", path: "/v1/projects/{box}/machine", body: map[string]any{"limits": map[string]any{}}, status: 403},
		{op: "setMachine", as: "alice", method: "PUT", path: "/v1/projects/{host}/machine", body: map[string]any{"limits": map[string]any{}}, status: 400},
		{op: "setMachine", as: "alice", method: "PUT", path: "/v1/projects/{repo}/machine", body: map[string]any{"image": "Bad Name", "limits": map[string]any{}}, status: 400, badRequest: true},
		{op: "setMachine", as: "admin", method: "PUT", path: "/v1/projects/{none}/machine", body: map[string]any{"limits": map[string]any{}}, status: 404},
		// box's site session holds a lease.
		{op: "resetMachine", as: "alice", method: "POST", path: "/v1/projects/{box}/reset", status: 409},
		{op: "resetMachine", as: "alice", method: "POST", path: "/v1/projects/{repo}/reset", status: 204},
		{op: "resetMachine", as: "bob", method: "POST", path: "/v1/projects/{box}/reset", status: 403},
		{op: "resetMachine", as: "alice", method: "POST", path: "/v1/projects/{host}/reset", status: 400},

		// Commands.
		{op: "runCommand", as: "alice", method: "POST", path: "/v1/projects/{host}/commands", body: cmd("sh", "-c", "echo out; echo err >&2; exit 3"), status: 200,
			check: func(t *testing.T, _ *specFixture, _ *http.Response, b []byte) {
				if !strings.Contains(string(b), `"code":3`) {
					t.Errorf("%s", b)
				}
			}},
		{op: "runCommand", as: "alice", method: "POST", path: "/v1/projects/{box}/commands", body: with(cmd("sh", "-c", `printf "$A"; cat`), "env", map[string]string{"A": "env "}, "stdin", "c3RkaW4=", "encoding", "base64", "timeoutMs", 20000), status: 200,
			check: func(t *testing.T, _ *specFixture, _ *http.Response, b []byte) {
				if !strings.Contains(string(b), `"stdout":"ZW52IHN0ZGlu"`) { // "env stdin"
					t.Errorf("%s", b)
				}
			}},
		{op: "runCommand", as: "alice", method: "POST", path: "/v1/projects/{host}/commands", body: cmd("sh", "-c", "echo a; echo b >&2"), header: ndjson, status: 200,
			check: func(t *testing.T, _ *specFixture, resp *http.Response, b []byte) {
				ls := lines(b)
				if resp.Header.Get("Content-Type") != api.MediaNDJSON || len(ls) < 3 || !strings.Contains(ls[len(ls)-1], `"code":0`) {
					t.Errorf("%s %q", resp.Header.Get("Content-Type"), ls)
				}
			}},
		{op: "runCommand", as: "alice", method: "POST", path: "/v1/projects/{host}/commands", body: with(cmd("sh", "-c", "echo a; sleep 5"), "timeoutMs", 300), header: ndjson, status: 200,
			check: func(t *testing.T, _ *specFixture, _ *http.Response, b []byte) {
				ls := lines(b)
				if len(ls) < 2 || !strings.Contains(ls[len(ls)-1], `"kind":"timeout"`) {
					t.Errorf("%q", ls)
				}
			}},
		{op: "runCommand", method: "POST", path: "/v1/projects/{host}/commands", body: cmd("true"), status: 401},
		{op: "runCommand", as: "carol", method: "POST", path: "/v1/projects/{host}/commands", body: cmd("true"), status: 403},
		{op: "runCommand", as: "alice", method: "POST", path: "/v1/projects/{host}/commands", body: with(cmd("true"), "env", map[string]string{"1BAD": "x"}), status: 400, badRequest: true},
		{op: "runCommand", as: "alice", method: "POST", path: "/v1/projects/{host}/commands", body: with(cmd("true"), "shell", true), status: 400, badRequest: true},
		{op: "runCommand", as: "alice", method: "POST", path: "/v1/projects/{host}/commands", body: with(cmd("true"), "stdin", strings.Repeat("QUFB", 400)), status: 413},
		{op: "runCommand", as: "alice", method: "POST", path: "/v1/projects/{host}/commands", body: with(cmd("sh", "-c", "yes | head -c 10000"), "outputLimit", map[string]any{"stdout": 100}), status: 413},
		{op: "runCommand", as: "alice", method: "POST", path: "/v1/projects/{host}/commands", body: cmd("/nonexistent/program"), status: 422},
		{op: "runCommand", as: "alice", method: "POST", path: "/v1/projects/{host}/commands", body: with(cmd("sleep", "5"), "timeoutMs", 200), status: 504},

		// Sessions.
		{op: "openSession", as: "alice", method: "GET", path: "/v1/projects/{host}/sessions?argv=true", ws: true, status: 101},
		{op: "openSession", as: "alice", method: "GET", path: "/v1/projects/{box}/sessions?argv=sh&argv=-c&argv=stty+size&tty=1&rows=30&cols=100", ws: true, status: 101},
		{op: "openSession", as: "alice", method: "GET", path: "/v1/projects/{host}/sessions?argv=true&env=A%3D1%3D2&env=B%3D", ws: true, status: 101},
		{op: "openSession", as: "alice", method: "GET", path: "/v1/projects/{host}/sessions?argv=true&env=1A%3Dx", ws: true, status: 400, lenient: true}, // the validator checks no pattern of query array items
		{op: "openSession", as: "alice", method: "GET", path: "/v1/projects/{host}/sessions", ws: true, status: 400, badRequest: true},
		{op: "openSession", as: "alice", method: "GET", path: "/v1/projects/{host}/sessions?argv=true&tty=1&rows=0", ws: true, status: 400, badRequest: true},
		{op: "openSession", as: "alice", method: "GET", path: "/v1/projects/{host}/sessions?argv=true", status: 400},
		{op: "openSession", method: "GET", path: "/v1/projects/{host}/sessions?argv=true", ws: true, status: 401},
		{op: "openSession", as: "carol", method: "GET", path: "/v1/projects/{host}/sessions?argv=true", ws: true, status: 403},

		// Language servers.
		{op: "openLSPSession", as: "alice", method: "GET", path: "/v1/projects/{box}/lsp/gopls", ws: true, status: 101},
		{op: "openLSPSession", as: "alice", method: "GET", path: "/v1/projects/{box}/lsp/nosuch", ws: true, status: 404},
		{op: "openLSPSession", as: "alice", method: "GET", path: "/v1/projects/{host}/lsp/gopls", ws: true, status: 400},
		{op: "openLSPSession", as: "carol", method: "GET", path: "/v1/projects/{box}/lsp/gopls", ws: true, status: 403},

		// Sites.
		{op: "listSites", as: "bob", method: "GET", path: "/v1/projects/{box}/sites", status: 200},
		{op: "listSites", as: "carol", method: "GET", path: "/v1/projects/{box}/sites", status: 403},
		{op: "publishSite", as: "alice", method: "PUT", path: "/v1/projects/{box}/sites/tmp", body: map[string]int{"port": 9000}, status: 200},
		{op: "publishSite", as: "alice", method: "PUT", path: "/v1/projects/{repo}/sites/web", body: map[string]int{"port": 9000}, status: 409},
		{op: "publishSite", as: "alice", method: "PUT", path: "/v1/projects/{host}/sites/h", body: map[string]int{"port": 9000}, status: 400},
		{op: "publishSite", as: "alice", method: "PUT", path: "/v1/projects/{box}/sites/tmp2", body: map[string]int{"port": 0}, status: 400, badRequest: true},
		{op: "publishSite", as: "carol", method: "PUT", path: "/v1/projects/{box}/sites/tmp3", body: map[string]int{"port": 9000}, status: 403},
		{op: "unpublishSite", as: "alice", method: "DELETE", path: "/v1/projects/{box}/sites/tmp", status: 204},
		{op: "unpublishSite", as: "alice", method: "DELETE", path: "/v1/projects/{box}/sites/tmp", status: 404},
		{op: "unpublishSite", as: "carol", method: "DELETE", path: "/v1/projects/{box}/sites/web", status: 403},
		{op: "createSiteURL", as: "bob", method: "POST", path: "/v1/projects/{box}/sites/web/url", body: map[string]any{"path": "/a?b=1", "expiresInSeconds": 60}, status: 200},
		{op: "createSiteURL", as: "bob", method: "POST", path: "/v1/projects/{box}/sites/web/url", status: 200},
		{op: "createSiteURL", as: "alice", method: "POST", path: "/v1/projects/{box}/sites/nosuch/url", body: map[string]any{}, status: 404},
		{op: "createSiteURL", as: "alice", method: "POST", path: "/v1/projects/{box}/sites/web/url", body: map[string]any{"expiresInSeconds": 7200}, status: 400, badRequest: true},
		{op: "createSiteURL", as: "carol", method: "POST", path: "/v1/projects/{box}/sites/web/url", body: map[string]any{}, status: 403},

		// Export and the editor's Git reads.
		{op: "exportBranch", as: "alice", method: "POST", path: "/v1/projects/{repo}/export", body: map[string]string{"remote": "{remote}", "branch": "main", "expectedHead": "{head}"}, status: 200},
		{op: "exportBranch", as: "alice", method: "POST", path: "/v1/projects/{repo}/export", body: map[string]string{"remote": "{remote}", "branch": "main", "expectedHead": strings.Repeat("0", 40)}, status: 409},
		{op: "exportBranch", as: "alice", method: "POST", path: "/v1/projects/{repo}/export", body: map[string]string{"remote": "https://example.com/r.git", "branch": "main", "expectedHead": "{head}"}, status: 403},
		{op: "exportBranch", as: "carol", method: "POST", path: "/v1/projects/{repo}/export", body: map[string]string{"remote": "{remote}", "branch": "main", "expectedHead": "{head}"}, status: 403},
		{op: "exportBranch", as: "alice", method: "POST", path: "/v1/projects/{repo}/export", body: `{"remote":1}`, status: 400, badRequest: true},
		{op: "gitStatus", as: "alice", method: "GET", path: "/v1/projects/{repo}/git/status", status: 200},
		{op: "gitStatus", as: "alice", method: "GET", path: "/v1/projects/{box}/git/status", status: 200},
		{op: "gitStatus", as: "carol", method: "GET", path: "/v1/projects/{repo}/git/status", status: 403},
		{op: "gitLog", as: "alice", method: "GET", path: "/v1/projects/{repo}/git/log?limit=5", status: 200},
		{op: "gitLog", as: "alice", method: "GET", path: "/v1/projects/{repo}/git/log?ref=nosuch", status: 404},
		{op: "gitDiff", as: "alice", method: "GET", path: "/v1/projects/{repo}/git/diff", status: 200},
		{op: "gitDiff", as: "carol", method: "GET", path: "/v1/projects/{repo}/git/diff", status: 403},
		{op: "gitShow", as: "alice", method: "GET", path: "/v1/projects/{repo}/git/show?rev={head}&path=README", status: 200},
		{op: "gitShow", as: "alice", method: "GET", path: "/v1/projects/{repo}/git/show?rev={head}&path=nosuch", status: 404},

		// Egress.
		{op: "getEgress", as: "bob", method: "GET", path: "/v1/projects/{box}/egress", status: 200},
		{op: "getEgress", as: "carol", method: "GET", path: "/v1/projects/{box}/egress", status: 403},
		{op: "setEgress", as: "alice", method: "PUT", path: "/v1/projects/{repo}/egress", body: map[string]any{"mode": "proxy", "allow": []string{"pypi.org"}, "deny": []string{}}, status: 200},
		{op: "setEgress", as: "admin", method: "PUT", path: "/v1/projects/{repo}/egress", body: map[string]any{"mode": "none", "allow": []string{}, "deny": []string{}}, status: 200},
		{op: "setEgress", as: "bob", method: "PUT", path: "/v1/projects/{box}/egress", body: map[string]any{"mode": "none", "allow": []string{}, "deny": []string{}}, status: 403},
		{op: "setEgress", as: "alice", method: "PUT", path: "/v1/projects/{repo}/egress", body: map[string]any{"mode": "open", "allow": []string{}, "deny": []string{}}, status: 400, badRequest: true},
		{op: "setEgress", as: "admin", method: "PUT", path: "/v1/projects/{none}/egress", body: map[string]any{"mode": "none", "allow": []string{}, "deny": []string{}}, status: 404},
		{op: "getEgressLog", as: "bob", method: "GET", path: "/v1/projects/{box}/egress/log?limit=10", status: 200},
		{op: "getEgressLog", as: "bob", method: "GET", path: "/v1/projects/{box}/egress/log?limit=0", status: 400, badRequest: true},
		{op: "getEgressLog", as: "carol", method: "GET", path: "/v1/projects/{box}/egress/log", status: 403},

		// Files (in box's machine).
		{op: "putFile", as: "alice", method: "PUT", path: "/v1/projects/{box}/files?path=/workspace/f.txt&mode=0600", body: "hello\x00\xff", header: octets, status: 200},
		{op: "putFile", as: "carol", method: "PUT", path: "/v1/projects/{box}/files?path=/workspace/f.txt", body: "x", header: octets, status: 403},
		{op: "putFile", as: "alice", method: "PUT", path: "/v1/projects/{box}/files?path=/workspace/../../etc/x", body: "x", header: octets, status: 400},
		{op: "getFile", as: "bob", method: "GET", path: "/v1/projects/{box}/files?path=/workspace/f.txt", status: 200,
			check: func(t *testing.T, _ *specFixture, _ *http.Response, b []byte) {
				if string(b) != "hello\x00\xff" {
					t.Errorf("%q", b)
				}
			}},
		{op: "getFile", as: "bob", method: "GET", path: "/v1/projects/{box}/files?path=/workspace/nosuch", status: 404},
		{op: "getFile", as: "bob", method: "GET", path: "/v1/projects/{box}/files", status: 400, badRequest: true},
		{op: "statFile", as: "bob", method: "GET", path: "/v1/projects/{box}/files/stat?path=/workspace/f.txt", status: 200},
		{op: "statFile", as: "bob", method: "GET", path: "/v1/projects/{box}/files/stat?path=/workspace/nosuch", status: 404},
		{op: "listFiles", as: "bob", method: "GET", path: "/v1/projects/{box}/files/list?path=/workspace", status: 200},
		{op: "listFiles", as: "carol", method: "GET", path: "/v1/projects/{box}/files/list?path=/workspace", status: 403},
		{op: "makeDirectory", as: "alice", method: "POST", path: "/v1/projects/{box}/files/mkdir", body: map[string]any{"path": "/workspace/d"}, status: 200},
		{op: "makeDirectory", as: "alice", method: "POST", path: "/v1/projects/{box}/files/mkdir", body: map[string]any{"path": "/workspace/d"}, status: 409},
		{op: "makeDirectory", as: "alice", method: "POST", path: "/v1/projects/{box}/files/mkdir", body: map[string]any{"dir": "/workspace/e"}, status: 400, badRequest: true},
		{op: "renameFile", as: "alice", method: "POST", path: "/v1/projects/{box}/files/rename", body: map[string]any{"from": "/workspace/f.txt", "to": "/workspace/d/g.txt"}, status: 204},
		{op: "renameFile", as: "alice", method: "POST", path: "/v1/projects/{box}/files/rename", body: map[string]any{"from": "/workspace/nosuch", "to": "/workspace/x"}, status: 404},
		{op: "removeFile", as: "alice", method: "POST", path: "/v1/projects/{box}/files/remove", body: map[string]any{"path": "/workspace/d", "recursive": true}, status: 204},
		{op: "removeFile", as: "alice", method: "POST", path: "/v1/projects/{box}/files/remove", body: map[string]any{"path": "/workspace/d"}, status: 404},
		{op: "removeFile", as: "carol", method: "POST", path: "/v1/projects/{box}/files/remove", body: map[string]any{"path": "/workspace/site.py"}, status: 403},
		{op: "watchFiles", as: "bob", method: "GET", path: "/v1/projects/{box}/files/watch?path=/workspace&recursive=1", ws: true, status: 101},
		{op: "watchFiles", as: "carol", method: "GET", path: "/v1/projects/{box}/files/watch?path=/workspace", ws: true, status: 403},

		// Background processes (in box's machine): one that prints and
		// waits, followed, signalled, then deleted.
		{op: "startProcess", as: "alice", method: "POST", path: "/v1/projects/{box}/processes",
			body: map[string]any{"argv": []string{"sh", "-c", "echo up; exec sleep 300"}, "lifetime": 60}, status: 201,
			check: func(t *testing.T, f *specFixture, _ *http.Response, b []byte) {
				var p struct {
					ID string `json:"id"`
				}
				if err := json.Unmarshal(b, &p); err != nil || p.ID == "" {
					t.Fatalf("no process id in %s: %v", b, err)
				}
				f.proc = p.ID
			}},
		{op: "startProcess", as: "carol", method: "POST", path: "/v1/projects/{box}/processes", body: map[string]any{"argv": []string{"true"}}, status: 403},
		{op: "startProcess", as: "alice", method: "POST", path: "/v1/projects/{box}/processes", body: map[string]any{"argv": []string{}}, status: 400, lenient: true},
		{op: "listProcesses", as: "bob", method: "GET", path: "/v1/projects/{box}/processes", status: 200},
		{op: "listProcesses", as: "carol", method: "GET", path: "/v1/projects/{box}/processes", status: 403},
		{op: "getProcess", as: "bob", method: "GET", path: "/v1/projects/{box}/processes/{proc}", status: 200},
		{op: "getProcess", as: "alice", method: "GET", path: "/v1/projects/{repo}/processes/{proc}", status: 404},
		{op: "getProcessOutput", as: "bob", method: "GET", path: "/v1/projects/{box}/processes/{proc}/output?from=0&follow=0", status: 200},
		{op: "getProcessOutput", as: "carol", method: "GET", path: "/v1/projects/{box}/processes/{proc}/output", status: 403},
		{op: "signalProcess", as: "alice", method: "POST", path: "/v1/projects/{box}/processes/{proc}/signal", body: map[string]any{"signal": "CONT"}, status: 200},
		{op: "signalProcess", as: "alice", method: "POST", path: "/v1/projects/{box}/processes/{proc}/signal", body: map[string]any{"signal": "NOSUCH"}, status: 400, lenient: true},
		{op: "deleteProcess", as: "alice", method: "DELETE", path: "/v1/projects/{box}/processes/{proc}", status: 200},
		{op: "deleteProcess", as: "alice", method: "DELETE", path: "/v1/projects/{box}/processes/{proc}", status: 404},

		// MCP: a tool call acts as the token's account (bob sees box).
		{op: "mcp", as: "bob", method: "POST", path: "/v1/mcp", header: mcpAccept, body: mcpCall("list_projects"), status: 200,
			check: func(t *testing.T, _ *specFixture, _ *http.Response, b []byte) {
				if !bytes.Contains(b, []byte(`\"name\":\"box\"`)) || bytes.Contains(b, []byte(`"isError":true`)) {
					t.Errorf("list_projects as bob: %s", b)
				}
			}},
		{op: "mcp", method: "POST", path: "/v1/mcp", header: mcpAccept, body: mcpCall("list_projects"), status: 401},
		{op: "mcp", as: "bob", method: "POST", path: "/v1/mcp", header: map[string]string{"Accept": "application/json"}, body: mcpCall("list_projects"), status: 400, lenient: true},
		{op: "mcp", as: "bob", method: "POST", path: "/v1/mcp", header: map[string]string{"Accept": mcpAccept["Accept"], "Content-Type": "text/plain"}, body: mcpCall("list_projects"), status: 415, badRequest: true},
	}
	// The Sites gateway, by path, for every method.
	for _, m := range anyMethod {
		method := strings.ToUpper(m)
		op := "site" + strings.ToUpper(m[:1]) + m[1:]
		redirect := "siteRedirect" + strings.ToUpper(m[:1]) + m[1:]
		var body any
		if method == "POST" || method == "PUT" || method == "PATCH" {
			body = `{"a":1}`
		}
		cases = append(cases,
			specCase{op: op, as: "bob", method: method, path: "/sites/web/x?q=1", body: body, status: 200},
			specCase{op: op, method: method, path: "/sites/web/x", status: 401},
			specCase{op: op, as: "carol", method: method, path: "/sites/web/x", status: 403},
			specCase{op: op, as: "alice", method: method, path: "/sites/nosuch/x", status: 404},
			specCase{op: redirect, method: method, path: "/sites/web", status: http.StatusPermanentRedirect},
		)
	}
	cases = append(cases,
		// Projects are deleted last but one: new1 holds nothing.
		specCase{op: "deleteProject", as: "bob", method: "DELETE", path: "/v1/projects/{box}", status: 403},
		specCase{op: "deleteProject", as: "alice", method: "DELETE", path: "/v1/projects/{box}", status: 409},
		specCase{op: "deleteProject", as: "carol", method: "DELETE", path: "/v1/projects/{none}", status: 403},
		specCase{op: "deleteProject", as: "alice", method: "DELETE", path: "/v1/projects/{host}", status: 204},
		// A machine whose image does not exist fails to start.
		specCase{op: "setMachine", as: "alice", method: "PUT", path: "/v1/projects/{repo}/machine", body: map[string]any{"image": "nosuch", "limits": map[string]any{}}, status: 200},
		specCase{op: "resetMachine", as: "alice", method: "POST", path: "/v1/projects/{repo}/reset", status: 204},
		specCase{op: "runCommand", as: "alice", method: "POST", path: "/v1/projects/{repo}/commands", body: cmd("true"), status: 422},
	)
	// {remote} and {head} in bodies.
	for i := range cases {
		if m, ok := cases[i].body.(map[string]string); ok {
			out := map[string]string{}
			for k, v := range m {
				out[k] = f.vars.Replace(v)
			}
			cases[i].body = out
		}
	}
	return cases
}
