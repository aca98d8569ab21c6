package image

import (
	"archive/tar"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"time"

	"golang.org/x/sys/unix"

	"github.com/google/go-containerregistry/pkg/authn"
	gname "github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// layerMeta is layers/<layer>.json, written before the layer's directory
// is renamed into place.
type layerMeta struct {
	Size  int64 `json:"size"`
	Files int   `json:"files"`
}

func (s *Store) importImage(ctx context.Context, src, name string) (*Image, error) {
	if err := checkImportName(name); err != nil {
		return nil, err
	}
	unlock, err := s.lock(ctx, false)
	if err != nil {
		return nil, err
	}
	defer unlock()
	img, cleanup, err := s.open(ctx, src)
	if err != nil {
		return nil, err
	}
	defer cleanup()
	return s.record(ctx, img, name, src, "")
}

func (s *Store) pull(ctx context.Context, ref, name string) (*Image, error) {
	if err := checkImportName(name); err != nil {
		return nil, err
	}
	r, err := gname.ParseReference(ref)
	if err != nil {
		return nil, fmt.Errorf("image: pull %s: %w", ref, err)
	}
	unlock, err := s.lock(ctx, false)
	if err != nil {
		return nil, err
	}
	defer unlock()
	img, err := remote.Image(r, remote.WithContext(ctx), remote.WithAuthFromKeychain(authn.DefaultKeychain),
		remote.WithPlatform(v1.Platform{OS: "linux", Architecture: runtime.GOARCH}))
	if err != nil {
		return nil, fmt.Errorf("image: pull %s: %w", ref, err)
	}
	digest, err := img.Digest()
	if err != nil {
		return nil, fmt.Errorf("image: pull %s: %w", ref, err)
	}
	return s.record(ctx, img, name, r.Name(), digest.String())
}

// checkImportName refuses a name an import or a pull may not take.
func checkImportName(name string) error {
	if err := checkName(name); err != nil {
		return err
	}
	if name == BaseName {
		return fmt.Errorf("%w: %q is the embedded image", ErrInvalidName, name)
	}
	return nil
}

// record unpacks img's layers and records it under name, from src (with
// its manifest digest, if known).
func (s *Store) record(ctx context.Context, img v1.Image, name, src, digest string) (*Image, error) {
	id, err := img.ConfigName()
	if err != nil {
		return nil, fmt.Errorf("image: %s: config: %w", src, err)
	}
	cfg, err := img.ConfigFile()
	if err != nil {
		return nil, fmt.Errorf("image: %s: config: %w", src, err)
	}
	layers, err := img.Layers()
	if err != nil {
		return nil, fmt.Errorf("image: %s: layers: %w", src, err)
	}
	r := &record{
		Name:    name,
		ID:      id.String(),
		Created: time.Now().UTC(),
		Config: Config{
			User:       cfg.Config.User,
			Env:        cfg.Config.Env,
			WorkingDir: cfg.Config.WorkingDir,
			Entrypoint: cfg.Config.Entrypoint,
			Cmd:        cfg.Config.Cmd,
		},
		Source: src,
		Digest: digest,
	}
	for _, l := range layers {
		dir, meta, err := s.ensureLayer(ctx, l, s.maxSize-r.Size)
		if err != nil {
			return nil, fmt.Errorf("image: %s: %w", src, err)
		}
		r.Layers = append(r.Layers, dir)
		r.Size += meta.Size
	}
	if err := s.writeRecord(r); err != nil {
		return nil, err
	}
	s.log.Info("image: imported", "name", name, "id", r.ID, "layers", len(r.Layers), "size", r.Size)
	return s.toImage(r), nil
}

// open returns the image at src and a cleanup to run when done with it.
func (s *Store) open(ctx context.Context, src string) (v1.Image, func(), error) {
	nop := func() {}
	st, err := os.Stat(src)
	if err != nil {
		return nil, nop, fmt.Errorf("image: %w", err)
	}
	if st.IsDir() {
		img, err := fromLayout(src)
		return img, nop, err
	}
	kind, err := archiveKind(src)
	if err != nil {
		return nil, nop, err
	}
	switch kind {
	case "rootfs":
		// As docker import: the tar is the one layer, the configuration
		// empty (root, the worker's PATH, no command).
		layer, err := tarball.LayerFromFile(src)
		if err != nil {
			return nil, nop, fmt.Errorf("image: %s: %w", src, err)
		}
		img, err := mutate.AppendLayers(empty.Image, layer)
		if err != nil {
			return nil, nop, fmt.Errorf("image: %s: %w", src, err)
		}
		return img, nop, nil
	case "docker-archive":
		img, err := tarball.ImageFromPath(src, nil)
		if err != nil {
			return nil, nop, fmt.Errorf("image: %s: %w", src, err)
		}
		return img, nop, nil
	default: // oci-archive: an OCI layout in a tar
		tmp, err := os.MkdirTemp(filepath.Join(s.dir, tmpDir), "oci-archive-")
		if err != nil {
			return nil, nop, fmt.Errorf("image: %w", err)
		}
		cleanup := func() { os.RemoveAll(tmp) }
		f, err := os.Open(src)
		if err != nil {
			cleanup()
			return nil, nop, fmt.Errorf("image: %w", err)
		}
		_, _, err = unpack(ctx, f, tmp, modePlain, 0, s.maxSize)
		f.Close()
		if err != nil {
			cleanup()
			return nil, nop, fmt.Errorf("image: %s: %w", src, err)
		}
		img, err := fromLayout(tmp)
		if err != nil {
			cleanup()
			return nil, nop, fmt.Errorf("image: %s: %w", src, err)
		}
		return img, cleanup, nil
	}
}

// archiveKind tells a docker-archive (manifest.json; docker save since 25
// writes an OCI layout beside it) from an oci-archive (oci-layout) and
// from a plain root filesystem ("rootfs": a tar with neither, or a
// compressed tar, which image archives are not).
func archiveKind(src string) (string, error) {
	f, err := os.Open(src)
	if err != nil {
		return "", fmt.Errorf("image: %w", err)
	}
	defer f.Close()
	magic := make([]byte, 4)
	if n, _ := io.ReadFull(f, magic); n >= 2 && magic[0] == 0x1f && magic[1] == 0x8b ||
		n == 4 && string(magic) == "\x28\xb5\x2f\xfd" {
		return "rootfs", nil // gzip, zstd
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return "", fmt.Errorf("image: %w", err)
	}
	tr := tar.NewReader(f)
	oci := false
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return "", fmt.Errorf("image: %s: not an image archive: %w", src, err)
		}
		switch n, _ := cleanName(hdr.Name); n {
		case "manifest.json":
			return "docker-archive", nil
		case "oci-layout":
			oci = true
		}
	}
	if oci {
		return "oci-archive", nil
	}
	return "rootfs", nil
}

