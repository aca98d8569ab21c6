package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/spf13/cobra"

	"github.com/corral-sandbox/corral/image"
	"github.com/corral-sandbox/corral/store"
)

// The image subcommands work on the image store STATE/images directly
// (the daemon may be running: the store locks itself); rm consults
// the store (--store, default STATE/corral.db) for the projects that use
// the image.

type imageFlags struct {
	state    stateFlags
	registry string // the idrange registry: hidden, for tests
}

func (f *imageFlags) open(ctx context.Context) (string, *image.Store, error) {
	dir, err := stateDir(f.state.dir)
	if err != nil {
		return "", nil, err
	}
	// The state directory as the other commands make it; the store
	// inside is 0700.
	if err := os.MkdirAll(dir, 0o711); err != nil {
		return "", nil, fmt.Errorf("state directory: %w", err)
	}
	s, err := image.Open(filepath.Join(dir, "images"), image.Options{Registry: f.registry, Logger: cliLogger()})
	return dir, s, err
}

// add runs an import or a pull into the store and reports the image: its
// name, id, digest (when known), layers, size and the time it took.
func (f *imageFlags) add(cmd *cobra.Command, add func(*image.Store) (*image.Image, error)) error {
	_, s, err := f.open(cmd.Context())
	if err != nil {
		return imageFailed(cmd, err)
	}
	start := time.Now()
	im, err := add(s)
	if err != nil {
		return imageFailed(cmd, err)
	}
	id := im.ID
	if im.Digest != "" {
		id += " " + im.Digest
	}
	fmt.Fprintf(cmd.OutOrStdout(), "%s %s (%d layers, %s) in %v\n", im.Name, id, len(im.Layers), mib(im.Size), time.Since(start).Round(time.Millisecond))
	return nil
}

// imageFailed reports an operational failure (exit status 1; usage
// errors are 2).
func imageFailed(cmd *cobra.Command, err error) error {
	fmt.Fprintf(cmd.ErrOrStderr(), "corral: %v\n", err)
	return exitError{1}
}

func newImageCmd() *cobra.Command {
	var f imageFlags
	cmd := &cobra.Command{
		Use:   "image",
		Short: "Manage the root filesystem images of machines",
		Long: `Manage the images machines are built from, kept in STATE/images.

The image "base" is made from the host on first use: the host's /usr
read-only and a generated /etc with only root and the guest user "user".`,
	}
	stateFlag(cmd, &f.state)
	cmd.PersistentFlags().StringVar(&f.registry, "id-registry", "", "the host id registry `FILE` (for tests)")
	cmd.PersistentFlags().MarkHidden("id-registry")

	var name string
	imp := &cobra.Command{
		Use:   "import SOURCE --name NAME",
		Short: "Import an OCI image layout directory, an image tarball or a root filesystem tar",
		Long: `Import the image at SOURCE under NAME, replacing an image of that name.

SOURCE is an OCI image layout directory, a docker-archive tar (docker save,
skopeo copy ... docker-archive:FILE), an oci-archive tar (skopeo copy ...
oci-archive:FILE), or a plain root filesystem tar, gzipped or not (docker
export, tar -C rootfs -cf rootfs.tar .), which becomes an image of one layer
with an empty configuration (root, the default PATH), as docker import makes.
Layers are unpacked once and shared between images; an archive that would
write outside its tree is refused.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if name == "" {
				return errors.New("image import: --name NAME is required")
			}
			return f.add(cmd, func(s *image.Store) (*image.Image, error) { return s.Import(cmd.Context(), args[0], name) })
		},
	}
	imp.Flags().StringVar(&name, "name", "", "the image's `NAME` ([a-z0-9][a-z0-9._-]*)")

	var pullName string
	pull := &cobra.Command{
		Use:   "pull REF [--name NAME]",
		Short: "Pull an image from a registry",
		Long: `Pull the image REF (debian:bookworm, ghcr.io/org/tool:v1, REPO@sha256:...)
from its registry under NAME (default: the last part of its repository,
"debian" for debian:bookworm), replacing an image of that name. An index is
resolved to this host's platform. Credentials are the Docker configuration's
($DOCKER_CONFIG/config.json or ~/.docker/config.json, with its credential
helpers: what docker login wrote); registries on loopback addresses are
spoken to over plain HTTP. The manifest's digest is recorded (image list
--json shows it). Layers are unpacked as they arrive, once, shared with other
images.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			n := pullName
			if n == "" {
				var err error
				if n, err = image.NameFromRef(args[0]); err != nil {
					return err
				}
			}
			return f.add(cmd, func(s *image.Store) (*image.Image, error) { return s.Pull(cmd.Context(), args[0], n) })
		},
	}
	pull.Flags().StringVar(&pullName, "name", "", "the image's `NAME` (default: the last part of REF's repository)")

	var asJSON bool
	list := &cobra.Command{
		Use:   "list [--json]",
		Short: "List images",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			_, s, err := f.open(cmd.Context())
			if err != nil {
				return imageFailed(cmd, err)
			}
			ims, err := s.List(cmd.Context())
			if err != nil {
				return imageFailed(cmd, err)
			}
			return listing[image.Image]{
				items:  ims,
				header: "NAME\tID\tLAYERS\tSIZE\tCREATED",
				row: func(im image.Image) []any {
					id := im.ID
					if len(id) > 19 {
						id = id[:19]
					}
					return []any{im.Name, id, len(im.Layers), mib(im.Size), im.Created.Local().Format(time.DateTime)}
				},
			}.print(cmd, asJSON)
		},
	}
	list.Flags().BoolVar(&asJSON, "json", false, "print the images as JSON")

	rm := &cobra.Command{
		Use:   "rm NAME",
		Short: "Remove an image no project uses",
		Long: `Remove the image NAME and the layers no other image shares. An image a
project uses is refused. Removing "base" is allowed while no project uses it:
it is made again on next use.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			dir, s, err := f.open(ctx)
			if err != nil {
				return imageFailed(cmd, err)
			}
			u, err := storeURL(f.state.store, dir)
			if err != nil {
				return imageFailed(cmd, err)
			}
			db, err := store.Open(ctx, u, store.Options{Migrate: true})
			if err != nil {
				return imageFailed(cmd, err)
			}
			defer db.Close()
			var users []store.Project
			err = s.Remove(ctx, args[0], func(name string) (bool, error) {
				users, err = db.ProjectsUsingImage(ctx, name)
				return len(users) > 0, err
			})
			if errors.Is(err, image.ErrInUse) {
				names := ""
				for i, p := range users {
					if i > 0 {
						names += ", "
					}
					names += p.Name
				}
				err = fmt.Errorf("%w (used by project(s) %s)", err, names)
			}
			if err != nil {
				return imageFailed(cmd, err)
			}
			return nil
		},
	}
	cmd.AddCommand(imp, pull, list, rm)
	return cmd
}

// mib formats a size in MiB with one decimal.
func mib(n int64) string { return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20)) }
