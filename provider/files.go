package provider

import (
	"context"
	"errors"
	"fmt"

	"github.com/corral-sandbox/corral/sandbox"
	"github.com/corral-sandbox/corral/store"
)

var _ sandbox.HostFiler = (*Provider)(nil)

// HostFiles implements sandbox.HostFiler: a host project's files are
// reached under its root as the project's confined user (made able to
// write the root as for a confined command) when this process can switch
// users, and as corral's own user otherwise.
func (p *Provider) HostFiles(ctx context.Context, projectID int64, actor sandbox.Actor) (sandbox.HostFiles, error) {
	proj, err := p.store.GetProject(ctx, projectID)
	if errors.Is(err, store.ErrNotFound) {
		return sandbox.HostFiles{}, fmt.Errorf("%w: project %d", sandbox.ErrNotFound, projectID)
	}
	if err != nil {
		return sandbox.HostFiles{}, fmt.Errorf("provider: %w", err)
	}
	if proj.Kind != store.ProjectHost {
		return sandbox.HostFiles{}, fmt.Errorf("provider: project %d is not a host project", projectID)
	}
	root, err := realDir(proj.Root)
	if err != nil {
		return sandbox.HostFiles{}, fmt.Errorf("provider: project root: %w", err)
	}
	hf := sandbox.HostFiles{Root: root}
	if p.users != nil {
		u, err := p.users.user(proj.ID)
		if err != nil {
			return sandbox.HostFiles{}, err
		}
		if err := p.users.prepareRoot(root, u); err != nil {
			return sandbox.HostFiles{}, err
		}
		hf.User = &sandbox.HostUser{UID: u.UID, GID: u.GID}
	}
	return hf, nil
}
