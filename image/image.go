package image

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	gname "github.com/google/go-containerregistry/pkg/name"

	"github.com/corral-sandbox/corral/internal/idrange"
)

// BaseName is the name of the embedded default image.
const BaseName = "base"

// IDCount is the number of host ids a store claims: the ids 0..65535 of an
// image.
const IDCount = 1 << 16

var (
	// ErrNotFound is returned for an image the store does not hold.
	ErrNotFound = errors.New("image: not found")
	// ErrInUse is returned by Remove for an image a project uses.
	ErrInUse = errors.New("image: in use")
	// ErrUnsafe is returned, wrapped with the entry's name, for a tar
	// entry that would escape the layer or carry ids outside the image's
	// 65536 (see the package documentation).
	ErrUnsafe = errors.New("image: unsafe tar entry")
	// ErrInvalidName is returned for an image name that is not a short
	// lower-case word ([a-z0-9][a-z0-9._-]{0,63}).
	ErrInvalidName = errors.New("image: invalid name")
)

// Options configure Open. The zero value is the host-wide defaults.
type Options struct {
	// Registry is the idrange registry ("" = idrange.DefaultRegistry).
	Registry string
	// Logger receives a record per unpacked layer and per base made; nil
	// discards them.
	Logger *slog.Logger
	// MaxSize is the most bytes of file content an import may unpack
	// (0 = DefaultMaxSize); an image that unpacks to more is refused with
	// ErrUnsafe. Runs of zeros are stored as holes and take no disk, but
	// count.
	MaxSize int64
}

// DefaultMaxSize is the default Options.MaxSize.
const DefaultMaxSize = 64 << 30

// Image is an image in a store.
type Image struct {
	// Name is the image's name in the store.
	Name string `json:"name"`
	// ID is the image's config digest ("sha256:..."); for base, the
	// digest of its generated record.
	ID string `json:"id"`
	// Created is when the image was imported or made.
	Created time.Time `json:"created"`
	// Size is the bytes of file content of its unpacked layers.
	Size int64 `json:"size"`
	// Layers are absolute host directories of the unpacked layers,
	// lowest first.
	Layers []string `json:"layers"`
	// HostBinds are host paths bound read-only at the same guest path on
	// top of the layers (base: "/usr"); empty for imported images.
	HostBinds []string `json:"host_binds,omitempty"`
	// Config is the image's runtime configuration.
	Config Config `json:"config"`
	// Source is where the image came from: the reference it was pulled
	// by, the archive or directory it was imported from.
	Source string `json:"source,omitempty"`
	// Digest is the digest of the image's manifest ("sha256:..."), the
	// one a registry serves it by; empty for base and for a plain root
	// filesystem.
	Digest string `json:"digest,omitempty"`
}

// Config is the part of an image's configuration a machine uses.
type Config struct {
	// User is the default user of sessions ("" = root), as the image
	// gives it: a name or uid, optionally ":group".
	User string `json:"user,omitempty"`
	// Env is the image's environment, "KEY=value" each.
	Env []string `json:"env,omitempty"`
	// WorkingDir is the default working directory ("" = unset).
	WorkingDir string `json:"working_dir,omitempty"`
	// Entrypoint and Cmd are the image's command: what runs when a
	// request gives none, Entrypoint followed by Cmd (as Docker runs a
	// container, and Kubernetes a Pod, without a command).
	Entrypoint []string `json:"entrypoint,omitempty"`
	Cmd        []string `json:"cmd,omitempty"`
}

// Store is an image store in a directory. Its methods are safe for
// concurrent use by goroutines and by processes sharing the directory.
type Store struct {
	dir     string
	ids     idrange.Range
	log     *slog.Logger
	maxSize int64
}

// Open opens the store in dir (<state>/images), creating it (mode 0700)
// if needed, and claims its block of host ids in opts.Registry. It fails
// if dir is not owned by the calling user; a mode wider than 0700 is
// tightened. Open does not unpack anything.
func Open(dir string, opts Options) (*Store, error) {
	return open(dir, opts)
}

// IDs returns the host ids files of this store are owned by: image id k
// is stored as IDs().Start+k (k < 65536).
func (s *Store) IDs() idrange.Range { return s.ids }

// Dir returns the store's directory.
func (s *Store) Dir() string { return s.dir }

// Import imports the image at src under name, replacing an image of that
// name. src is an OCI image layout directory, a docker-archive tar
// (docker save, skopeo copy … docker-archive:), an oci-archive tar
// (skopeo copy … oci-archive:), or a plain root filesystem tar (docker
// export, tar -C rootfs -c .; gzip-compressed or not), imported as an
// image of one layer and an empty configuration, as docker import does.
// An index of several images is resolved to
// the one for this host's platform. Layers already in the store are not
// unpacked again. On error nothing of the image is recorded (layers
// already unpacked stay until the next Remove collects them); a tar
// hazard is an error wrapping ErrUnsafe. Importing a name "base" is
// refused (ErrInvalidName).
func (s *Store) Import(ctx context.Context, src, name string) (*Image, error) {
	return s.importImage(ctx, src, name)
}

// Pull pulls the image ref (a registry reference: "debian:bookworm",
// "ghcr.io/org/img@sha256:...") into the store under name, replacing an
// image of that name, as Import does; an index is resolved to this host's
// platform. Credentials come from the Docker configuration
// ($DOCKER_CONFIG/config.json, ~/.docker/config.json, and its credential
// helpers: authn.DefaultKeychain); a registry on a loopback address is
// spoken to over plain HTTP. The manifest's digest is recorded
// (Image.Digest). Layers are unpacked as they download and bounded by
// Options.MaxSize; on error nothing of the image is recorded.
func (s *Store) Pull(ctx context.Context, ref, name string) (*Image, error) {
	return s.pull(ctx, ref, name)
}

// Get returns the named image. "base" is made on first use (and remade
// when its record is from an older generator); an unknown name is
// ErrNotFound.
func (s *Store) Get(ctx context.Context, name string) (*Image, error) {
	return s.get(ctx, name)
}

// List returns the store's images, by name. base appears once made.
func (s *Store) List(ctx context.Context) ([]Image, error) {
	return s.list(ctx)
}

// Remove removes the named image, unless inUse (which may be nil) says a
// project uses it (ErrInUse), and then deletes the layers no remaining
// image names. An unknown name is ErrNotFound. "base" may be removed: the
// next Get("base") makes it again. Remove waits for imports in progress.
func (s *Store) Remove(ctx context.Context, name string, inUse func(name string) (bool, error)) error {
	return s.remove(ctx, name, inUse)
}

// NameFromRef is the default store name of an image pulled by ref: the
// last part of its repository, lower-case ("debian" for
// docker.io/library/debian:bookworm).
func NameFromRef(ref string) (string, error) {
	r, err := gname.ParseReference(ref)
	if err != nil {
		return "", fmt.Errorf("image: %s: %w", ref, err)
	}
	repo := r.Context().RepositoryStr()
	return strings.ToLower(repo[strings.LastIndexByte(repo, '/')+1:]), nil
}
