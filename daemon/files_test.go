package daemon

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/corral-sandbox/corral/api"
	"github.com/corral-sandbox/corral/client"

	"github.com/corral-sandbox/corral/internal/testenv"
	"github.com/corral-sandbox/corral/sandbox/sandboxtest"
	"github.com/corral-sandbox/corral/store"
)

func filesPath(id int64, op string, q url.Values) string {
	p := fmt.Sprintf("/v1/projects/%d/files", id)
	if op != "" {
		p += "/" + op
	}
	if q != nil {
		p += "?" + q.Encode()
	}
	return p
}

func qp(kv ...string) url.Values {
	v := url.Values{}
	for i := 0; i+1 < len(kv); i += 2 {
		v.Set(kv[i], kv[i+1])
	}
	return v
}

// rawDo sends body (a stream) and returns status, headers and body.
func (e *env) rawDo(ctx context.Context, method, path, token string, body io.Reader) (int, http.Header, []byte) {
	e.t.Helper()
	req, err := http.NewRequestWithContext(ctx, method, "http://corral"+path, body)
	if err != nil {
		e.t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := e.http.Do(req)
	if err != nil {
		e.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		e.t.Fatal(err)
	}
	return resp.StatusCode, resp.Header, data
}

// run runs argv in the project as a command and returns its stdout.
func (e *env) runOut(t *testing.T, tok string, id int64, argv ...string) string {
	t.Helper()
	status, b := e.do(context.Background(), "POST", commandsPath(id), tok, cmdBody(argv...))
	if status != 200 {
		t.Fatalf("%v: %d %s", argv, status, b)
	}
	var res struct {
		Stdout, Stderr string
		Code           *int
	}
	if err := json.Unmarshal(b, &res); err != nil {
		t.Fatal(err)
	}
	if res.Code == nil || *res.Code != 0 {
		t.Fatalf("%v: %s", argv, b)
	}
	return res.Stdout
}

// allBytes is n bytes holding every byte value, in a pattern that is not
// periodic in any small power of two.
func allBytes(n int) []byte {
	b := make([]byte, n)
	x := uint32(12345)
	for i := range b {
		if i < 256 {
			b[i] = byte(i)
			continue
		}
		x = x*1664525 + 1013904223
		b[i] = byte(x >> 24)
	}
	return b
}

func TestFilesManaged(t *testing.T) {
	e := newManagedEnv(t)
	alice, tok := e.account("alice")
	p := e.managedProject("box", alice)
	testFiles(t, e, tok, p, true)
}

func TestFilesHost(t *testing.T) {
	requireRoot(t)
	e := newEnv(t, envOpts{})
	alice, tok := e.account("alice")
	p := e.hostProject("web", alice)
	testFiles(t, e, tok, p, false)
}

func testFiles(t *testing.T, e *env, tok string, p store.Project, managed bool) {
	ctx := context.Background()
	id := p.ID

	// A binary file of every byte value, a few MiB, round-trips.
	data := allBytes(3<<20 + 17)
	status, _, b := e.rawDo(ctx, "PUT", filesPath(id, "", qp("path", "/workspace/bin.dat", "mode", "0640")), tok, bytes.NewReader(data))
	if status != 200 {
		t.Fatalf("PUT: %d %s", status, b)
	}
	var fj api.File
	if err := json.Unmarshal(b, &fj); err != nil || fj.Size != int64(len(data)) || fj.Mode != "0640" || fj.Type != "file" || fj.Path != "/workspace/bin.dat" {
		t.Fatalf("PUT answered %s (%v)", b, err)
	}
	status, h, got := e.rawDo(ctx, "GET", filesPath(id, "", qp("path", "bin.dat")), tok, nil)
	if status != 200 || !bytes.Equal(got, data) {
		t.Fatalf("GET: %d, %d bytes, equal %v", status, len(got), bytes.Equal(got, data))
	}
	if h.Get("X-Corral-Mode") != "0640" {
		t.Errorf("mode header %q", h.Get("X-Corral-Mode"))
	}
	// The command sees the same bytes and the mode.
	sum := fmt.Sprintf("%x", sha256.Sum256(data))
	if out := e.runOut(t, tok, id, "sha256sum", "bin.dat"); !strings.HasPrefix(out, sum) {
		t.Errorf("sha256sum in the project: %q, want %s", out, sum)
	}
	if out := e.runOut(t, tok, id, "stat", "-c", "%a", "bin.dat"); strings.TrimSpace(out) != "640" {
		t.Errorf("mode in the project: %q", out)
	}

	// stat, mkdir, list of 1,000 files, rename, remove.
	status, b = e.do(ctx, "POST", filesPath(id, "mkdir", nil), tok, map[string]any{"path": "/workspace/many/sub", "parents": true})
	if status != 200 {
		t.Fatalf("mkdir: %d %s", status, b)
	}
	e.runOut(t, tok, id, "sh", "-c", "cd many && i=0; while [ $i -lt 1000 ]; do : > f$i; i=$((i+1)); done")
	status, b = e.do(ctx, "GET", filesPath(id, "list", qp("path", "/workspace/many")), tok, nil)
	var lj api.FileList
	if status != 200 || json.Unmarshal(b, &lj) != nil {
		t.Fatalf("list: %d %.300s", status, b)
	}
	if len(lj.Entries) != 1001 || lj.Truncated || lj.Dir.Type != "dir" {
		t.Fatalf("list: %d entries, truncated %v", len(lj.Entries), lj.Truncated)
	}
	names := map[string]bool{}
	for _, en := range lj.Entries {
		names[en.Name] = true
		if !strings.HasPrefix(en.Path, "/workspace/many/") {
			t.Fatalf("entry path %q", en.Path)
		}
	}
	if !names["f0"] || !names["f999"] || !names["sub"] {
		t.Errorf("list misses entries")
	}
	status, b = e.do(ctx, "GET", filesPath(id, "list", qp("path", "/workspace/many", "limit", "10")), tok, nil)
	if json.Unmarshal(b, &lj); status != 200 || len(lj.Entries) != 10 || !lj.Truncated {
		t.Errorf("bounded list: %d, %d entries, truncated %v", status, len(lj.Entries), lj.Truncated)
	}
	status, b = e.do(ctx, "POST", filesPath(id, "rename", nil), tok, map[string]any{"from": "many/f1", "to": "many/sub/g1"})
	if status != 204 {
		t.Fatalf("rename: %d %s", status, b)
	}
	status, b = e.do(ctx, "GET", filesPath(id, "stat", qp("path", "many/sub/g1")), tok, nil)
	if json.Unmarshal(b, &fj); status != 200 || fj.Type != "file" {
		t.Fatalf("stat: %d %s", status, b)
	}
	status, b = e.do(ctx, "POST", filesPath(id, "remove", nil), tok, map[string]any{"path": "many"})
	if status != 409 {
		t.Errorf("remove non-empty without recursive: %d %s", status, b)
	}
	status, b = e.do(ctx, "POST", filesPath(id, "remove", nil), tok, map[string]any{"path": "many", "recursive": true})
	if status != 204 {
		t.Fatalf("remove: %d %s", status, b)
	}
	if status, _ = e.do(ctx, "GET", filesPath(id, "stat", qp("path", "many")), tok, nil); status != 404 {
		t.Errorf("stat after remove: %d", status)
	}
	// PUT into a missing directory: 404, or made as mkdir -p with
	// mkdirs=1; "." and "./x" name the workspace and x in it.
	if status, _, b = e.rawDo(ctx, "PUT", filesPath(id, "", qp("path", "new/deep/f.txt")), tok, strings.NewReader("x")); status != 404 {
		t.Errorf("PUT into a missing directory: %d %s", status, b)
	}
	if status, _, b = e.rawDo(ctx, "PUT", filesPath(id, "", qp("path", "new/deep/f.txt", "mkdirs", "1")), tok, strings.NewReader("deep")); status != 200 {
		t.Fatalf("PUT mkdirs=1: %d %s", status, b)
	}
	if status, _, b = e.rawDo(ctx, "PUT", filesPath(id, "", qp("path", "./new/deep/g.txt", "mkdirs", "1")), tok, strings.NewReader("g")); status != 200 {
		t.Fatalf("PUT mkdirs=1 into an existing directory: %d %s", status, b)
	}
	if out := e.runOut(t, tok, id, "cat", "new/deep/f.txt", "new/deep/g.txt"); out != "deepg" {
		t.Errorf("the files PUT made: %q", out)
	}
	if status, _, b = e.rawDo(ctx, "PUT", filesPath(id, "", qp("path", "x", "mkdirs", "yes")), tok, strings.NewReader("x")); status != 400 {
		t.Errorf("mkdirs=yes: %d %s", status, b)
	}
	status, b = e.do(ctx, "GET", filesPath(id, "list", qp("path", ".")), tok, nil)
	if json.Unmarshal(b, &lj); status != 200 || lj.Dir.Path != "/workspace" {
		t.Errorf("list path=.: %d %s", status, b)
	}
	if status, _ = e.do(ctx, "GET", filesPath(id, "list", qp("path", "./new")), tok, nil); status != 200 {
		t.Errorf("list path=./new: %d", status)
	}
	if status, _ = e.do(ctx, "GET", filesPath(id, "list", qp("path", "new/../..")), tok, nil); status != 400 {
		t.Errorf("a climbing path: %d", status)
	}
	// PUT refuses a directory target.
	e.do(ctx, "POST", filesPath(id, "mkdir", nil), tok, map[string]any{"path": "adir"})
	if status, _, b = e.rawDo(ctx, "PUT", filesPath(id, "", qp("path", "adir")), tok, strings.NewReader("x")); status != 400 {
		t.Errorf("PUT over a directory: %d %s", status, b)
	}

	testFileEscapes(t, e, tok, id, managed)
	testFileAtomic(t, e, tok, id)
	testFileWatch(t, e, tok, id)

	// Writes are journaled under a "files" lease, which is released.
	rows, err := e.st.ListJournal(ctx, store.JournalFilter{Project: id})
	if err != nil {
		t.Fatal(err)
	}
	var puts, mkdirs int
	for _, r := range rows {
		if r.LeaseKind == "files" && len(r.Argv) > 1 {
			switch r.Argv[1] {
			case "put":
				puts++
			case "mkdir":
				mkdirs++
			}
		}
	}
	if puts == 0 || mkdirs == 0 {
		t.Errorf("journal: %d puts, %d mkdirs", puts, mkdirs)
	}
	testenv.WaitFor(t, 5*time.Second, "leases released", func() bool { return e.liveLeases() == 0 })
	// Each call's lease came from the sandbox control, stamped with the
	// domain that acted (never empty), and was released.
	leases, err := e.st.ListLeases(ctx, store.LeaseFilter{Project: id})
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range leases {
		if l.Kind == "files" && (l.Domain == "" || l.State != store.LeaseReleased) {
			t.Errorf("files lease %s: domain %q, state %s", l.ID, l.Domain, l.State)
		}
	}
}

// testFileEscapes: no path leads out of the project.
func testFileEscapes(t *testing.T, e *env, tok string, id int64, managed bool) {
	ctx := context.Background()
	// A host file the project must never reach.
	secret := filepath.Join(t.TempDir(), "host-secret")
	if err := os.WriteFile(secret, []byte("HOST-SECRET"), 0o644); err != nil {
		t.Fatal(err)
	}
	os.Chmod(filepath.Dir(secret), 0o755)
	e.runOut(t, tok, id, "ln", "-s", secret, "abs-link")
	e.runOut(t, tok, id, "ln", "-s", "../../../../../../.."+secret, "rel-link")
	e.runOut(t, tok, id, "sh", "-c", "ln -s chain2 chain1; ln -s chain3 chain2; ln -s "+secret+" chain3")
	e.runOut(t, tok, id, "ln", "-s", "/proc/self/root"+secret, "proc-link")
	e.runOut(t, tok, id, "ln", "-s", "/", "rootlink")
	for _, pth := range []string{"../x", "/workspace/../etc/passwd", "a/./b", "/workspace//x"} {
		if status, b := e.do(ctx, "GET", filesPath(id, "stat", qp("path", pth)), tok, nil); status != 400 {
			t.Errorf("stat %q: %d %s, want 400", pth, status, b)
		}
	}
	for _, pth := range []string{"abs-link", "rel-link", "chain1", "proc-link", "rootlink" + secret, "/proc/self/root" + secret, "/proc/1/root" + secret} {
		status, _, b := e.rawDo(ctx, "GET", filesPath(id, "", qp("path", pth)), tok, nil)
		if bytes.Contains(b, []byte("HOST-SECRET")) {
			t.Fatalf("GET %q read the host file", pth)
		}
		if status == 200 {
			t.Errorf("GET %q: 200 %q", pth, b)
		}
		// Writing through it does not reach the host file either.
		e.rawDo(ctx, "PUT", filesPath(id, "", qp("path", pth)), tok, strings.NewReader("OVERWRITTEN"))
		if got, _ := os.ReadFile(secret); string(got) != "HOST-SECRET" {
			t.Fatalf("PUT %q wrote the host file: %q", pth, got)
		}
	}
	// /proc is refused outright.
	if status, _, b := e.rawDo(ctx, "GET", filesPath(id, "", qp("path", "/proc/self/environ")), tok, nil); status != 400 && status != 404 {
		t.Errorf("GET /proc/self/environ: %d %s", status, b)
	}
	// A swapped symlink, raced against reads, never leads out.
	var stop atomic.Bool
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		e.runOut(t, tok, id, "sh", "-c", "mkdir -p rd; echo inside > rd/f; i=0; while [ $i -lt 300 ]; do ln -sfn "+filepath.Dir(secret)+" swap; ln -sfn rd swap; i=$((i+1)); done")
		stop.Store(true)
	}()
	for !stop.Load() {
		_, _, b := e.rawDo(ctx, "GET", filesPath(id, "", qp("path", "swap/host-secret")), tok, nil)
		if bytes.Contains(b, []byte("HOST-SECRET")) {
			t.Fatal("a swapped symlink led to the host file")
		}
	}
	wg.Wait()
	if !managed {
		return
	}
	// A file of another guest user (root, 0600) is not readable as the
	// default user (1000 in the base image); root reads it.
	if status, _, b := e.rawDo(ctx, "PUT", filesPath(id, "", qp("path", "rootfile", "user", "root", "mode", "0600")), tok, strings.NewReader("root-only")); status != 200 {
		t.Fatalf("PUT as root: %d %s", status, b)
	}
	if out := e.runOut(t, tok, id, "stat", "-c", "%u:%g %a", "rootfile"); strings.TrimSpace(out) != "0:0 600" {
		t.Errorf("a file PUT as root: %q", out)
	}
	if status, _, b := e.rawDo(ctx, "GET", filesPath(id, "", qp("path", "rootfile")), tok, nil); status != 403 {
		t.Errorf("GET root's 0600 file as the default user: %d %s, want 403", status, b)
	}
	if status, _, b := e.rawDo(ctx, "GET", filesPath(id, "", qp("path", "rootfile", "user", "root")), tok, nil); status != 200 || string(b) != "root-only" {
		t.Errorf("GET as root: %d %q", status, b)
	}
	if status, b := e.do(ctx, "GET", filesPath(id, "stat", qp("path", "x", "user", "nosuchuser")), tok, nil); status != 400 {
		t.Errorf("unknown user: %d %s", status, b)
	}
	if out := e.runOut(t, tok, id, "stat", "-c", "%u:%g", "bin.dat"); strings.TrimSpace(out) != "1000:1000" {
		t.Errorf("owner of a file PUT as the default user: %q", out)
	}
}

