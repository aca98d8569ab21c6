package provider

import (
	"testing"

	"github.com/corral-sandbox/corral/machine"
	"github.com/corral-sandbox/corral/store"
)

// TestMachineProject: a project's image and limits reach the worker; the
// default image is sent as nothing, so that a worker without the
// machine-spec extension still serves default projects.
func TestMachineProject(t *testing.T) {
	p := store.Project{ID: 3, Root: "/w", Image: store.DefaultImage}
	if got := machineProject(p); got != (machine.Project{ID: 3, Workspace: "/w"}) {
		t.Errorf("default project: %+v", got)
	}
	p.Image = "debian"
	p.Limits = store.MachineLimits{Memory: 1 << 30, Pids: 10, CPUMillis: 1500, Disk: 5 << 30, Tmp: 64 << 20}
	want := machine.Project{ID: 3, Workspace: "/w", Image: "debian",
		Limits: machine.Limits{Memory: 1 << 30, Pids: 10, CPUMillis: 1500, Disk: 5 << 30, Tmp: 64 << 20}}
	if got := machineProject(p); got != want {
		t.Errorf("spec: %+v, want %+v", got, want)
	}
}
