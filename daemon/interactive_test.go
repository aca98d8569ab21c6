package daemon

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"

	"io"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/corral-sandbox/corral/api"
	"github.com/corral-sandbox/corral/client"
	"github.com/corral-sandbox/corral/internal/testenv"
	"github.com/corral-sandbox/corral/sandbox"
	"github.com/corral-sandbox/corral/sandbox/sandboxtest"
)

// TestCommandEnvRefusedBeforeProvider: a bad name, a NUL in a value or an
// oversized environment is a 400 "prepare" before any provider call.
func TestCommandEnvRefusedBeforeProvider(t *testing.T) {
	fake := &sandboxtest.Provider{Dir: t.TempDir()}
	e := newEnv(t, envOpts{fake: fake})
	alice, tok := e.account("alice")
	p := e.hostProject("web", alice)
	for _, env := range []map[string]string{
		{"1BAD": "x"}, {"A=B": "x"}, {"A B": "x"}, {"": "x"}, {"A": "x\x00y"},
		{"BIG": strings.Repeat("x", sandbox.MaxEnvBytes)},
	} {
		body := cmdBody("true")
		body["env"] = env
		status, b := e.do(context.Background(), "POST", commandsPath(p.ID), tok, body)
		if kind, _, _, _ := apiError(t, b); status != 400 || kind != string(sandbox.KindPrepare) {
			t.Errorf("env %q: %d %s", env, status, b)
		}
	}
	if n := fake.Calls(); n != 0 {
		t.Fatalf("the provider was contacted %d times for refused environments", n)
	}
}

// TestCommandEnvStdinEncodingHost runs the new request fields through a
// real daemon and a real (confined) host project.
func TestCommandEnvStdinEncodingHost(t *testing.T) {
	e := newEnv(t, envOpts{app: AppOptions{MaxStdin: 12 << 20}})
	alice, tok := e.account("alice")
	p := e.hostProject("web", alice)
	testEnvStdinEncoding(t, e, tok, p.ID)

	ctx := context.Background()
	// The dynamic loader's variables are refused for confined commands.
	body := cmdBody("true")
	body["env"] = map[string]string{"LD_PRELOAD": "/tmp/evil.so"}
	status, b := e.do(ctx, "POST", commandsPath(p.ID), tok, body)
	if kind, _, _, _ := apiError(t, b); status != 400 || kind != string(sandbox.KindPrepare) {
		t.Errorf("LD_PRELOAD: %d %s", status, b)
	}
	// Input over MaxStdin: 413, nothing run.
	body = cmdBody("cat")
	body["stdin"] = base64.StdEncoding.EncodeToString(make([]byte, 12<<20+1))
	status, b = e.do(ctx, "POST", commandsPath(p.ID), tok, body)
	if kind, _, _, _ := apiError(t, b); status != 413 || kind != KindRequestTooLarge {
		t.Errorf("stdin over the limit: %d %.200s", status, b)
	}
	body = cmdBody("cat")
	body["stdin"] = "not base64!"
	status, b = e.do(ctx, "POST", commandsPath(p.ID), tok, body)
	if kind, _, _, _ := apiError(t, b); status != 400 || kind != KindInvalid {
		t.Errorf("bad base64: %d %s", status, b)
	}
	body = cmdBody("true")
	body["encoding"] = "utf-16"
	status, b = e.do(ctx, "POST", commandsPath(p.ID), tok, body)
	if kind, _, _, _ := apiError(t, b); status != 400 || kind != KindInvalid {
		t.Errorf("bad encoding: %d %s", status, b)
	}
	// The pinned body of a request without the new fields, byte for byte.
	status, b = e.do(ctx, "POST", commandsPath(p.ID), tok, cmdBody("printf", "x\\n"))
	if want := `{"stdout":"x\n","stderr":"","code":0,"signal":null}` + "\n"; status != 200 || string(b) != want {
		t.Errorf("pinned result: %d %q, want %q", status, b, want)
	}
}