// testFileAtomic: a reader never sees a partial file while PUTs replace it.
func testFileAtomic(t *testing.T, e *env, tok string, id int64) {
	ctx := context.Background()
	a := bytes.Repeat([]byte("A"), 1<<20)
	bb := bytes.Repeat([]byte("B"), 1<<20)
	if status, _, b := e.rawDo(ctx, "PUT", filesPath(id, "", qp("path", "atomic")), tok, bytes.NewReader(a)); status != 200 {
		t.Fatalf("PUT: %d %s", status, b)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := 0; i < 6; i++ {
			body := a
			if i%2 == 0 {
				body = bb
			}
			// A slow writer: the file is incomplete for a while.
			pr, pw := io.Pipe()
			go func() {
				for off := 0; off < len(body); off += 256 << 10 {
					pw.Write(body[off : off+256<<10])
					time.Sleep(5 * time.Millisecond)
				}
				pw.Close()
			}()
			e.rawDo(ctx, "PUT", filesPath(id, "", qp("path", "atomic")), tok, pr)
		}
	}()
	reads := 0
	for {
		select {
		case <-done:
			if reads == 0 {
				t.Error("no read during the writes")
			}
			return
		default:
		}
		status, _, got := e.rawDo(ctx, "GET", filesPath(id, "", qp("path", "atomic")), tok, nil)
		reads++
		if status != 200 || len(got) != 1<<20 || !(bytes.Equal(got, a) || bytes.Equal(got, bb)) {
			t.Fatalf("read %d: %d, %d bytes: a partial or mixed file", reads, status, len(got))
		}
	}
}

