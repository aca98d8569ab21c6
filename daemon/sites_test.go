package daemon

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
)

// TestSitesGatewayUnavailable: the gateway stays mounted when the sites
// plugin is disabled and answers 503 with the reason.
func TestSitesGatewayUnavailable(t *testing.T) {
	e := newEnv(t, envOpts{disabled: []string{"sites"}})
	alice, tok := e.account("alice")
	box := e.managedProject("box", alice)
	ctx := context.Background()
	for _, path := range []string{"/sites/app/", "/sites/app/index.html?x=1"} {
		status, body := e.do(ctx, "GET", path, tok, nil)
		if status != http.StatusServiceUnavailable {
			t.Fatalf("%s: %d %s", path, status, body)
		}
		kind, msg, _, _ := apiError(t, body)
		if kind != KindUnavailable || !strings.Contains(msg, "sites are unavailable") || !strings.Contains(msg, "disabled") {
			t.Errorf("%s: %s", path, body)
		}
	}
	status, body := e.do(ctx, "PUT", fmt.Sprintf("/v1/projects/%d/sites/app", box.ID), tok, map[string]int{"port": 8000})
	if status != http.StatusServiceUnavailable {
		t.Errorf("publish without the plugin: %d %s", status, body)
	}
}

// TestSitesWithoutTransport: a published site of a daemon without a
// privileged transport answers 503 "no privileged transport in this
// process"; tenancy is still checked first.
func TestSitesWithoutTransport(t *testing.T) {
	e := newEnv(t, envOpts{})
	alice, tok := e.account("alice")
	_, stranger := e.account("mallory")
	box := e.managedProject("box", alice)
	host := e.hostProject("web", alice)
	ctx := context.Background()

	if status, body := e.do(ctx, "PUT", fmt.Sprintf("/v1/projects/%d/sites/app", box.ID), tok, map[string]int{"port": 8000}); status != 200 {
		t.Fatalf("publish: %d %s", status, body)
	}
	for _, tc := range []struct {
		name, method, path, token string
		body                      any
		status                    int
		kind                      string
	}{
		{"publish by a stranger", "PUT", fmt.Sprintf("/v1/projects/%d/sites/other", box.ID), stranger, map[string]int{"port": 1}, 403, KindForbidden},
		{"publish a host project", "PUT", fmt.Sprintf("/v1/projects/%d/sites/other", host.ID), tok, map[string]int{"port": 1}, 400, KindInvalid},
		{"bad name", "PUT", fmt.Sprintf("/v1/projects/%d/sites/Bad_Name", box.ID), tok, map[string]int{"port": 1}, 400, KindInvalid},
		{"bad port", "PUT", fmt.Sprintf("/v1/projects/%d/sites/other", box.ID), tok, map[string]int{"port": 70000}, 400, KindInvalid},
		{"anonymous visit", "GET", "/sites/app/", "", nil, 401, KindUnauthorized},
		{"stranger visit", "GET", "/sites/app/", stranger, nil, 403, KindForbidden},
		{"unknown site", "GET", "/sites/nope/", tok, nil, 404, KindNotFound},
		{"member visit", "GET", "/sites/app/x?y=1", tok, nil, 503, KindUnavailable},
		{"member post", "POST", "/sites/app/form", tok, "a=b", 503, KindUnavailable},
	} {
		status, body := e.do(ctx, tc.method, tc.path, tc.token, tc.body)
		if status != tc.status {
			t.Errorf("%s: %d %s", tc.name, status, body)
			continue
		}
		kind, msg, _, _ := apiError(t, body)
		if kind != tc.kind {
			t.Errorf("%s: kind %q", tc.name, kind)
		}
		if tc.status == 503 && msg != "no privileged transport in this process" {
			t.Errorf("%s: message %q", tc.name, msg)
		}
	}
	status, body := e.do(ctx, "GET", fmt.Sprintf("/v1/projects/%d/sites", box.ID), tok, nil)
	if status != 200 || !strings.Contains(string(body), `"name":"app"`) || !strings.Contains(string(body), `"port":8000`) {
		t.Errorf("list: %d %s", status, body)
	}
	if status, body := e.do(ctx, "DELETE", fmt.Sprintf("/v1/projects/%d/sites/app", box.ID), tok, nil); status != 204 {
		t.Errorf("unpublish: %d %s", status, body)
	}
	if status, _ := e.do(ctx, "GET", "/sites/app/", tok, nil); status != 404 {
		t.Errorf("visit after unpublish: %d", status)
	}
}
