package daemon

import (
	"encoding/json"
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"reflect"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/corral-sandbox/corral/api"
	"github.com/corral-sandbox/corral/docs"
)

// apiSchemas names the Go type of package api that each schema of the
// OpenAPI document is, and of each object a schema holds inline
// ("Schema.property"). A value is a sample of the type: for a type that
// writes its own JSON (MarshalJSON), a sample in which every optional
// member is present.
var apiSchemas = map[string]any{
	"ErrorBody":                api.ErrorBody{Kind: "start", Reason: string(api.ReasonNotFound)},
	"LeaseKind":                api.LeaseKind(""),
	"Command":                  api.Command{},
	"OutputLimit":              api.OutputLimit{},
	"CommandRequest":           api.CommandRequest{},
	"CommandResult":            api.CommandResult{Signal: "SIGKILL", OOMKilled: true},
	"OutputChunk":              api.OutputChunk{},
	"Account":                  api.Account{},
	"AccountRequest":           api.AccountRequest{},
	"TokenRequest":             api.TokenRequest{},
	"Token":                    api.Token{},
	"Project":                  api.Project{},
	"Machine":                  api.Machine{},
	"Machine.limits":           api.Limits{},
	"ProjectRequest":           api.ProjectRequest{},
	"Member":                   api.Member{},
	"MemberRequest":            api.MemberRequest{},
	"Site":                     api.Site{},
	"SiteRequest":              api.SiteRequest{},
	"SiteURLRequest":           api.SiteURLRequest{},
	"SiteURL":                  api.SiteURL{},
	"ExportRequest":            api.ExportRequest{},
	"ExportResult":             api.ExportResult{},
	"EgressPolicy":             api.EgressPolicy{},
	"EgressLogEntry":           api.EgressLogEntry{},
	"File":                     api.File{},
	"FileList":                 api.FileList{},
	"FileMkdirRequest":         api.FileMkdirRequest{},
	"FileRemoveRequest":        api.FileRemoveRequest{},
	"FileRenameRequest":        api.FileRenameRequest{},
	"FileEvent":                api.FileEvent{},
	"ProcessRequest":           api.ProcessRequest{},
	"ProcessRequest.tty":       api.TTYSize{},
	"Process":                  api.Process{},
	"Process.output":           api.ProcessOutput{},
	"Process.exit":             api.ProcessExit{},
	"Process.error":            api.ProcessError{},
	"SignalRequest":            api.SignalRequest{},
	"ProcessOutputChunk":       api.ProcessOutputChunk{},
	"ProcessOutputEnd":         api.ProcessOutputEnd{},
	"GitStatus":                api.GitStatus{},
	"GitStatus.branch":         api.GitBranch{},
	"GitStatus.entries":        api.GitEntry{},
	"GitStatus.entries.stages": api.GitStage{},
	"GitLog":                   api.GitLog{},
	"GitLog.commits":           api.GitCommit{},
	"GitDiff":                  api.GitDiff{},
	"GitFile":                  api.GitFile{},
	"Image":                    api.Image{Digest: "sha256:x", Source: "r"},
	"Image.config":             api.ImageConfig{User: "u", Env: []string{"A=1"}, WorkingDir: "/w", Entrypoint: []string{"e"}, Cmd: []string{"c"}},
	"ImagePullRequest":         api.ImagePullRequest{Name: "n"},
	// Answers documented inline in their operation.
	"/healthz": api.Health{},
}

// foreignSchemas are the schemas of the document whose types are another
// protocol's, not the API's: the Model Context Protocol's JSON-RPC
// messages (POST /v1/mcp) are the MCP SDK's.
var foreignSchemas = []string{"JSONRPCMessage"}

// apiNotSchemas are the types of package api that are not JSON objects
// of the document: Exit is a session's outcome (its WebSocket frame is
// written field by field); the string types are checked against the
// document's lists of their values.
var apiNotSchemas = []string{"Exit", "ErrorKind", "StartReason", "GitEntryKind"}

