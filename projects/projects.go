// Package projects creates and deletes projects with their workspaces, and
// holds the state directory's layout (its mode, the managed workspaces
// under STATE/projects, the worker's machine state under STATE/worker):
// a managed project's workspace made empty, copied from a host directory
// or cloned from a Git URL (the clone pinned to a public address, see
// GitImportOptions); a host project rooted at a host directory that is
// not the state directory's; a machine's reset. The daemon's HTTP API and
// the CLI's project commands both use it; it speaks no HTTP: its errors
// are classified (internal/errdefs, sandbox.ErrDenied) for the daemon's
// one translator.
package projects

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/corral-sandbox/corral/internal/errdefs"
	"github.com/corral-sandbox/corral/machine"
	"github.com/corral-sandbox/corral/sandbox"
	"github.com/corral-sandbox/corral/store"
)

// ErrInvalidProject is wrapped by Projects.Create for a specification it
// refuses (bad name, missing or conflicting sources, a root that is not a
// directory).
var ErrInvalidProject = errdefs.New(errdefs.Invalid, "projects: invalid project")

// ErrHostPath is wrapped by Projects.Create for a host path no project may
// use: "/", the state directory, a directory inside it or one containing
// it. It also matches sandbox.ErrDenied (the API answers 403).
var ErrHostPath = fmt.Errorf("projects: host path not allowed: %w", sandbox.ErrDenied)

// CloneTimeout bounds a `git clone` of a new managed project.
const CloneTimeout = 10 * time.Minute

// ProjectSpec describes a project to create.
//
// A managed project (Kind store.ProjectManaged) gets a new workspace
// directory StateDir/projects/<Name>: empty, a copy of the host directory
// From, or a `git clone` of Git; at most one of From and Git. A host
// project (store.ProjectHost) is rooted at the existing directory Root.
// Owner, if nonzero, is made the project's owner.
type ProjectSpec struct {
	Name  string
	Kind  store.ProjectKind
	Root  string
	From  string
	Git   string
	Owner int64
	// Progress, if non-nil, receives a clone's progress lines (git's
	// "Receiving objects: 50% (1/2)", redacted) as it goes; errors are not
	// progress, they are Create's result.
	Progress func(line string)
	// ExportRemotes, if non-empty, are the project's export remote
	// patterns (export.ValidRemotePattern), narrowing the daemon's.
	ExportRemotes []string
}

// Projects creates and deletes projects with their workspaces. The CLI uses
// it directly on the database; the HTTP API through the App.
type Projects struct {
	Store store.Store
	// StateDir is the daemon's state directory; managed workspaces live in
	// StateDir/projects. Empty refuses managed projects.
	StateDir string
	// GitImport configures clones of git URLs (see gitimport.go).
	GitImport GitImportOptions
	// Sandbox, if not nil, resolves the sandbox control: a git import
	// then clones once the project and its owner are recorded, under a
	// files lease of the owner's taken through the control (keep-alive,
	// journal, release; the project cannot be deleted meanwhile). Nil
	// clones before the project is recorded, with no lease (the CLI's
	// offline administration).
	Sandbox func() (*sandbox.Control, error)
	// Logger receives diagnostics; nil means slog.Default().
	Logger *slog.Logger
	// Gateway, if it has a privileged transport, is told of a deleted
	// managed project's end (machine.Gateway.Forget), so that its worker
	// frees the project's home, machine state and id range; nil leaves
	// them to the worker's next start.
	Gateway *machine.Gateway
}

// StateDirMode is the mode of the daemon's state directory: only the
// daemon's uid (and root) may enter it, whatever the modes of the files
// inside (the database, the sockets, workspaces).
const StateDirMode os.FileMode = 0o700

// PrepareStateDir creates dir (and its parents) if missing and gives it
// StateDirMode, also when it existed with another mode.
func PrepareStateDir(dir string) error {
	if err := os.MkdirAll(dir, StateDirMode); err != nil {
		return fmt.Errorf("projects: state directory: %w", err)
	}
	if err := os.Chmod(dir, StateDirMode); err != nil {
		return fmt.Errorf("projects: state directory: %w", err)
	}
	return nil
}

