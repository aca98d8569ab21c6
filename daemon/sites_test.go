package daemon

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/corral-sandbox/corral/core"
	"github.com/corral-sandbox/corral/plugin"
	sitesplugin "github.com/corral-sandbox/corral/plugins/sites"
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

// TestSitesGatewayAbsentOrFailed: the gateway stays mounted, answering 503
// with the reason, when no plugin provides the sites domain and when the
// one that would failed to load — not only when it is disabled.
func TestSitesGatewayAbsentOrFailed(t *testing.T) {
	failing := core.Plugin(func(core.Deps) plugin.Registration {
		return plugin.Registration{
			Manifest: plugin.Manifest{Name: sitesplugin.Name, Provides: []plugin.Domain{plugin.DomainSites}},
			Register: func(*plugin.Context) error { return errors.New("sites table corrupt") },
		}
	})
	for _, tc := range []struct {
		name    string
		plugins []core.PluginFactory
		reason  string
	}{
		{"absent", []core.PluginFactory{core.SandboxPlugin}, "no owner"},
		{"failed", []core.PluginFactory{core.SandboxPlugin, failing}, "sites table corrupt"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, envOpts{plugins: tc.plugins})
			_, tok := e.account("alice")
			status, body := e.do(context.Background(), "GET", "/sites/app/", tok, nil)
			if status != http.StatusServiceUnavailable {
				t.Fatalf("%d %s", status, body)
			}
			kind, msg, _, _ := apiError(t, body)
			if kind != KindUnavailable || !strings.Contains(msg, "sites are unavailable") || !strings.Contains(msg, tc.reason) {
				t.Errorf("%s, want unavailable saying %q", body, tc.reason)
			}
		})
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