// testFileWatch: create, modify, delete arrive in order.
func testFileWatch(t *testing.T, e *env, tok string, id int64) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	e.do(ctx, "POST", filesPath(id, "mkdir", nil), tok, map[string]any{"path": "w", "parents": true})
	hc := e.http
	conn, resp, err := websocket.Dial(ctx, "ws://corral"+filesPath(id, "watch", qp("path", "/workspace/w", "recursive", "1")), &websocket.DialOptions{
		HTTPClient: hc, HTTPHeader: http.Header{"Authorization": {"Bearer " + tok}},
	})
	if err != nil {
		t.Fatalf("watch: %v %v", err, resp)
	}
	defer conn.CloseNow()
	e.runOut(t, tok, id, "sh", "-c", "cd w && echo a > f && echo b >> f && mkdir d && sleep 0.2 && echo c > d/g && mv f h && rm h")
	want := []api.FileEvent{
		{Type: "create", Path: "/workspace/w/f"},
		{Type: "modify", Path: "/workspace/w/f"},
		{Type: "create", Path: "/workspace/w/d", IsDir: true},
		{Type: "create", Path: "/workspace/w/d/g"},
		{Type: "rename", From: "/workspace/w/f", Path: "/workspace/w/h"},
		{Type: "delete", Path: "/workspace/w/h"},
	}
	var got []api.FileEvent
	i := 0
	for i < len(want) {
		_, b, err := conn.Read(ctx)
		if err != nil {
			t.Fatalf("watch read after %v: %v", got, err)
		}
		var ev api.FileEvent
		json.Unmarshal(b, &ev)
		got = append(got, ev)
		if ev == want[i] {
			i++
		} else if i > 0 && ev == want[i-1] {
			continue // repeated modify
		} else if ev.Type == "modify" {
			continue
		} else {
			t.Fatalf("watch: got %v, want in order %v", got, want)
		}
	}
}

