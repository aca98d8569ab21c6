package suites

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/corral-sandbox/corral/client"
	"github.com/corral-sandbox/corral/internal/testworker"
	"github.com/corral-sandbox/corral/sandbox"
	"github.com/corral-sandbox/corral/worker"
)

// post sends a raw body to the commands endpoint of project id.
func (s *stack) post(t *testing.T, id int64, body []byte) (int, map[string]any) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, s.client.URL(fmt.Sprintf("/v1/projects/%d/commands", id)), bytes.NewReader(body))
	must(t, err)
	req.Header = s.client.Header()
	req.Header.Set("Content-Type", "application/json")
	resp, err := s.client.HTTPClient().Do(req)
	must(t, err)
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	var out map[string]any
	if err := json.Unmarshal(raw, &out); err != nil {
		t.Fatalf("status %d: body is not JSON: %q", resp.StatusCode, raw)
	}
	return resp.StatusCode, out
}

// TestHostileAPIInput sends a corpus of malformed and hostile requests:
// every one is answered with a clear JSON error and its status, nothing
// runs, and the daemon keeps serving.
func TestHostileAPIInput(t *testing.T) {
	s := newStack(t, 1, testworker.Options{})
	id := s.projects[0].ID
	huge := strings.Repeat("a", 2<<20)
	manyArgs := make([]string, 200000)
	for i := range manyArgs {
		manyArgs[i] = "x"
	}
	manyJSON, _ := json.Marshal(map[string]any{"command": map[string]any{"type": "argv", "file": "true", "args": manyArgs}})
	cases := []struct {
		name   string
		body   string
		status int
	}{
		{"empty", ``, 400},
		{"notJSON", `{{{`, 400},
		{"array", `[1,2]`, 400},
		{"trailing", `{"command":{"type":"argv","file":"true"}} {}`, 400},
		{"unknownField", `{"command":{"type":"argv","file":"true"},"sudo":true}`, 400},
		{"noCommand", `{}`, 400},
		{"shellType", `{"command":{"type":"shell","file":"true"}}`, 400},
		{"emptyFile", `{"command":{"type":"argv","file":""}}`, 400},
		{"nulFile", `{"command":{"type":"argv","file":"tr\u0000ue"}}`, 400},
		{"nulArg", `{"command":{"type":"argv","file":"echo","args":["a\u0000b"]}}`, 400},
		{"nulCwd", `{"command":{"type":"argv","file":"true"},"cwd":"/workspace/\u0000"}`, 400},
		{"escapingCwd", `{"command":{"type":"argv","file":"true"},"cwd":"/workspace/../../etc"}`, 400},
		{"outsideCwd", `{"command":{"type":"argv","file":"true"},"cwd":"/etc"}`, 400},
		{"badLeaseKind", `{"command":{"type":"argv","file":"true"},"leaseKind":"root"}`, 400},
		{"negativeTimeout", `{"command":{"type":"argv","file":"true"},"timeoutMs":-5}`, 400},
		{"negativeLimit", `{"command":{"type":"argv","file":"true"},"outputLimit":{"stdout":-1}}`, 400},
		{"bothLimits", `{"command":{"type":"argv","file":"true"},"outputLimit":{"stdout":10,"combined":10}}`, 400},
		{"hugeLimit", `{"command":{"type":"argv","file":"true"},"outputLimit":{"combined":1099511627776}}`, 400},
		{"wrongTypes", `{"command":{"type":"argv","file":1}}`, 400},
		{"oversizedBody", `{"command":{"type":"argv","file":"echo","args":["` + huge + `"]}}`, 413},
		{"hugeArgv", string(manyJSON), 400},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			status, body := s.post(t, id, []byte(tc.body))
			if status != tc.status {
				t.Fatalf("status %d, want %d: %v", status, tc.status, body)
			}
			e, ok := body["error"].(map[string]any)
			if !ok || e["kind"] == "" || e["message"] == "" {
				t.Fatalf("no clear error body: %v", body)
			}
		})
	}
	// Unknown and malformed project ids.
	for _, path := range []string{"/v1/projects/999999/commands", "/v1/projects/abc/commands", "/v1/projects/-1/commands"} {
		req, _ := http.NewRequest(http.MethodPost, s.client.URL(path), strings.NewReader(`{"command":{"type":"argv","file":"true"}}`))
		req.Header = s.client.Header()
		resp, err := s.client.HTTPClient().Do(req)
		must(t, err)
		resp.Body.Close()
		if resp.StatusCode != 403 && resp.StatusCode != 400 {
			t.Errorf("%s: status %d", path, resp.StatusCode)
		}
	}
	// Still serving, and nothing leaked.
	res, err := s.client.RunCommand(context.Background(), id, client.CommandRequest{Command: argv("echo", "alive")})
	if err != nil || res.Stdout != "alive\n" {
		t.Fatalf("after the corpus: %+v %v", res, err)
	}
	if n, _ := s.core.Leases().LiveCount(context.Background()); n != 0 {
		t.Errorf("%d live leases after refusals", n)
	}
}

// TestHostileWorkloads: floods, fork bombs, memory hogs and grandchildren
// holding the output open are contained and answered clearly, and the
// machine serves the next command.
func TestHostileWorkloads(t *testing.T) {
	s := newStack(t, 1, testworker.Options{Limits: worker.Limits{Memory: 128 << 20, Pids: 64}})
	id := s.projects[0].ID
	ctx := context.Background()
	run := func(req client.CommandRequest) (*sandbox.CommandResult, error) {
		if req.TimeoutMs == 0 {
			req.TimeoutMs = 20000
		}
		return s.client.RunCommand(ctx, id, req)
	}

	t.Run("OutputFlood", func(t *testing.T) {
		_, err := run(client.CommandRequest{Command: argv("cat", "/dev/zero"), OutputLimit: sandbox.OutputLimit{Stdout: 1 << 20}})
		if apiKind(err) != "overflow" {
			t.Fatalf("flood: %v", err)
		}
	})
	t.Run("ForkBomb", func(t *testing.T) {
		start := time.Now()
		_, err := run(client.CommandRequest{Command: argv("sh", "-c", "b() { b | b & }; b; sleep 2"), TimeoutMs: 5000})
		// Whatever the bomb's own fate, the call settles within its timeout.
		if time.Since(start) > 15*time.Second {
			t.Fatalf("fork bomb call took %v (%v)", time.Since(start), err)
		}
	})
	t.Run("MemoryHog", func(t *testing.T) {
		res, err := run(client.CommandRequest{Command: argv("sh", "-c", `x=a; while :; do x="$x$x"; done`), TimeoutMs: 15000})
		if err != nil {
			t.Fatalf("memory hog: %v (want a signal result)", err)
		}
		if res.Code != nil || res.Signal != "SIGKILL" {
			t.Fatalf("memory hog: code %v signal %q, want SIGKILL and no code", res.Code, res.Signal)
		}
	})
	t.Run("GrandchildHoldsPipe", func(t *testing.T) {
		start := time.Now()
		res, err := run(client.CommandRequest{Command: argv("sh", "-c", "setsid sleep 300 & echo parent-done")})
		if err != nil || res.Stdout != "parent-done\n" {
			t.Fatalf("%+v %v", res, err)
		}
		if time.Since(start) > 10*time.Second {
			t.Fatalf("took %v", time.Since(start))
		}
	})
	res, err := run(client.CommandRequest{Command: argv("echo", "still-fine")})
	if err != nil || res.Stdout != "still-fine\n" {
		t.Fatalf("after the hostile workloads: %+v %v", res, err)
	}
}