// schema is the part of a JSON schema the type check reads.
type schema struct {
	Type       any                `json:"type"`
	Ref        string             `json:"$ref"`
	Enum       []string           `json:"enum"`
	Properties map[string]*schema `json:"properties"`
	Items      *schema            `json:"items"`
	OneOf      []*schema          `json:"oneOf"`
}

// object returns s's object branch (s itself, the object of a oneOf
// with null, or an array's items), if it has properties.
func (s *schema) object() *schema {
	if s.Properties != nil {
		return s
	}
	if s.Items != nil && s.Items.Ref == "" {
		return s.Items.object()
	}
	for _, o := range s.OneOf {
		if o.Properties != nil {
			return o
		}
	}
	return nil
}

// jsonMembers returns the members of v's JSON object: its fields' names
// (by their tags) for a struct with tags, the keys it writes for a type
// whose MarshalJSON writes fields without tags (the sample holds every
// optional member), and, for each member that is itself an object, v's Go
// value of it.
func jsonMembers(t *testing.T, v any) map[string]any {
	t.Helper()
	rv := reflect.ValueOf(v)
	tagged := false
	for i := 0; i < rv.NumField(); i++ {
		tagged = tagged || rv.Type().Field(i).Tag.Get("json") != ""
	}
	if _, ok := v.(json.Marshaler); ok && !tagged {
		b, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		var m map[string]json.RawMessage
		if err := json.Unmarshal(b, &m); err != nil {
			t.Fatalf("%T: not an object: %s", v, b)
		}
		out := map[string]any{}
		for k, raw := range m {
			var inner map[string]any
			if json.Unmarshal(raw, &inner) == nil {
				out[k] = inner
			} else {
				out[k] = nil
			}
		}
		return out
	}
	out := map[string]any{}
	for i := 0; i < rv.NumField(); i++ {
		f := rv.Type().Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if name == "-" || !f.IsExported() {
			continue
		}
		if name == "" {
			name = f.Name
		}
		ft := f.Type
		for ft.Kind() == reflect.Pointer || ft.Kind() == reflect.Slice {
			ft = ft.Elem()
		}
		out[name] = nil
		if ft.Kind() == reflect.Struct && ft != reflect.TypeOf(time.Time{}) {
			out[name] = reflect.Zero(ft).Interface()
		}
	}
	return out
}

