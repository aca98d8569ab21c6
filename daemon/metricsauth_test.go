package daemon

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/corral-sandbox/corral/sandbox"
	"github.com/corral-sandbox/corral/sandbox/sandboxtest"
)

func get(t *testing.T, c *http.Client, url, token string) (int, string) {
	t.Helper()
	req, _ := http.NewRequest("GET", url, nil)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// TestMetricsBehindToken: on TCP, /metrics answers only an
// administrator's token; on the Unix socket it stays open.
func TestMetricsBehindToken(t *testing.T) {
	fake := &sandboxtest.Provider{Dir: t.TempDir(), Kind: sandbox.ProjectManaged}
	e := newEnv(t, envOpts{fake: fake, app: AppOptions{Admins: []string{"root"}}})
	_, admin := e.account("root")
	_, user := e.account("alice")
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- Serve(ctx, e.app, []net.Listener{ln}, testLogger(t)) }()
	defer func() { cancel(); <-done }()
	url := "http://" + ln.Addr().String() + "/metrics"
	for _, tc := range []struct {
		token  string
		status int
	}{{"", 401}, {"corral_forged", 401}, {user, 403}, {admin, 200}} {
		if status, body := get(t, http.DefaultClient, url, tc.token); status != tc.status || (status == 200) != strings.Contains(body, "corral_") {
			t.Errorf("TCP /metrics with %q: %d, want %d", tc.token, status, tc.status)
		}
	}
	if status, body := get(t, e.http, "http://corral/metrics", ""); status != 200 || !strings.Contains(body, "corral_sessions_active") {
		t.Errorf("socket /metrics: %d", status)
	}
}

// TestRunMetricsListen: --metrics-listen serves /metrics alone, without a
// token; the API is not there.
func TestRunMetricsListen(t *testing.T) {
	state, err := os.MkdirTemp("", "cm")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(state)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	ctx, cancel := context.WithCancel(context.Background())
	ready := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		done <- Run(ctx, Config{StateDir: state, MetricsListen: addr, Logger: testLogger(t), Ready: func(string) { close(ready) }})
	}()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	}()
	select {
	case <-ready:
	case err := <-done:
		t.Fatalf("Run: %v", err)
	case <-time.After(20 * time.Second):
		t.Fatal("daemon did not start")
	}
	if _, err := os.Stat(filepath.Join(state, "corral.sock")); err != nil {
		t.Fatal(err)
	}
	if status, body := get(t, http.DefaultClient, fmt.Sprintf("http://%s/metrics", addr), ""); status != 200 || !strings.Contains(body, "corral_") {
		t.Errorf("metrics listener: %d", status)
	}
	if status, _ := get(t, http.DefaultClient, fmt.Sprintf("http://%s/v1/whoami", addr), ""); status != 404 {
		t.Errorf("API on the metrics listener: %d", status)
	}
}