// TestCommandEnvStdinEncodingManaged is the same in a real machine.
func TestCommandEnvStdinEncodingManaged(t *testing.T) {
	e := newManagedEnv(t)
	alice, tok := e.account("alice")
	p := e.managedProject("box", alice)
	testEnvStdinEncoding(t, e, tok, p.ID)
}

func testEnvStdinEncoding(t *testing.T, e *env, tok string, id int64) {
	ctx := context.Background()
	c := e.client(tok)
	res, err := c.RunCommand(ctx, id, client.CommandRequest{
		Command: sandbox.Command{Type: "argv", File: "sh", Args: []string{"-c", `printf '%s|%s' "$GREETING" "$HOME"`}},
		Env:     map[string]string{"GREETING": "hello world", "HOME": "/elsewhere"},
	})
	if err != nil || res.Stdout != "hello world|/elsewhere" {
		t.Fatalf("env: %+v %v", res, err)
	}

	// 10 MiB of input, hashed inside.
	data := make([]byte, 10<<20)
	for i := range data {
		data[i] = byte(i*7 + i>>11)
	}
	sum := sha256.Sum256(data)
	res, err = c.RunCommand(ctx, id, client.CommandRequest{
		Command: sandbox.Command{Type: "argv", File: "sha256sum"}, Stdin: data, TimeoutMs: 30000,
	})
	if err != nil {
		t.Fatal(err)
	}
	if got, _, _ := strings.Cut(res.Stdout, " "); got != hex.EncodeToString(sum[:]) {
		t.Fatalf("sha256 inside %q, want %x", res.Stdout, sum)
	}

	// Binary output, exact: in the raw body, through the client, and in
	// an error's partial output.
	body := cmdBody("printf", `\377\376`)
	body["encoding"] = "base64"
	status, b := e.do(ctx, "POST", commandsPath(id), tok, body)
	if want := `{"stdout":"//4=","stderr":"","code":0,"signal":null}` + "\n"; status != 200 || string(b) != want {
		t.Errorf("base64 result: %d %q, want %q", status, b, want)
	}
	res, err = c.RunCommand(ctx, id, client.CommandRequest{
		Command: sandbox.Command{Type: "argv", File: "printf", Args: []string{`\377\376\000`}}, Encoding: client.EncodingBase64,
	})
	if err != nil || res.Stdout != "\xff\xfe\x00" {
		t.Fatalf("client base64: %+v %v", res, err)
	}
	_, err = c.RunCommand(ctx, id, client.CommandRequest{
		Command:  sandbox.Command{Type: "argv", File: "sh", Args: []string{"-c", `printf '\377'; exec sleep 10`}},
		Encoding: client.EncodingBase64, TimeoutMs: 500,
	})
	var ae *client.Error
	if !asClientError(err, &ae) || ae.Kind != string(sandbox.KindTimeout) || ae.Stdout != "\xff" {
		t.Fatalf("base64 partial output: %v (%+v)", err, ae)
	}
}

func asClientError(err error, target **client.Error) bool {
	e, ok := err.(*client.Error)
	if ok {
		*target = e
	}
	return ok
}

// ndjsonLine is one line of a streamed answer and when it arrived.
type ndjsonLine struct {
	at   time.Time
	raw  string
	body map[string]json.RawMessage
}

// streamCommand posts body asking for NDJSON and reads the answer line by
// line as it arrives.
func streamCommand(t *testing.T, e *env, tok string, id int64, body any) (status int, ctype string, sent time.Time, lines []ndjsonLine) {
	t.Helper()
	data, _ := json.Marshal(body)
	req, err := http.NewRequest("POST", "http://corral"+commandsPath(id), bytes.NewReader(data))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+tok)
	req.Header.Set("Accept", "application/x-ndjson")
	sent = time.Now()
	resp, err := e.http.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	br := bufio.NewReader(resp.Body)
	for {
		line, err := br.ReadString('\n')
		if line != "" {
			l := ndjsonLine{at: time.Now(), raw: line}
			if jerr := json.Unmarshal([]byte(line), &l.body); jerr != nil {
				t.Fatalf("line %q is not JSON: %v", line, jerr)
			}
			lines = append(lines, l)
		}
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	return resp.StatusCode, resp.Header.Get("Content-Type"), sent, lines
}

