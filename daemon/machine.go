package daemon

import (
	"errors"
	"net/http"
	"regexp"

	"github.com/corral-sandbox/corral/api"
	"github.com/corral-sandbox/corral/projects"
	"github.com/corral-sandbox/corral/store"
)

func machineJSON(p store.Project) *api.Machine {
	if p.Kind != store.ProjectManaged {
		return nil
	}
	l := p.Limits
	return &api.Machine{Image: p.Image, Limits: api.Limits{Memory: l.Memory, Pids: l.Pids, CPUMillis: l.CPUMillis, Disk: l.Disk, Tmp: l.Tmp}}
}

// DefaultOwnerLimits are the ceilings of AppOptions.OwnerLimits' zero
// fields: the worker's default limits (worker.DefaultMemory, DefaultPids,
// DefaultCPUMillis, DefaultTmp).
var DefaultOwnerLimits = api.Limits{Memory: 1 << 30, Pids: 512, CPUMillis: 1000, Tmp: 256 << 20}

// ownerMayAsk returns a 403 error unless a project owner who is not an
// admin may ask for l under the ceilings c (AppOptions.OwnerLimits).
func ownerMayAsk(c, l api.Limits) error {
	for _, f := range []struct {
		name           string
		v, ceil, deflt int64
	}{
		{"memory", l.Memory, c.Memory, DefaultOwnerLimits.Memory},
		{"pids", l.Pids, c.Pids, DefaultOwnerLimits.Pids},
		{"cpuMillis", l.CPUMillis, c.CPUMillis, DefaultOwnerLimits.CPUMillis},
		{"tmp", l.Tmp, c.Tmp, DefaultOwnerLimits.Tmp},
		{"disk", l.Disk, c.Disk, DefaultOwnerLimits.Disk},
	} {
		ceil := f.ceil
		if ceil == 0 {
			ceil = f.deflt
		}
		switch {
		case ceil < 0:
		case f.v < 0:
			return apiErr(http.StatusForbidden, KindForbidden, "only a daemon admin may remove the %s limit of a machine", f.name)
		case ceil > 0 && f.v > ceil:
			return apiErr(http.StatusForbidden, KindForbidden, "%s limit %d is above %d, the most a project owner may set (a daemon admin may set more)", f.name, f.v, ceil)
		}
	}
	return nil
}

// imageName is the syntax of image names (package image's).
var imageName = regexp.MustCompile(`^[a-z0-9][a-z0-9._-]{0,63}$`)

// ownerOrAdmin returns the {id} project if the caller owns it or is an
// admin: 404 for an unknown project, 403 otherwise; 400 for a host
// project, which has no machine.
func (a *App) ownerOrAdmin(r *http.Request) (store.Project, error) {
	acct, _ := accountFrom(r.Context())
	var p store.Project
	if a.isAdmin(acct) {
		id, err := pathID(r)
		if err != nil {
			return store.Project{}, err
		}
		if p, err = a.store.GetProject(r.Context(), id); errors.Is(err, store.ErrNotFound) {
			return store.Project{}, apiErr(http.StatusNotFound, KindNotFound, "project %d does not exist", id)
		} else if err != nil {
			return store.Project{}, err
		}
	} else {
		_, proj, m, err := a.projectMember(r)
		if err != nil {
			return store.Project{}, err
		}
		if err := requireOwner(m, proj); err != nil {
			return store.Project{}, err
		}
		p = proj
	}
	if p.Kind != store.ProjectManaged {
		return store.Project{}, apiErr(http.StatusBadRequest, KindInvalid, "project %d is a host project: it has no machine", p.ID)
	}
	return p, nil
}

// setMachine serves PUT /v1/projects/{id}/machine (owners and admins):
// the project's image and limits.
func (a *App) setMachine(w http.ResponseWriter, r *http.Request) error {
	p, err := a.ownerOrAdmin(r)
	if err != nil {
		return err
	}
	var req api.Machine
	if err := a.decodeBody(w, r, &req); err != nil {
		return err
	}
	if req.Image == "" {
		req.Image = store.DefaultImage
	}
	if !imageName.MatchString(req.Image) {
		return apiErr(http.StatusBadRequest, KindInvalid, "invalid image name %q", req.Image)
	}
	l := req.Limits
	if acct, _ := accountFrom(r.Context()); !a.isAdmin(acct) {
		if err := ownerMayAsk(a.opts.OwnerLimits, l); err != nil {
			return err
		}
	}
	if err := a.store.SetProjectMachine(r.Context(), p.ID, req.Image,
		store.MachineLimits{Memory: l.Memory, Pids: l.Pids, CPUMillis: l.CPUMillis, Disk: l.Disk, Tmp: l.Tmp}); err != nil {
		return err
	}
	if p, err = a.store.GetProject(r.Context(), p.ID); err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, machineJSON(p))
	return nil
}

// resetMachine serves POST /v1/projects/{id}/reset (owners and admins):
// the machine's upper layer is discarded. 409 while the project has a
// live lease or its machine has sessions; 503 without a worker that can.
func (a *App) resetMachine(w http.ResponseWriter, r *http.Request) error {
	p, err := a.ownerOrAdmin(r)
	if err != nil {
		return err
	}
	if err := projects.ResetMachine(r.Context(), a.store, a.core.Gateway(), p); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}
