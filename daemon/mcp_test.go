package daemon

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/corral-sandbox/corral/internal/testenv"
)

// mcpPost posts one MCP exchange to /v1/mcp as token and returns the
// status and body (status 0 when ctx ended the request).
func (e *env) mcpPost(ctx context.Context, token string, msg any) (int, []byte) {
	b, err := json.Marshal(msg)
	if err != nil {
		e.t.Error(err)
		return 0, nil
	}
	req, err := http.NewRequestWithContext(ctx, "POST", "http://corral/v1/mcp", bytes.NewReader(b))
	if err != nil {
		e.t.Error(err)
		return 0, nil
	}
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", mcpAccept["Accept"])
	resp, err := e.http.Do(req)
	if err != nil {
		return 0, nil
	}
	defer resp.Body.Close()
	var out bytes.Buffer
	_, _ = out.ReadFrom(resp.Body)
	return resp.StatusCode, out.Bytes()
}

// TestMCPRequestsBounded: an account's MCP requests in flight are bounded
// (429 busy beyond, before the body is read) while another account's are
// served; a client that goes away ends its tool call and gives its place
// back.
func TestMCPRequestsBounded(t *testing.T) {
	requireRoot(t)
	e := newEnv(t, envOpts{})
	mallory, mtok := e.account("mallory")
	_, atok := e.account("alice")
	p := e.hostProject("flood", mallory)
	sleep := map[string]any{"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": map[string]any{
		"name": "run_command", "arguments": map[string]any{"project_id": p.ID, "argv": []string{"sleep", "120"}, "timeout_seconds": 300}}}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var wg sync.WaitGroup
	for range MaxAccountMCPRequests {
		wg.Add(1)
		go func() {
			defer wg.Done()
			e.mcpPost(ctx, mtok, sleep)
		}()
	}
	testenv.WaitFor(t, 5*time.Second, "mallory's MCP requests in flight", func() bool { return e.app.mcpCalls.of(mallory.ID) == MaxAccountMCPRequests })
	testenv.WaitFor(t, 5*time.Second, "mallory's commands", func() bool { return e.liveLeases() == MaxAccountMCPRequests })
	if status, b := e.mcpPost(context.Background(), mtok, mcpCall("list_projects")); status != http.StatusTooManyRequests || !strings.Contains(string(b), `"busy"`) {
		t.Errorf("one more of mallory's: %d %s", status, b)
	}
	if status, b := e.mcpPost(context.Background(), atok, mcpCall("list_projects")); status != http.StatusOK || strings.Contains(string(b), `"isError":true`) {
		t.Errorf("alice's: %d %s", status, b)
	}
	cancel()
	wg.Wait()
	// The commands end with their requests (not after their 120 s).
	deadline := time.Now().Add(30 * time.Second)
	for e.app.mcpCalls.of(mallory.ID) != 0 || e.liveLeases() != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("after the clients left: %d requests in flight, %d leases", e.app.mcpCalls.of(mallory.ID), e.liveLeases())
		}
		time.Sleep(10 * time.Millisecond)
	}
}
