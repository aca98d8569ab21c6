// Package sites is the built-in plugin that owns the "sites" domain:
// which port of which project is published under which name, and by whom.
// The daemon's Sites gateway (NAME.D with --sites-domain D, and
// /sites/{name}/… on the Unix socket) resolves this control through the
// registry on every request and proxies to the published port through the
// machine gateway's net-dial; this package itself never dials.
//
// With a store (Options.Store, as core builds it), publications are rows
// of the store: names are unique across projects and survive a daemon
// restart, so nobody can take a name its project held before the restart.
// Without one, they are kept in memory (tests, embedders).
package sites

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/corral-sandbox/corral/internal/errdefs"
	"github.com/corral-sandbox/corral/plugin"
	"github.com/corral-sandbox/corral/store"
)

// Name is the plugin's name.
const Name = "sites"

// Errors of the control. They are wrapped; test with errors.Is.
var (
	// ErrUnavailable is joined into the registry's error when the sites
	// domain is absent (no owner, disabled, failed to load).
	ErrUnavailable = errdefs.New(errdefs.Unavailable, "sites: unavailable")
	// ErrNotFound: no site has that name (or not in that project).
	ErrNotFound = errdefs.New(errdefs.NotFound, "sites: no such site")
	// ErrTaken: the name is published by another project.
	ErrTaken = errdefs.New(errdefs.Conflict, "sites: name taken by another project")
	// ErrInvalid: a malformed name or port, or an unknown project.
	ErrInvalid = errdefs.New(errdefs.Invalid, "sites: invalid publication")
)

// Site is one publication: HTTP requests for site Name reach Port on
// the loopback of Project's machine.
type Site struct {
	Name      string    `json:"name"`
	Project   int64     `json:"projectId"`
	Port      int       `json:"port"`
	By        int64     `json:"publishedBy"`
	Published time.Time `json:"published"`
}

// Control is the sites domain's interface: what core checks a sites
// control implements, and what the daemon resolves. Callers check tenancy
// (the actor is a member of the project) before calling; the control checks
// only the publication's shape and that the project exists.
type Control interface {
	// Publish publishes port of project under name, on behalf of account
	// by. Publishing a name the same project already holds replaces its
	// port (idempotent); a name held by another project is ErrTaken.
	Publish(ctx context.Context, project int64, name string, port int, by int64) (Site, error)
	// Unpublish removes project's publication of name; a name project
	// does not hold is ErrNotFound.
	Unpublish(ctx context.Context, project int64, name string) error
	// Lookup returns the publication of name, or ErrNotFound.
	Lookup(ctx context.Context, name string) (Site, error)
	// List returns project's publications by name.
	List(ctx context.Context, project int64) ([]Site, error)
}

// Options configure the plugin.
type Options struct {
	// Store, if non-nil, holds the publications (they persist) and an
	// unknown project is refused. Nil keeps them in memory and accepts any
	// positive project id.
	Store store.Store
	// Logger receives publications; nil means slog.Default().
	Logger *slog.Logger
	// Now is the clock; nil means time.Now.
	Now func() time.Time
}

// Registration returns the plugin's registration. Registering starts
// nothing; the control it provides is New(opts).
func Registration(opts Options) plugin.Registration {
	return plugin.Registration{
		Manifest: plugin.Manifest{
			Name:     Name,
			Version:  "1",
			Provides: []plugin.Domain{plugin.DomainSites},
		},
		Register: func(ctx *plugin.Context) error {
			return ctx.Provide(plugin.DomainSites, New(opts))
		},
	}
}

// Table is the Control: over the store when Options.Store is set, else in
// memory. The zero value is not usable; use New. It is safe for
// concurrent use.
type Table struct {
	opts  Options
	log   *slog.Logger
	mu    sync.RWMutex
	sites map[string]Site
}

var _ Control = (*Table)(nil)

