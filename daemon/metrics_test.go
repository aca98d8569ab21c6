package daemon

import (
	"bufio"
	"bytes"
	"context"
	"strconv"
	"strings"
	"testing"
)

// metricValue scrapes /metrics and returns the value of the exact series
// (name{labels} as exposed, labels sorted), or -1 if it is absent.
func metricValue(t *testing.T, e *env, series string) float64 {
	t.Helper()
	status, body := e.do(context.Background(), "GET", "/metrics", "", nil)
	if status != 200 {
		t.Fatalf("/metrics: %d", status)
	}
	sc := bufio.NewScanner(bytes.NewReader(body))
	for sc.Scan() {
		line := sc.Text()
		if v, ok := strings.CutPrefix(line, series+" "); ok {
			f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
			if err != nil {
				t.Fatalf("metric line %q: %v", line, err)
			}
			return f
		}
	}
	return -1
}

func TestMetricsMove(t *testing.T) {
	requireRoot(t)
	e := newEnv(t, envOpts{})
	alice, tok := e.account("alice")
	p := e.hostProject("web", alice)
	if v := metricValue(t, e, `corral_commands_total{outcome="exit"}`); v > 0 {
		t.Fatalf("commands counted before any ran: %v", v)
	}
	for range 2 {
		if status, body := e.do(context.Background(), "POST", commandsPath(p.ID), tok, cmdBody("printf", "12345")); status != 200 {
			t.Fatalf("%d %s", status, body)
		}
	}
	e.do(context.Background(), "POST", commandsPath(p.ID), tok, map[string]any{"command": map[string]any{"type": "argv", "file": "sleep", "args": []string{"5"}}, "timeoutMs": 50})
	checks := map[string]float64{
		`corral_commands_total{outcome="exit"}`:                                          2,
		`corral_commands_total{outcome="timeout"}`:                                       1,
		`corral_command_output_bytes_total{stream="stdout"}`:                             10,
		`corral_command_duration_seconds_count{outcome="exit"}`:                          2,
		`corral_live_leases`:                                                             0,
		`corral_worker_connected`:                                                        -1,
		`corral_sessions_active`:                                                         0,
		`corral_http_requests_total{code="200",route="POST /v1/projects/{id}/commands"}`: 2,
		`corral_http_requests_total{code="504",route="POST /v1/projects/{id}/commands"}`: 1,
	}
	for series, want := range checks {
		if got := metricValue(t, e, series); got != want {
			t.Errorf("%s = %v, want %v", series, got, want)
		}
	}
}

func TestHealthz(t *testing.T) {
	e := newEnv(t, envOpts{})
	status, body := e.do(context.Background(), "GET", "/healthz", "", nil)
	if status != 200 || !strings.Contains(string(body), `"status":"ok"`) || !strings.Contains(string(body), `"worker":"none"`) {
		t.Fatalf("%d %s", status, body)
	}
}
