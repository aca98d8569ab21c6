package export

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/corral-sandbox/corral/sandbox"
	"github.com/corral-sandbox/corral/store"
)

// Defaults of SweepOptions.
const (
	DefaultSweepGrace    = 15 * time.Minute
	DefaultSweepInterval = 5 * time.Minute
)

// SweepOptions tune a Sweeper. The zero value means the defaults.
type SweepOptions struct {
	// Grace is how old a bundle's record must be before it is deleted:
	// longer than an export may take. Zero means DefaultSweepGrace.
	// Bundles of exports still running in this process are never swept.
	Grace time.Duration
	// Interval is how often Run sweeps. Zero means DefaultSweepInterval.
	Interval time.Duration
}

// Sweeper deletes bundles that exports recorded but did not delete (the
// export failed to delete them, or the process died mid-export).
type Sweeper struct {
	x    *Exporter
	opts SweepOptions
}

// Sweeper returns a sweeper of x's bundles.
func (x *Exporter) Sweeper(opts SweepOptions) *Sweeper {
	if opts.Grace <= 0 {
		opts.Grace = DefaultSweepGrace
	}
	if opts.Interval <= 0 {
		opts.Interval = DefaultSweepInterval
	}
	return &Sweeper{x: x, opts: opts}
}

// Sweep deletes, in every managed project, each recorded bundle (a live
// artifact whose path starts with BundlePrefix) older than the grace that
// no running export of this Exporter holds, and marks it deleted. It acts
// as the account that created the bundle (the owner of its lease) if that
// account is still a member, else as an owner of the project; a project
// with neither is skipped.
//
// It returns how many bundles it deleted and the errors of those it could
// not delete (joined); those stay recorded for the next sweep. An
// unavailable sandbox makes it return at once with nothing deleted. It
// blocks while it runs the deletions (each a bounded command).
func (s *Sweeper) Sweep(ctx context.Context) (int, error) {
	st := s.x.core.Store()
	projects, err := st.ListProjects(ctx)
	if err != nil {
		return 0, fmt.Errorf("export: sweep: %w", err)
	}
	cutoff := st.Now().Add(-s.opts.Grace)
	deleted := 0
	var errs []error
	for _, p := range projects {
		if p.Kind != store.ProjectManaged {
			continue
		}
		arts, err := st.ListArtifacts(ctx, p.ID, false)
		if err != nil {
			errs = append(errs, fmt.Errorf("export: sweep project %d: %w", p.ID, err))
			continue
		}
		for _, a := range arts {
			if !strings.HasPrefix(a.Path, BundlePrefix) || a.Created.After(cutoff) || s.x.running(a.ID) {
				continue
			}
			if err := s.sweepOne(ctx, p, a); err != nil {
				if errors.Is(err, sandbox.ErrUnavailable) || ctx.Err() != nil {
					return deleted, errors.Join(append(errs, err)...)
				}
				errs = append(errs, err)
				continue
			}
			deleted++
		}
	}
	return deleted, errors.Join(errs...)
}

func (s *Sweeper) sweepOne(ctx context.Context, p store.Project, a store.Artifact) error {
	actor, err := s.actor(ctx, p.ID, a.Lease)
	if err != nil {
		return err
	}
	arts, err := s.x.core.Artifacts()
	if err != nil {
		return err
	}
	ref := sandbox.ProjectRef{Kind: sandbox.ProjectManaged, ProjectID: p.ID}
	if err := deleteArtifact(ctx, s.x.core, arts, actor, ref, a.ID, a.Path); err != nil {
		return err
	}
	s.x.log.Info("export: swept a bundle", "project", p.ID, "path", a.Path, "created", a.Created)
	return nil
}

// actor picks who deletes a bundle: its lease's account if still a member,
// else an owner.
func (s *Sweeper) actor(ctx context.Context, project int64, leaseID string) (sandbox.Actor, error) {
	st := s.x.core.Store()
	if l, err := st.GetLease(ctx, leaseID); err == nil {
		if _, err := st.GetMember(ctx, project, l.Account); err == nil {
			return sandbox.Actor{AccountUserID: l.Account}, nil
		}
	}
	members, err := st.ListMembers(ctx, project)
	if err != nil {
		return sandbox.Actor{}, fmt.Errorf("export: sweep project %d: %w", project, err)
	}
	for _, m := range members {
		if m.Role == store.RoleOwner {
			return sandbox.Actor{AccountUserID: m.Account}, nil
		}
	}
	return sandbox.Actor{}, fmt.Errorf("export: sweep project %d: no member to act as", project)
}

// Run sweeps every Interval (the first time at once) until ctx ends, and
// then returns ctx's error. Failures are logged, not returned.
func (s *Sweeper) Run(ctx context.Context) error {
	t := time.NewTicker(s.opts.Interval)
	defer t.Stop()
	for {
		n, err := s.Sweep(ctx)
		if err != nil && ctx.Err() == nil {
			s.x.log.Warn("export: sweep", "deleted", n, "err", err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
}