// WorkspacesDir returns the directory holding managed workspaces
// (the worker's --projects-root).
func WorkspacesDir(stateDir string) string { return filepath.Join(stateDir, "projects") }

// ValidProjectName reports whether name can name a project: 1 to 64 ASCII
// letters, digits, '.', '_' and '-', not starting with '.' or '-'. A
// managed project's workspace directory has this name.
func ValidProjectName(name string) bool {
	if len(name) == 0 || len(name) > 64 || name[0] == '.' || name[0] == '-' {
		return false
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '.' || c == '_' || c == '-') {
			return false
		}
	}
	return true
}

func (p *Projects) logger() *slog.Logger {
	if p.Logger != nil {
		return p.Logger
	}
	return slog.Default()
}

// Create creates the project of spec. On failure nothing is left behind:
// a workspace it made is removed again. A duplicate name is store.ErrExists
// (also when a workspace directory of that name exists already); a refused
// spec wraps ErrInvalidProject; a failed copy or clone is returned as is.
func (p *Projects) Create(ctx context.Context, spec ProjectSpec) (proj store.Project, err error) {
	if !ValidProjectName(spec.Name) {
		return store.Project{}, fmt.Errorf("%w: name %q must be 1-64 of [A-Za-z0-9._-], not starting with '.' or '-'", ErrInvalidProject, spec.Name)
	}
	var root string
	cloneLeased := false
	switch spec.Kind {
	case store.ProjectHost:
		if spec.From != "" || spec.Git != "" {
			return store.Project{}, fmt.Errorf("%w: a host project takes a root, not a source", ErrInvalidProject)
		}
		if root, err = existingDir(spec.Root); err != nil {
			return store.Project{}, err
		}
		if err := p.checkHostPath(root); err != nil {
			return store.Project{}, err
		}
	case store.ProjectManaged:
		if spec.Root != "" {
			return store.Project{}, fmt.Errorf("%w: a managed project's workspace is made by corral; give a source (from or git), not a root", ErrInvalidProject)
		}
		if spec.From != "" && spec.Git != "" {
			return store.Project{}, fmt.Errorf("%w: give at most one of from and git", ErrInvalidProject)
		}
		if p.StateDir == "" {
			return store.Project{}, fmt.Errorf("%w: no state directory for managed workspaces", ErrInvalidProject)
		}
		if _, err := p.Store.ProjectByName(ctx, spec.Name); err == nil {
			return store.Project{}, fmt.Errorf("projects: project %q: %w", spec.Name, store.ErrExists)
		}
		var from string
		if spec.From != "" {
			if from, err = existingDir(spec.From); err != nil {
				return store.Project{}, err
			}
			if err := p.checkHostPath(from); err != nil {
				return store.Project{}, err
			}
		}
		if local, ok := LocalGitPath(spec.Git); ok {
			real, err := existingDir(local)
			if err != nil {
				return store.Project{}, err
			}
			if err := p.checkHostPath(real); err != nil {
				return store.Project{}, err
			}
		}
		dir := WorkspacesDir(p.StateDir)
		if err := os.MkdirAll(dir, 0o711); err != nil {
			return store.Project{}, fmt.Errorf("projects: %w", err)
		}
		if dir, err = filepath.EvalSymlinks(dir); err != nil {
			return store.Project{}, fmt.Errorf("projects: %w", err)
		}
		root = filepath.Join(dir, spec.Name)
		if err := os.Mkdir(root, 0o755); err != nil {
			if errors.Is(err, fs.ErrExist) {
				return store.Project{}, fmt.Errorf("projects: workspace %s: %w", root, store.ErrExists)
			}
			return store.Project{}, fmt.Errorf("projects: %w", err)
		}
		defer func() {
			if err != nil {
				_ = os.RemoveAll(root)
			}
		}()
		switch {
		case from != "":
			if err := copyTree(root, from); err != nil {
				return store.Project{}, fmt.Errorf("projects: copy %s into the workspace: %w", from, err)
			}
		case spec.Git != "" && p.Sandbox != nil && spec.Owner != 0:
			cloneLeased = true // once the project and its owner exist
		case spec.Git != "":
			if err := p.gitClone(ctx, spec.Git, root, spec.Progress); err != nil {
				return store.Project{}, err
			}
		}
	default:
		return store.Project{}, fmt.Errorf("%w: kind %q is not managed or host", ErrInvalidProject, spec.Kind)
	}
	proj, err = p.Store.CreateProject(ctx, store.NewProject{Kind: spec.Kind, Name: spec.Name, Root: root})
	if err != nil {
		return store.Project{}, err
	}
	if len(spec.ExportRemotes) > 0 {
		if err = p.Store.SetExportRemotes(ctx, proj.ID, spec.ExportRemotes); err != nil {
			if derr := p.Store.DeleteProject(context.WithoutCancel(ctx), proj.ID); derr != nil {
				p.logger().Error("cannot remove a half-created project", "project", proj.ID, "err", derr)
			}
			return store.Project{}, err
		}
	}
	if spec.Owner != 0 {
		if _, err = p.Store.AddMember(ctx, store.Member{Project: proj.ID, Account: spec.Owner, Role: store.RoleOwner}); err != nil {
			if derr := p.Store.DeleteProject(context.WithoutCancel(ctx), proj.ID); derr != nil {
				p.logger().Error("cannot remove a half-created project", "project", proj.ID, "err", derr)
			}
			return store.Project{}, err
		}
	}
	if cloneLeased {
		if err = p.cloneLeased(ctx, proj, spec); err != nil {
			if derr := p.Store.DeleteProject(context.WithoutCancel(ctx), proj.ID); derr != nil {
				p.logger().Error("cannot remove a half-created project", "project", proj.ID, "err", derr)
			}
			return store.Project{}, err
		}
	}
	p.logger().Info("project created", "project", proj.ID, "name", proj.Name, "kind", proj.Kind, "owner", spec.Owner)
	return proj, nil
}

