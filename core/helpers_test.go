package core_test

import (
	"os"
	"path/filepath"
	"strings"

	"github.com/corral-sandbox/corral/machine"
	"github.com/corral-sandbox/corral/store"
)

func wireProject(p store.Project) machine.Project {
	return machine.Project{ID: p.ID, Workspace: p.Root}
}

func procCmdlines() []string {
	var out []string
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err == nil && len(b) > 0 {
			out = append(out, strings.ReplaceAll(string(b), "\x00", " "))
		}
	}
	return out
}

func contains(s, sub string) bool { return strings.Contains(s, sub) }
