package daemon

import (
	"errors"
	"net/http"
	"path/filepath"

	"github.com/corral-sandbox/corral/api"
	"github.com/corral-sandbox/corral/image"
)

func imageJSON(im image.Image) api.Image {
	c := im.Config
	return api.Image{Name: im.Name, ID: im.ID, Digest: im.Digest, Source: im.Source, Created: im.Created,
		Size: im.Size, Layers: len(im.Layers), Config: api.ImageConfig{User: c.User, Env: c.Env,
			WorkingDir: c.WorkingDir, Entrypoint: c.Entrypoint, Cmd: c.Cmd}}
}

// imageStore opens the image store the daemon's worker builds machines
// from (StateDir/images).
func (a *App) imageStore() (*image.Store, error) {
	if a.opts.StateDir == "" {
		return nil, apiErr(http.StatusServiceUnavailable, KindUnavailable, "this daemon has no state directory, so no image store")
	}
	return image.Open(filepath.Join(a.opts.StateDir, "images"), image.Options{Logger: a.log})
}

// pullImage serves POST /v1/images {"ref":R,"name":N} (administrators):
// the image is pulled from its registry (credentials from the daemon's
// Docker configuration) into the machines' image store, as corral image
// pull does; 200 with the image. A reference or name that is not valid is
// 400; a registry that cannot be reached, refuses or lacks the image 502.
func (a *App) pullImage(w http.ResponseWriter, r *http.Request) error {
	if err := a.requireAdmin(r); err != nil {
		return err
	}
	var req api.ImagePullRequest
	if err := a.decodeBody(w, r, &req); err != nil {
		return err
	}
	if req.Ref == "" {
		return apiErr(http.StatusBadRequest, KindInvalid, "ref is required")
	}
	name := req.Name
	if name == "" {
		var err error
		if name, err = image.NameFromRef(req.Ref); err != nil {
			return apiErr(http.StatusBadRequest, KindInvalid, "%v", err)
		}
	}
	s, err := a.imageStore()
	if err != nil {
		return err
	}
	im, err := s.Pull(r.Context(), req.Ref, name)
	switch {
	case errors.Is(err, image.ErrInvalidName):
		return apiErr(http.StatusBadRequest, KindInvalid, "%v", err)
	case errors.Is(err, image.ErrUnsafe):
		return apiErr(http.StatusBadRequest, KindInvalid, "%v", err)
	case err != nil && r.Context().Err() == nil:
		return apiErr(http.StatusBadGateway, KindBadGateway, "%v", err)
	case err != nil:
		return err
	}
	writeJSON(w, http.StatusOK, imageJSON(*im))
	return nil
}

// listImages serves GET /v1/images (administrators): the machines' images
// by name.
func (a *App) listImages(w http.ResponseWriter, r *http.Request) error {
	if err := a.requireAdmin(r); err != nil {
		return err
	}
	s, err := a.imageStore()
	if err != nil {
		return err
	}
	ims, err := s.List(r.Context())
	if err != nil {
		return err
	}
	out := make([]api.Image, 0, len(ims))
	for _, im := range ims {
		out = append(out, imageJSON(im))
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}