// cloneLeased clones spec.Git into proj's workspace under a files lease of
// the owner's, through the sandbox control's lifecycle: the clone is
// journaled ("git clone URL", redacted), the lease kept alive while it
// runs (its loss ends the clone) and released after; a failed release
// fails the import.
func (p *Projects) cloneLeased(ctx context.Context, proj store.Project, spec ProjectSpec) error {
	ctl, err := p.Sandbox()
	if err != nil {
		return err
	}
	f, err := ctl.OpenFiles(ctx, sandbox.FilesInput{
		Project: sandbox.ProjectRef{Kind: sandbox.ProjectManaged, ProjectID: proj.ID},
		Journal: []string{"git", "clone", spec.Git},
	}, &sandbox.Actor{AccountUserID: spec.Owner})
	if err != nil {
		return err
	}
	err = p.gitClone(f.Context(), spec.Git, proj.Root, spec.Progress)
	if cerr := f.Close(err); cerr != nil {
		return errors.Join(err, cerr)
	}
	return err
}

// Delete deletes project id. It refuses with store.ErrProjectBusy while
// the project has a live lease. A managed project's workspace is removed
// too (only if it lies in StateDir/projects).
func (p *Projects) Delete(ctx context.Context, id int64) error {
	proj, err := p.Store.GetProject(ctx, id)
	if err != nil {
		return err
	}
	if err := p.Store.DeleteProject(ctx, id); err != nil {
		return err
	}
	if proj.Kind == store.ProjectManaged && p.StateDir != "" {
		dir, err := filepath.EvalSymlinks(WorkspacesDir(p.StateDir))
		if err == nil && filepath.Dir(proj.Root) == dir {
			if err := os.RemoveAll(proj.Root); err != nil {
				return fmt.Errorf("projects: project %d deleted, but its workspace was not removed: %w", id, err)
			}
		}
	}
	if proj.Kind == store.ProjectManaged && p.Gateway != nil && p.Gateway.HasTransport() {
		fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
		err := p.Gateway.Forget(fctx, machine.Project{ID: id, Workspace: proj.Root})
		cancel()
		if err != nil && !errors.Is(err, machine.ErrUnsupported) {
			p.logger().Warn("project deleted, but its worker did not free its machine state and id range (freed at the worker's next start)", "project", id, "err", err)
		}
	}
	if proj.Kind == store.ProjectManaged && p.StateDir != "" {
		// The machine's upper layer (the daemon's worker keeps it under
		// STATE/worker); a machine still idle-running keeps its own until
		// it stops.
		if err := RemoveMachineState(filepath.Join(p.StateDir, "worker"), id); err != nil {
			p.logger().Warn("project deleted, but its machine state was not removed", "project", id, "err", err)
		}
	}
	p.logger().Info("project deleted", "project", id, "name", proj.Name)
	return nil
}