// TestFilesAuth: every files endpoint refuses anonymous callers (401) and
// non-members (403) before any provider call.
func TestFilesAuth(t *testing.T) {
	fake := &sandboxtest.Provider{}
	e := newEnv(t, envOpts{fake: fake})
	alice, _ := e.account("alice")
	_, bobTok := e.account("bob")
	p := e.hostProject("web", alice)
	ctx := context.Background()
	endpoints := []struct{ method, op string }{
		{"GET", ""}, {"PUT", ""}, {"GET", "stat"}, {"GET", "list"}, {"POST", "mkdir"}, {"POST", "remove"}, {"POST", "rename"}, {"GET", "watch"},
	}
	for _, ep := range endpoints {
		path := filesPath(p.ID, ep.op, qp("path", "x"))
		var body any
		if ep.method == "POST" {
			body = map[string]any{"path": "x", "from": "x", "to": "y"}
		}
		if status, b := e.do(ctx, ep.method, path, "", body); status != 401 {
			t.Errorf("%s %s anonymous: %d %s", ep.method, path, status, b)
		}
		if status, b := e.do(ctx, ep.method, path, bobTok, body); status != 403 {
			t.Errorf("%s %s non-member: %d %s", ep.method, path, status, b)
		}
	}
	if n := fake.Calls(); n != 0 {
		t.Errorf("the provider was called %d times", n)
	}
	if n := e.liveLeases(); n != 0 {
		t.Errorf("%d leases", n)
	}
}

