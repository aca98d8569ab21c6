package daemon

import (
	"bytes"
	"context"
	"encoding/json"
	"regexp"
	"strings"
	"testing"

	"github.com/corral-sandbox/corral/docs"
)

// anyMethod are the methods the document lists for a route that accepts
// every method.
var anyMethod = []string{"get", "head", "post", "put", "patch", "delete", "options"}

// TestOpenAPIMatchesRoutes checks the embedded OpenAPI document against the
// routes the app registers: the same paths and methods, and security
// exactly where a bearer token is needed; every $ref resolves.
func TestOpenAPIMatchesRoutes(t *testing.T) {
	e := newEnv(t, envOpts{})
	var doc struct {
		Paths      map[string]map[string]json.RawMessage `json:"paths"`
		Components struct {
			Schemas map[string]json.RawMessage `json:"schemas"`
		} `json:"components"`
	}
	if err := json.Unmarshal(docs.OpenAPI, &doc); err != nil {
		t.Fatalf("openapi.json: %v", err)
	}
	documented := map[string]bool{}
	for path, ops := range doc.Paths {
		for method, raw := range ops {
			var op struct {
				Security *[]any `json:"security"`
			}
			if err := json.Unmarshal(raw, &op); err != nil {
				t.Fatalf("%s %s: %v", method, path, err)
			}
			// An explicit empty security list marks a public operation.
			public := op.Security != nil && len(*op.Security) == 0
			documented[method+" "+path] = public
		}
	}
	registered := map[string]bool{}
	// Besides the route table, the app's mux serves the public redirect
	// /sites/{name} → /sites/{name}/ (and a 404 for everything else).
	routes := append(e.app.Routes(), Route{Pattern: "/sites/{name}"})
	for _, rt := range routes {
		path := strings.ReplaceAll(rt.Pattern, "...}", "}")
		methods := []string{strings.ToLower(rt.Method)}
		if rt.Method == "" {
			methods = anyMethod
		}
		for _, m := range methods {
			registered[m+" "+path] = !rt.Auth
		}
	}
	for k, public := range registered {
		dpublic, ok := documented[k]
		switch {
		case !ok:
			t.Errorf("route %s is not documented", k)
		case dpublic != public:
			t.Errorf("route %s: documented public=%v, registered public=%v", k, dpublic, public)
		}
	}
	for k := range documented {
		if _, ok := registered[k]; !ok {
			t.Errorf("documented %s is not a route", k)
		}
	}
	for _, m := range regexp.MustCompile(`"\$ref": "#/components/schemas/([A-Za-z]+)"`).FindAllSubmatch(docs.OpenAPI, -1) {
		if _, ok := doc.Components.Schemas[string(m[1])]; !ok {
			t.Errorf("dangling $ref %s", m[1])
		}
	}
	// The pinned command statuses are all documented.
	var cmdOp struct {
		Responses map[string]any `json:"responses"`
	}
	_ = json.Unmarshal(doc.Paths["/v1/projects/{id}/commands"]["post"], &cmdOp)
	for _, s := range []string{"200", "400", "401", "403", "404", "413", "422", "499", "500", "502", "503", "504"} {
		if _, ok := cmdOp.Responses[s]; !ok {
			t.Errorf("commands: status %s is not documented", s)
		}
	}
	status, body := e.do(context.Background(), "GET", "/openapi.json", "", nil)
	if status != 200 || !bytes.Equal(body, docs.OpenAPI) {
		t.Errorf("GET /openapi.json: %d, %d bytes", status, len(body))
	}
}