// New returns the table over opts.Store, or an empty in-memory one.
func New(opts Options) *Table {
	log := opts.Logger
	if log == nil {
		log = slog.Default()
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	return &Table{opts: opts, log: log, sites: make(map[string]Site)}
}

// ValidName reports whether name can be published: 1 to 63 lower-case
// ASCII letters, digits and '-', not starting or ending with '-' (a DNS
// label, so a name can also serve as a host name).
func ValidName(name string) bool {
	if len(name) == 0 || len(name) > 63 || name[0] == '-' || name[len(name)-1] == '-' {
		return false
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		if !('a' <= c && c <= 'z' || '0' <= c && c <= '9' || c == '-') {
			return false
		}
	}
	return true
}

// Publish implements Control.
func (t *Table) Publish(ctx context.Context, project int64, name string, port int, by int64) (Site, error) {
	if !ValidName(name) {
		return Site{}, fmt.Errorf("%w: name %q must be 1-63 of [a-z0-9-], not starting or ending with '-'", ErrInvalid, name)
	}
	if port < 1 || port > 65535 {
		return Site{}, fmt.Errorf("%w: port %d is not in 1-65535", ErrInvalid, port)
	}
	if project <= 0 {
		return Site{}, fmt.Errorf("%w: project %d", ErrInvalid, project)
	}
	if st := t.opts.Store; st != nil {
		if _, err := st.GetProject(ctx, project); err != nil {
			if errors.Is(err, store.ErrNotFound) {
				return Site{}, fmt.Errorf("%w: project %d does not exist", ErrInvalid, project)
			}
			return Site{}, fmt.Errorf("sites: publish %q: %w", name, err)
		}
		p, err := st.PutPublication(ctx, store.Publication{Name: name, Project: project, Port: port, Owner: by})
		switch {
		case errors.Is(err, store.ErrNameTaken):
			return Site{}, fmt.Errorf("%w: %q", ErrTaken, name)
		case errors.Is(err, store.ErrNotFound):
			// Deleted since the check above.
			return Site{}, fmt.Errorf("%w: project %d does not exist", ErrInvalid, project)
		case err != nil:
			return Site{}, fmt.Errorf("sites: publish %q: %w", name, err)
		}
		t.log.Info("site published", "site", name, "project", project, "port", port, "by", by)
		return fromStore(p), nil
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if old, ok := t.sites[name]; ok && old.Project != project {
		return Site{}, fmt.Errorf("%w: %q", ErrTaken, name)
	}
	s := Site{Name: name, Project: project, Port: port, By: by, Published: t.opts.Now()}
	t.sites[name] = s
	t.log.Info("site published", "site", name, "project", project, "port", port, "by", by)
	return s, nil
}

// Unpublish implements Control.
func (t *Table) Unpublish(ctx context.Context, project int64, name string) error {
	if st := t.opts.Store; st != nil {
		err := st.DeletePublication(ctx, project, name)
		if errors.Is(err, store.ErrNotFound) {
			return fmt.Errorf("%w: %q in project %d", ErrNotFound, name, project)
		}
		if err != nil {
			return fmt.Errorf("sites: unpublish %q: %w", name, err)
		}
		t.log.Info("site unpublished", "site", name, "project", project)
		return nil
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	s, ok := t.sites[name]
	if !ok || s.Project != project {
		return fmt.Errorf("%w: %q in project %d", ErrNotFound, name, project)
	}
	delete(t.sites, name)
	t.log.Info("site unpublished", "site", name, "project", project)
	return nil
}

// Lookup implements Control.
func (t *Table) Lookup(ctx context.Context, name string) (Site, error) {
	if st := t.opts.Store; st != nil {
		p, err := st.GetPublication(ctx, name)
		if errors.Is(err, store.ErrNotFound) {
			return Site{}, fmt.Errorf("%w: %q", ErrNotFound, name)
		}
		if err != nil {
			return Site{}, fmt.Errorf("sites: lookup %q: %w", name, err)
		}
		return fromStore(p), nil
	}
	t.mu.RLock()
	defer t.mu.RUnlock()
	s, ok := t.sites[name]
	if !ok {
		return Site{}, fmt.Errorf("%w: %q", ErrNotFound, name)
	}
	return s, nil
}

// List implements Control.
func (t *Table) List(ctx context.Context, project int64) ([]Site, error) {
	if st := t.opts.Store; st != nil {
		ps, err := st.ListPublications(ctx, project)
		if err != nil {
			return nil, fmt.Errorf("sites: list: %w", err)
		}
		out := make([]Site, 0, len(ps))
		for _, p := range ps {
			out = append(out, fromStore(p))
		}
		return out, nil
	}
	t.mu.RLock()
	defer t.mu.RUnlock()
	out := []Site{}
	for _, s := range t.sites {
		if s.Project == project {
			out = append(out, s)
		}
	}
	slices.SortFunc(out, func(a, b Site) int { return strings.Compare(a.Name, b.Name) })
	return out, nil
}

func fromStore(p store.Publication) Site {
	return Site{Name: p.Name, Project: p.Project, Port: p.Port, By: p.Owner, Published: p.Created}
}
