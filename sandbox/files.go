package sandbox

import (
	"context"
	"fmt"
)

// HostFiles is where and as whom the files API reaches a host project's
// files: every path is resolved under Root (RESOLVE_IN_ROOT), with the
// ids of User when it is set.
type HostFiles struct {
	// Root is the project's workspace, an absolute host path.
	Root string
	// User, if not nil, is the project's confined user (host ids); nil
	// means the calling process's own user (a process that cannot switch
	// users).
	User *HostUser
}

// HostUser is a host user by ids.
type HostUser struct {
	UID, GID uint32
}

// HostFiler is implemented by providers that serve host projects' files.
type HostFiler interface {
	// HostFiles returns the files target of host project id for actor,
	// who is a member of it (the caller checked). It fails with an error
	// wrapping ErrNotFound for an unknown project and a plain error for a
	// managed one.
	HostFiles(ctx context.Context, projectID int64, actor Actor) (HostFiles, error)
}

// HostFiles resolves the files target of host project id through the
// provider (see HostFiler); a provider that does not implement it yields
// an error wrapping ErrUnavailable.
func (c *Control) HostFiles(ctx context.Context, projectID int64, actor Actor) (HostFiles, error) {
	hf, ok := c.provider.(HostFiler)
	if !ok {
		return HostFiles{}, fmt.Errorf("%w: the sandbox provider serves no host files", ErrUnavailable)
	}
	return hf.HostFiles(ctx, projectID, actor)
}