// TestOpenAPIMatchesAPITypes checks package api against the document in
// both directions: every schema (and every object a schema holds inline)
// is a type of api with exactly its properties as JSON members; every
// type api declares is one of them; the lease kinds, the error kinds and
// the start reasons are the document's lists.
func TestOpenAPIMatchesAPITypes(t *testing.T) {
	var doc struct {
		Paths      map[string]map[string]json.RawMessage `json:"paths"`
		Components struct {
			Schemas map[string]*schema `json:"schemas"`
		} `json:"components"`
	}
	if err := json.Unmarshal(docs.OpenAPI, &doc); err != nil {
		t.Fatalf("openapi.json: %v", err)
	}
	schemas := doc.Components.Schemas
	var health struct {
		Responses map[string]struct {
			Content map[string]struct {
				Schema *schema `json:"schema"`
			} `json:"content"`
		} `json:"responses"`
	}
	if err := json.Unmarshal(doc.Paths["/healthz"]["get"], &health); err != nil {
		t.Fatal(err)
	}
	schemas["/healthz"] = health.Responses["200"].Content["application/json"].Schema

	var check func(name string, s *schema, v any)
	check = func(name string, s *schema, v any) {
		obj := s.object()
		if obj == nil {
			t.Errorf("%s: the document has no properties for %T", name, v)
			return
		}
		members := jsonMembers(t, v)
		for prop, ps := range obj.Properties {
			gv, ok := members[prop]
			if !ok {
				t.Errorf("%s.%s: no field of %T", name, prop, v)
				continue
			}
			if ps.Ref != "" {
				continue // checked as its own schema
			}
			inner := name + "." + prop
			if ps.object() == nil {
				continue
			}
			if sample, ok := apiSchemas[inner]; ok {
				gv = sample
			}
			switch m := gv.(type) {
			case nil:
				t.Errorf("%s: an object in the document, not in %T", inner, v)
			case map[string]any:
				// A type with its own MarshalJSON: compare its keys.
				for k := range ps.object().Properties {
					if k == "" {
						continue
					}
					if _, ok := m[k]; !ok {
						t.Errorf("%s.%s: not written by %T", inner, k, v)
					}
				}
				for k := range m {
					if _, ok := ps.object().Properties[k]; !ok {
						t.Errorf("%s.%s: written by %T, not in the document", inner, k, v)
					}
				}
			default:
				check(inner, ps, gv)
			}
		}
		for m := range members {
			if _, ok := obj.Properties[m]; !ok {
				t.Errorf("%s: %T's member %q is not in the document", name, v, m)
			}
		}
	}
	named := map[string]bool{}
	for name, v := range apiSchemas {
		named[reflect.TypeOf(v).Name()] = true
		if strings.Contains(name, ".") {
			continue // checked inside its schema
		}
		s, ok := schemas[name]
		if !ok || s == nil {
			t.Errorf("%s (%T) is not a schema of the document", name, v)
			continue
		}
		if reflect.TypeOf(v).Kind() == reflect.String {
			continue
		}
		check(name, s, v)
	}
	for name, s := range schemas {
		if _, ok := apiSchemas[name]; !ok && s.OneOf == nil && !slices.Contains(foreignSchemas, name) {
			t.Errorf("schema %s has no type in package api (apiSchemas)", name)
		}
	}

	// Every type api declares is a schema's (or deliberately none).
	fset := token.NewFileSet()
	files, err := filepath.Glob("../api/*.go")
	if err != nil || len(files) == 0 {
		t.Fatalf("api sources: %v", err)
	}
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		af, err := parser.ParseFile(fset, f, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range af.Decls {
			g, ok := d.(*ast.GenDecl)
			if !ok || g.Tok != token.TYPE {
				continue
			}
			for _, sp := range g.Specs {
				n := sp.(*ast.TypeSpec).Name.Name
				if ast.IsExported(n) && !named[n] && !slices.Contains(apiNotSchemas, n) {
					t.Errorf("api.%s (%s) is in no schema of the document", n, filepath.Base(f))
				}
			}
		}
	}

	// The lists of values.
	sorted := func(in []string) []string { out := slices.Clone(in); sort.Strings(out); return out }
	var leases []string
	for _, k := range []api.LeaseKind{api.LeaseEditor, api.LeaseFiles, api.LeaseTerminal, api.LeaseGitHub, api.LeaseLSP, api.LeaseRunner, api.LeaseProcess} {
		leases = append(leases, string(k))
	}
	if got, want := sorted(schemas["LeaseKind"].Enum), sorted(leases); !slices.Equal(got, want) {
		t.Errorf("LeaseKind: the document lists %v, api %v", got, want)
	}
	var kinds []string
	for _, k := range api.Kinds {
		kinds = append(kinds, string(k))
	}
	errKind := schemas["ErrorBody"].Properties["error"].Properties["kind"]
	if got, want := sorted(errKind.Enum), sorted(kinds); !slices.Equal(got, want) {
		t.Errorf("ErrorBody's kinds: the document lists %v, api.Kinds %v", got, want)
	}
	var entryKinds []string
	for _, k := range []api.GitEntryKind{api.GitEntryOrdinary, api.GitEntryRenamed, api.GitEntryCopied, api.GitEntryUnmerged, api.GitEntryUntracked, api.GitEntryIgnored} {
		entryKinds = append(entryKinds, string(k))
	}
	entryKind := schemas["GitStatus"].Properties["entries"].Items.Properties["kind"]
	if got, want := sorted(entryKind.Enum), sorted(entryKinds); !slices.Equal(got, want) {
		t.Errorf("GitStatus's entry kinds: the document lists %v, api %v", got, want)
	}
	reason := schemas["ErrorBody"].Properties["error"].Properties["reason"]
	if got, want := sorted(reason.Enum), sorted([]string{string(api.ReasonNotFound), string(api.ReasonNotExecutable)}); !slices.Equal(got, want) {
		t.Errorf("ErrorBody's reasons: the document lists %v, api %v", got, want)
	}
}
