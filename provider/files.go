package provider

import (
	"context"
	"fmt"
	"io"
	"os"

	"github.com/corral-sandbox/corral/internal/errdefs"
	"github.com/corral-sandbox/corral/internal/fsop"
	"github.com/corral-sandbox/corral/machine"
	"github.com/corral-sandbox/corral/sandbox"
	"github.com/corral-sandbox/corral/store"
)

var _ sandbox.FilesPreparer = (*Provider)(nil)

// PrepareFiles implements sandbox.FilesPreparer. Tenancy is checked as
// for a command (an unknown project wraps sandbox.ErrNotFound, a
// non-member sandbox.ErrDenied); the lease, of kind "files", is minted
// last, stamped with the provider's domain, and carries the journal entry
// core asked for (sandbox.JournalIntent).
//
// A managed project's files are its machine's, reached through the
// gateway as in.User (without a privileged transport every call fails
// with machine.ErrNoPrivilegedTransport; the lease still covers the work
// done beside the calls, such as a git import's clone). A host project's are reached
// under its root as the project's confined user (made able to write the
// root as for a confined command) when this process can switch users, and
// as corral's own user otherwise; a host project refuses a named user
// (an invalid request).
func (p *Provider) PrepareFiles(ctx context.Context, in sandbox.FilesInput, actor sandbox.Actor) (*sandbox.PreparedFiles, error) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), PrepareTimeout)
	defer cancel()
	ein := sandbox.ExecInput{Project: in.Project, LeaseKind: sandbox.LeaseFiles}
	ten, err := p.tenancy(ctx, ein, actor, false)
	if err != nil {
		return nil, err
	}
	proj := ten.Project
	var fs sandbox.FileSystem
	switch proj.Kind {
	case store.ProjectManaged:
		if p.gateway == nil {
			return nil, fmt.Errorf("provider: project %d: %w", proj.ID, machine.ErrNoPrivilegedTransport)
		}
		fs = &machineFiles{gw: p.gateway, p: machineProject(proj), user: in.User}
	case store.ProjectHost:
		if in.User != "" {
			return nil, errdefs.Wrap(fmt.Errorf("provider: project %d is a host project, whose files are reached as its own user: a user (%q) is not accepted", proj.ID, in.User), errdefs.Invalid)
		}
		h, err := p.hostFiles(proj)
		if err != nil {
			return nil, err
		}
		fs = h
	default:
		return nil, fmt.Errorf("provider: project %d: %s projects have no files", proj.ID, proj.Kind)
	}
	l, err := p.mintLease(ctx, ein, actor)
	if err != nil {
		return nil, err
	}
	return &sandbox.PreparedFiles{Project: in.Project, Lease: l, FS: fs}, nil
}

// hostFiles is host project proj's files target.
func (p *Provider) hostFiles(proj store.Project) (*hostFiles, error) {
	root, err := realDir(proj.Root)
	if err != nil {
		return nil, fmt.Errorf("provider: project root: %w", err)
	}
	h := &hostFiles{root: root}
	if p.users != nil {
		u, err := p.users.user(proj.ID)
		if err != nil {
			return nil, err
		}
		if err := p.users.prepareRoot(root, u); err != nil {
			return nil, err
		}
		h.user = &fsop.Cred{UID: u.UID, GID: u.GID}
	}
	return h, nil
}

// machineFiles is a managed project's machine, through the gateway. Its
// errors are the gateway's (machine.ErrNotFound, …, classified).
type machineFiles struct {
	gw   *machine.Gateway
	p    machine.Project
	user string
}

var _ sandbox.FileSystem = (*machineFiles)(nil)

func (m *machineFiles) req(p string) machine.FileRequest {
	return machine.FileRequest{Project: m.p, User: m.user, Path: p}
}

func (m *machineFiles) Open(ctx context.Context, p string) (*os.File, sandbox.FileInfo, error) {
	return m.gw.OpenFile(ctx, m.req(p))
}

func (m *machineFiles) Write(ctx context.Context, p string, mode uint32, src io.Reader) (int64, error) {
	return m.gw.WriteFile(ctx, m.req(p), mode, src)
}

func (m *machineFiles) Stat(ctx context.Context, p string) (sandbox.FileInfo, error) {
	return m.gw.StatFile(ctx, m.req(p))
}

func (m *machineFiles) List(ctx context.Context, p string, depth, limit int) (sandbox.FileInfo, []sandbox.FileInfo, bool, error) {
	return m.gw.ListFiles(ctx, m.req(p), depth, limit)
}

func (m *machineFiles) Mkdir(ctx context.Context, p string, mode uint32, parents bool) (sandbox.FileInfo, error) {
	return m.gw.Mkdir(ctx, m.req(p), mode, parents)
}

func (m *machineFiles) Remove(ctx context.Context, p string, recursive bool) error {
	return m.gw.RemoveFile(ctx, m.req(p), recursive)
}

func (m *machineFiles) Rename(ctx context.Context, from, to string) error {
	return m.gw.RenameFile(ctx, m.req(from), to)
}

func (m *machineFiles) Watch(ctx context.Context, p string, recursive bool) (*os.File, []sandbox.FileInfo, error) {
	f, ws, _, err := m.gw.WatchFiles(ctx, m.req(p), recursive)
	return f, ws, err
}

func (m *machineFiles) AddWatch(ctx context.Context, ino *os.File, p string) ([]sandbox.FileInfo, error) {
	ws, _, err := m.gw.AddWatch(ctx, m.req(p), ino, true)
	return ws, err
}