// TestFilesDiskLimit: a PUT larger than the project's disk fails with a
// clear 507 and leaves nothing behind; the old file is intact.
func TestFilesDiskLimit(t *testing.T) {
	e := newManagedEnv(t)
	alice, tok := e.account("alice")
	p := e.managedProject("box", alice)
	ctx := context.Background()
	if status, b := e.do(ctx, "PUT", fmt.Sprintf("/v1/projects/%d/machine", p.ID), tok, map[string]any{"limits": map[string]any{"disk": 32 << 20}}); status != 200 {
		t.Fatalf("set disk limit: %d %s", status, b)
	}
	if status, _, b := e.rawDo(ctx, "PUT", filesPath(p.ID, "", qp("path", "/home/corral/big")), tok, strings.NewReader("old")); status != 200 {
		t.Fatalf("PUT: %d %s", status, b)
	}
	status, _, b := e.rawDo(ctx, "PUT", filesPath(p.ID, "", qp("path", "/home/corral/big")), tok, bytes.NewReader(make([]byte, 64<<20)))
	if kind, msg, _, _ := apiError(t, b); status != 507 || kind != KindNoSpace || !strings.Contains(msg, "full") {
		t.Fatalf("PUT over the disk limit: %d %s", status, b)
	}
	status, b = e.do(ctx, "GET", filesPath(p.ID, "list", qp("path", "/home/corral")), tok, nil)
	var lj api.FileList
	if json.Unmarshal(b, &lj); status != 200 {
		t.Fatalf("list: %d %s", status, b)
	}
	for _, en := range lj.Entries {
		if strings.HasPrefix(en.Name, ".corral-put-") {
			t.Errorf("temporary file left: %s", en.Name)
		}
	}
	if status, _, b := e.rawDo(ctx, "GET", filesPath(p.ID, "", qp("path", "/home/corral/big")), tok, nil); status != 200 || string(b) != "old" {
		t.Errorf("the old file after a failed PUT: %d %q", status, b)
	}
}