// fromLayout returns the image of an OCI layout: its only image, or the
// one for this host's platform.
func fromLayout(dir string) (v1.Image, error) {
	idx, err := layout.ImageIndexFromPath(dir)
	if err != nil {
		return nil, fmt.Errorf("image: %s: %w", dir, err)
	}
	img, err := pick(idx, 0)
	if err != nil {
		return nil, fmt.Errorf("image: %s: %w", dir, err)
	}
	return img, nil
}

func pick(idx v1.ImageIndex, depth int) (v1.Image, error) {
	if depth > 4 {
		return nil, errors.New("image indexes nested too deep")
	}
	m, err := idx.IndexManifest()
	if err != nil {
		return nil, err
	}
	want := v1.Platform{OS: "linux", Architecture: runtime.GOARCH}
	var cands []v1.Descriptor
	for _, d := range m.Manifests {
		if d.Platform != nil && d.Platform.OS != "" && !d.Platform.Satisfies(want) {
			continue
		}
		cands = append(cands, d)
	}
	if len(cands) == 0 {
		return nil, fmt.Errorf("no image for %s among %d", want.String(), len(m.Manifests))
	}
	// Prefer an explicit platform match over an unlabelled manifest.
	d := cands[0]
	for _, c := range cands {
		if c.Platform != nil && c.Platform.OS != "" {
			d = c
			break
		}
	}
	if len(cands) > 1 && (d.Platform == nil || d.Platform.OS == "") {
		return nil, fmt.Errorf("%d images and none labelled for %s", len(cands), want.String())
	}
	switch d.MediaType {
	case types.OCIImageIndex, types.DockerManifestList:
		sub, err := idx.ImageIndex(d.Digest)
		if err != nil {
			return nil, err
		}
		return pick(sub, depth+1)
	}
	return idx.Image(d.Digest)
}