// TestCommandNDJSONHost streams a real host command's output.
func TestCommandNDJSONHost(t *testing.T) {
	e := newEnv(t, envOpts{})
	alice, tok := e.account("alice")
	p := e.hostProject("web", alice)
	testNDJSON(t, e, tok, p.ID)
}

// TestCommandNDJSONManaged streams a real machine's output.
func TestCommandNDJSONManaged(t *testing.T) {
	e := newManagedEnv(t)
	alice, tok := e.account("alice")
	p := e.managedProject("box", alice)
	testNDJSON(t, e, tok, p.ID)
}

func testNDJSON(t *testing.T, e *env, tok string, id int64) {
	// The first chunk's latency: from the request to the "a" chunk.
	_, _, sent, lines := streamCommand(t, e, tok, id, cmdBody("sh", "-c", "echo a; sleep 1"))
	if len(lines) != 2 || lines[0].raw != `{"stdout":"a\n"}`+"\n" {
		t.Fatalf("lines %v", lines)
	}
	var ds []time.Duration
	for i := 0; i < 7; i++ {
		ds = append(ds, firstChunkLatency(t, e, tok, id))
	}
	slices.Sort(ds)
	t.Logf("first NDJSON chunk: %v, then median %v of 7 (min %v, max %v)", lines[0].at.Sub(sent), ds[3], ds[0], ds[6])
	testenv.WaitFor(t, 5*time.Second, "the aborted commands' leases", func() bool { return e.liveLeases() == 0 })

	status, ctype, _, lines := streamCommand(t, e, tok, id, cmdBody("sh", "-c", "echo a; sleep 1; echo b; echo c >&2"))
	if status != 200 || ctype != api.MediaNDJSON {
		t.Fatalf("status %d, content type %q", status, ctype)
	}
	var out, errs strings.Builder
	var aAt, bAt time.Time
	for _, l := range lines[:len(lines)-1] {
		if len(l.body) != 1 {
			t.Fatalf("chunk line %q has more than one field", l.raw)
		}
		var s string
		if raw, ok := l.body["stdout"]; ok {
			_ = json.Unmarshal(raw, &s)
			out.WriteString(s)
		} else if raw, ok := l.body["stderr"]; ok {
			_ = json.Unmarshal(raw, &s)
			errs.WriteString(s)
		} else {
			t.Fatalf("chunk line %q", l.raw)
		}
		if strings.Contains(out.String(), "a") && aAt.IsZero() {
			aAt = l.at
		}
		if strings.Contains(out.String(), "b") && bAt.IsZero() {
			bAt = l.at
		}
	}
	if out.String() != "a\nb\n" || errs.String() != "c\n" {
		t.Fatalf("chunks: stdout %q stderr %q", out.String(), errs.String())
	}
	if d := bAt.Sub(aAt); d < 900*time.Millisecond {
		t.Fatalf("a and b arrived %v apart: output is not streamed", d)
	}
	last := lines[len(lines)-1]
	if want := `{"stdout":"a\nb\n","stderr":"c\n","code":0,"signal":null}` + "\n"; last.raw != want {
		t.Fatalf("last line %q, want the pinned result %q", last.raw, want)
	}

	// A failure after the start is the last line, under 200.
	status, _, _, lines = streamCommand(t, e, tok, id, withTimeout(cmdBody("sh", "-c", "echo partial; exec sleep 10"), 500))
	last = lines[len(lines)-1]
	if status != 200 || lines[0].raw != `{"stdout":"partial\n"}`+"\n" ||
		last.raw != `{"error":{"kind":"timeout","message":"command timed out after 500ms","stdout":"partial\n","stderr":""}}`+"\n" {
		t.Fatalf("timeout: %d %v", status, lines)
	}

	// A refusal before the start is the ordinary answer.
	body := cmdBody("true")
	body["env"] = map[string]string{"9": "x"}
	status, ctype, _, lines = streamCommand(t, e, tok, id, body)
	if status != 400 || !strings.HasPrefix(ctype, "application/json") || len(lines) != 1 {
		t.Fatalf("refusal: %d %q %v", status, ctype, lines)
	}

	// Binary chunks.
	body = cmdBody("printf", `\377\376`)
	body["encoding"] = "base64"
	_, _, _, lines = streamCommand(t, e, tok, id, body)
	if len(lines) != 2 || lines[0].raw != `{"stdout":"//4="}`+"\n" || lines[1].raw != `{"stdout":"//4=","stderr":"","code":0,"signal":null}`+"\n" {
		t.Fatalf("base64 chunks %v", lines)
	}

	// The Go client: callbacks in order, the same result.
	c := e.client(tok)
	var got []string
	res, err := c.StreamCommand(context.Background(), id, client.CommandRequest{
		Command: sandbox.Command{Type: "argv", File: "sh", Args: []string{"-c", "echo one; sleep 0.2; echo two"}},
	}, func(p []byte) { got = append(got, string(p)) }, nil)
	if err != nil || res.Stdout != "one\ntwo\n" || strings.Join(got, "") != "one\ntwo\n" || len(got) < 2 {
		t.Fatalf("client stream: %+v %v, chunks %q", res, err, got)
	}
	_, err = c.StreamCommand(context.Background(), id, client.CommandRequest{
		Command:   sandbox.Command{Type: "argv", File: "sh", Args: []string{"-c", "echo x; exec sleep 10"}},
		TimeoutMs: 300,
	}, func([]byte) {}, nil)
	var ae *client.Error
	if !asClientError(err, &ae) || ae.Kind != string(sandbox.KindTimeout) || ae.Status != 200 || ae.Stdout != "x\n" {
		t.Fatalf("client stream timeout: %v", err)
	}
	if n := e.liveLeases(); n != 0 {
		t.Fatalf("%d live leases after the streamed commands", n)
	}
}

