package worker

import (
	"context"
	"errors"
	"fmt"

	"github.com/corral-sandbox/corral/image"
	"github.com/corral-sandbox/corral/internal/idrange"
	"github.com/corral-sandbox/corral/wire"
	"github.com/corral-sandbox/corral/worker/internal/ctl"
)

// imageStore is what the worker needs of an image store (*image.Store).
type imageStore interface {
	Get(ctx context.Context, name string) (*image.Image, error)
	IDs() idrange.Range
}

// resolveImage returns the named image (empty: image.BaseName), or a
// *rejection "bad-image" for one the store does not hold or cannot use.
func (w *Worker) resolveImage(ctx context.Context, name string) (*image.Image, error) {
	if name == "" {
		name = image.BaseName
	}
	img, err := w.images.Get(ctx, name)
	switch {
	case errors.Is(err, image.ErrNotFound), errors.Is(err, image.ErrInvalidName):
		return nil, &rejection{wire.CodeBadImage, fmt.Sprintf("no image %q in the worker's image store %s (import it with corral image import)", name, w.cfg.ImagesDir)}
	case err != nil:
		return nil, &rejection{wire.CodeBadImage, fmt.Sprintf("image %q: %v", name, err)}
	case len(img.Layers) > ctl.MaxLayers:
		return nil, &rejection{wire.CodeBadImage, fmt.Sprintf("image %q has %d layers; a machine mounts at most %d", name, len(img.Layers), ctl.MaxLayers)}
	case len(img.HostBinds) > ctl.MaxHostBinds:
		return nil, &rejection{wire.CodeBadImage, fmt.Sprintf("image %q binds %d host paths; at most %d", name, len(img.HostBinds), ctl.MaxHostBinds)}
	}
	return img, nil
}