// ensureLayer unpacks l into layers/sha256-<hex> unless it is there, and
// returns that directory's name and its metadata.
func (s *Store) ensureLayer(ctx context.Context, l v1.Layer, limit int64) (string, layerMeta, error) {
	diff, err := l.DiffID()
	if err != nil {
		return "", layerMeta{}, fmt.Errorf("layer: %w", err)
	}
	if diff.Algorithm != "sha256" || len(diff.Hex) != 64 {
		return "", layerMeta{}, fmt.Errorf("layer %s: unsupported digest", diff)
	}
	if _, err := hex.DecodeString(diff.Hex); err != nil {
		return "", layerMeta{}, fmt.Errorf("layer %s: bad digest", diff)
	}
	name := "sha256-" + diff.Hex
	final := filepath.Join(s.dir, layersDir, name)
	if meta, err := s.layerMeta(name); err == nil {
		if _, err := os.Lstat(final); err == nil {
			return name, meta, nil
		}
	}
	start := time.Now()
	tmp, err := os.MkdirTemp(filepath.Join(s.dir, tmpDir), "layer-")
	if err != nil {
		return "", layerMeta{}, err
	}
	done := false
	defer func() {
		if !done {
			os.RemoveAll(tmp)
		}
	}()
	rc, err := l.Uncompressed()
	if err != nil {
		return "", layerMeta{}, fmt.Errorf("layer %s: %w", diff, err)
	}
	defer rc.Close()
	h := sha256.New()
	in := io.TeeReader(rc, h)
	var meta layerMeta
	meta.Size, meta.Files, err = unpack(ctx, in, tmp, modeLayer, s.ids.Start, limit)
	if err != nil {
		return "", layerMeta{}, fmt.Errorf("layer %s: %w", diff, err)
	}
	// The tar's end-of-archive padding counts towards the digest.
	if _, err := io.Copy(io.Discard, in); err != nil {
		return "", layerMeta{}, fmt.Errorf("layer %s: %w", diff, err)
	}
	if got := hex.EncodeToString(h.Sum(nil)); got != diff.Hex {
		return "", layerMeta{}, fmt.Errorf("layer %s: content has digest sha256:%s", diff, got)
	}
	if err := s.writeLayerMeta(name, meta); err != nil {
		return "", layerMeta{}, err
	}
	if err := os.Rename(tmp, final); err != nil {
		if errors.Is(err, fs.ErrExist) || errors.Is(err, unix.ENOTEMPTY) {
			// Another import unpacked it meanwhile: keep theirs.
			return name, meta, nil
		}
		return "", layerMeta{}, fmt.Errorf("layer %s: %w", diff, err)
	}
	done = true
	s.log.Info("image: layer unpacked", "layer", diff.String(), "files", meta.Files, "size", meta.Size, "duration", time.Since(start))
	return name, meta, nil
}

func (s *Store) layerMeta(name string) (layerMeta, error) {
	var m layerMeta
	b, err := os.ReadFile(filepath.Join(s.dir, layersDir, name+".json"))
	if err == nil {
		err = json.Unmarshal(b, &m)
	}
	return m, err
}

func (s *Store) writeLayerMeta(name string, m layerMeta) error {
	b, _ := json.Marshal(m)
	p := filepath.Join(s.dir, layersDir, name+".json")
	tmp := p + "." + randHex() + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return err
	}
	if err := os.Rename(tmp, p); err != nil {
		os.Remove(tmp)
		return err
	}
	return nil
}
