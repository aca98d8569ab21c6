package core_test

import (
	"reflect"
	"strings"
	"testing"

	"github.com/corral-sandbox/corral/core"
	"github.com/corral-sandbox/corral/lease"
	"github.com/corral-sandbox/corral/machine"
	"github.com/corral-sandbox/corral/plugin"
	"github.com/corral-sandbox/corral/store"
)

// internalTypes are what a third-party plugin must never hold: with the
// gateway it ran `id -u` in a managed machine as account 999999 under
// lease "not-a-lease", with no tenancy check, no lease and no journal row.
var internalTypes = []reflect.Type{
	reflect.TypeFor[*machine.Gateway](),
	reflect.TypeFor[store.Store](),
	reflect.TypeFor[*lease.Manager](),
	reflect.TypeFor[*core.Core](),
	reflect.TypeFor[machine.PrivilegedTransport](),
}

// reaches reports the path to an internal type inside v (pointers,
// structs, interfaces, maps, slices followed), or "".
func reaches(v reflect.Value, path string, seen map[uintptr]bool) string {
	if !v.IsValid() {
		return ""
	}
	for _, t := range internalTypes {
		if v.Type() == t || (t.Kind() == reflect.Interface && v.Type().Implements(t) && v.Kind() != reflect.Interface) {
			return path + " (" + v.Type().String() + ")"
		}
	}
	switch v.Kind() {
	case reflect.Pointer:
		if v.IsNil() || seen[v.Pointer()] {
			return ""
		}
		seen[v.Pointer()] = true
		return reaches(v.Elem(), path, seen)
	case reflect.Interface:
		return reaches(v.Elem(), path, seen)
	case reflect.Struct:
		for i := 0; i < v.NumField(); i++ {
			if p := reaches(v.Field(i), path+"."+v.Type().Field(i).Name, seen); p != "" {
				return p
			}
		}
	case reflect.Map:
		it := v.MapRange()
		for it.Next() {
			if p := reaches(it.Value(), path+"[k]", seen); p != "" {
				return p
			}
		}
	case reflect.Slice, reflect.Array:
		for i := 0; i < v.Len(); i++ {
			if p := reaches(v.Index(i), path+"[i]", seen); p != "" {
				return p
			}
		}
	}
	return ""
}

// TestThirdPartyPluginGetsNoInternals: in a core that has a privileged
// transport, a plugin that is not built in and has an empty manifest
// receives nothing that reaches a machine, the store or a lease, and its
// registry context resolves no domain.
func TestThirdPartyPluginGetsNoInternals(t *testing.T) {
	var got core.Deps
	var resolveErrs []error
	called := false
	evil := core.Plugin(func(d core.Deps) plugin.Registration {
		got, called = d, true
		return plugin.Registration{
			Manifest: plugin.Manifest{Name: "evil", Version: "1"},
			Register: func(c *plugin.Context) error {
				for _, d := range []plugin.Domain{plugin.DomainSandbox, plugin.DomainSandboxArtifacts, plugin.DomainSites, plugin.DomainEditor, plugin.DomainLSP} {
					_, err := c.Consumer().Resolve(d)
					resolveErrs = append(resolveErrs, err)
				}
				return nil
			},
		}
	})
	e := build(t, core.Options{
		Plugins:             append(core.Builtins(), evil),
		PrivilegedTransport: machine.SocketTransport{Path: "/nonexistent/worker.sock"},
	}, nil)
	if !called {
		t.Fatal("the factory was not called")
	}
	if p := reaches(reflect.ValueOf(got), "Deps", map[uintptr]bool{}); p != "" {
		t.Errorf("a third-party factory reaches core's internals: %s", p)
	}
	// And by type: no field of Deps can ever hold one.
	dt := reflect.TypeFor[core.Deps]()
	for i := 0; i < dt.NumField(); i++ {
		f := dt.Field(i)
		for _, pkg := range []string{"/machine", "/store", "/lease", "/core", "/provider"} {
			if strings.Contains(f.Type.String(), strings.TrimPrefix(pkg, "/")+".") {
				t.Errorf("Deps.%s is a %s", f.Name, f.Type)
			}
		}
	}
	if st, _ := e.core.Registry().Status("evil"); st.State != plugin.StateLoaded {
		t.Fatalf("evil: %s %s", st.State, st.Reason)
	}
	for i, err := range resolveErrs {
		if err == nil {
			t.Errorf("resolve %d succeeded with an empty manifest", i)
		}
	}
}

// TestBuiltinsStillWork: the built-in factories do get the internals.
func TestBuiltinsStillWork(t *testing.T) {
	e := build(t, core.Options{}, nil)
	if _, err := e.core.Sandbox(); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"sandbox", "sites", "editor", "lsp"} {
		if st, ok := e.core.Registry().Status(name); !ok || st.State != plugin.StateLoaded {
			t.Errorf("%s: %+v", name, st)
		}
	}
	var zero core.PluginFactory
	if _, err := core.Build(t.Context(), core.Options{StorePath: t.TempDir() + "/c.db", Migrate: true, Plugins: []core.PluginFactory{zero}}); err == nil {
		t.Error("a zero PluginFactory was accepted")
	}
}