// TestFilesClient drives the Go client's files methods against a host
// project.
func TestFilesClient(t *testing.T) {
	requireRoot(t)
	e := newEnv(t, envOpts{})
	alice, tok := e.account("alice")
	p := e.hostProject("web", alice)
	c := e.client(tok)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	w, err := c.WatchFiles(ctx, p.ID, "/workspace", "", true)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	if _, err := c.Mkdir(ctx, p.ID, "d/e", "", 0o750, true); err != nil {
		t.Fatal(err)
	}
	fi, err := c.WriteFile(ctx, p.ID, "d/e/f", "", 0o600, strings.NewReader("hello"))
	if err != nil || fi.Size != 5 || fi.Perm() != 0o600 {
		t.Fatalf("WriteFile: %+v %v", fi, err)
	}
	body, info, err := c.ReadFile(ctx, p.ID, "/workspace/d/e/f", "")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(body)
	body.Close()
	if string(b) != "hello" || info.Size != 5 || info.Mode != "0600" {
		t.Errorf("ReadFile: %q %+v", b, info)
	}
	if err := c.RenameFile(ctx, p.ID, "d/e/f", "d/g", ""); err != nil {
		t.Fatal(err)
	}
	l, err := c.ListFiles(ctx, p.ID, "d", "", 2, 0)
	if err != nil || len(l.Entries) != 2 || l.Entries[0].Path != "/workspace/d/e" || l.Entries[1].Name != "g" {
		t.Fatalf("ListFiles: %+v %v", l, err)
	}
	if err := c.RemoveFile(ctx, p.ID, "d", "", true); err != nil {
		t.Fatal(err)
	}
	var ce *client.Error
	if _, err := c.StatFile(ctx, p.ID, "d", ""); !asClientError(err, &ce) || ce.Status != 404 {
		t.Errorf("StatFile after remove: %v", err)
	}
	if _, err := c.StatFile(ctx, p.ID, "/etc/passwd", ""); !asClientError(err, &ce) || ce.Status != 400 {
		t.Errorf("StatFile of a host path: %v", err)
	}
	// The watch saw the directory made, and the file in it (a directory
	// created after the watch began is watched too).
	seen := map[string]bool{}
	// A PUT shows as its temporary file's creation and its rename.
	for !seen["rename /workspace/d/e/f"] {
		ev, err := w.Next(ctx)
		if err != nil {
			t.Fatalf("watch after %v: %v", seen, err)
		}
		seen[ev.Type+" "+ev.Path] = true
	}
	if !seen["create /workspace/d"] || !seen["create /workspace/d/e"] {
		t.Errorf("watch: %v", seen)
	}
}