// checkHostPath refuses (ErrHostPath) a host directory no project may be
// rooted at or copied from: "/", the state directory, anything inside it
// (the database, other projects' workspaces) or any directory containing
// it. real is absolute and free of symbolic links.
func (p *Projects) checkHostPath(real string) error {
	if real == "/" {
		return fmt.Errorf("%w: / (the whole host)", ErrHostPath)
	}
	if p.StateDir == "" {
		return nil
	}
	state, err := filepath.EvalSymlinks(p.StateDir)
	if err != nil {
		state = filepath.Clean(p.StateDir)
	}
	if within(real, state) {
		return fmt.Errorf("%w: %s is in the daemon's state directory", ErrHostPath, real)
	}
	if within(state, real) {
		return fmt.Errorf("%w: %s contains the daemon's state directory", ErrHostPath, real)
	}
	return nil
}

// within reports whether path is dir or lies below it (both clean and
// absolute).
func within(path, dir string) bool {
	return path == dir || strings.HasPrefix(path, strings.TrimSuffix(dir, "/")+"/")
}

// LocalGitPath reports whether the git URL u names a repository on the
// host (a file:// URL or a path) and returns that path.
func LocalGitPath(u string) (string, bool) {
	if u == "" {
		return "", false
	}
	if strings.HasPrefix(u, "/") {
		return u, true
	}
	if rest, ok := strings.CutPrefix(u, "file://"); ok {
		if pu, err := url.Parse(u); err == nil && (pu.Host == "" || pu.Host == "localhost") {
			return pu.Path, true
		}
		return rest, true
	}
	if !strings.Contains(u, "://") && !strings.Contains(u, "@") && !strings.Contains(u, ":") {
		return u, true // a relative path
	}
	return "", false
}

// existingDir returns the absolute, symlink-free path of the directory d.
func existingDir(d string) (string, error) {
	if d == "" || !filepath.IsAbs(d) {
		return "", fmt.Errorf("%w: %q is not an absolute path", ErrInvalidProject, d)
	}
	real, err := filepath.EvalSymlinks(d)
	if err != nil {
		return "", fmt.Errorf("%w: %v", ErrInvalidProject, err)
	}
	st, err := os.Stat(real)
	if err != nil {
		return "", fmt.Errorf("%w: %v", ErrInvalidProject, err)
	}
	if !st.IsDir() {
		return "", fmt.Errorf("%w: %s is not a directory", ErrInvalidProject, d)
	}
	return real, nil
}

// copyTree copies the tree at src into the existing directory dst:
// directories, regular files (with their permission bits) and symbolic
// links (as links, never followed). Other files (devices, sockets, FIFOs)
// are skipped.
func copyTree(dst, src string) error {
	return filepath.WalkDir(src, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(src, path)
		if err != nil {
			return err
		}
		if rel == "." {
			return nil
		}
		target := filepath.Join(dst, rel)
		info, err := d.Info()
		if err != nil {
			return err
		}
		switch {
		case d.IsDir():
			return os.Mkdir(target, info.Mode().Perm()|0o700)
		case d.Type()&fs.ModeSymlink != 0:
			link, err := os.Readlink(path)
			if err != nil {
				return err
			}
			return os.Symlink(link, target)
		case d.Type().IsRegular():
			return copyFile(target, path, info.Mode().Perm())
		}
		return nil
	})
}

func copyFile(dst, src string, perm fs.FileMode) error {
	in, err := os.OpenFile(src, os.O_RDONLY|syscall.O_NOFOLLOW, 0)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, perm)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}