// TestNDJSONSplitsNoCharacter: a multi-byte character written in two
// pieces arrives whole in one text chunk.
func TestNDJSONSplitsNoCharacter(t *testing.T) {
	e := newEnv(t, envOpts{})
	alice, tok := e.account("alice")
	p := e.hostProject("web", alice)
	_, _, _, lines := streamCommand(t, e, tok, p.ID, cmdBody("sh", "-c", `printf '\303'; sleep 0.3; printf '\251\n'`))
	var joined strings.Builder
	for _, l := range lines[:len(lines)-1] {
		var s string
		_ = json.Unmarshal(l.body["stdout"], &s)
		joined.WriteString(s)
	}
	if joined.String() != "é\n" {
		t.Fatalf("chunks %v", lines)
	}
}

func withTimeout(b map[string]any, ms int) map[string]any { b["timeoutMs"] = ms; return b }

func (l ndjsonLine) String() string { return l.raw }

// firstChunkLatency sends a streamed sh -c 'echo a; sleep 1', returns the
// time to its first line, and closes the request (which aborts the
// command).
func firstChunkLatency(t *testing.T, e *env, tok string, id int64) time.Duration {
	t.Helper()
	data, _ := json.Marshal(cmdBody("sh", "-c", "echo a; sleep 1"))
	req, err := http.NewRequest("POST", "http://corral"+commandsPath(id), bytes.NewReader(data))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+tok)
	req.Header.Set("Accept", "application/x-ndjson")
	sent := time.Now()
	resp, err := e.http.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	line, err := bufio.NewReader(resp.Body).ReadString('\n')
	d := time.Since(sent)
	if err != nil || line != `{"stdout":"a\n"}`+"\n" {
		t.Fatalf("first line %q: %v", line, err)
	}
	return d
}
