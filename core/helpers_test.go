package core_test

import (
	"github.com/corral-sandbox/corral/store"
	"github.com/corral-sandbox/corral/wire"
)

func wireProject(p store.Project) wire.Project { return wire.Project{ID: p.ID, Workspace: p.Root} }
