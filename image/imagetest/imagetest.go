// Package imagetest builds real images for tests: small synthetic ones
// from tar entries written in the test, and a Debian root filesystem made
// by mmdebstrap.
package imagetest

import (
	"archive/tar"
	"bytes"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// Entry is one tar entry of a synthetic layer. A zero ModTime is
// [Epoch]; a regular file's Size is set from Body.
type Entry struct {
	tar.Header
	Body string
}

// Epoch is the modification time of entries that give none.
var Epoch = time.Date(2024, 5, 6, 7, 8, 9, 0, time.UTC)

// Dir, File, Symlink and Hardlink make the common entries, owned by 0:0.
func Dir(name string, mode int64) Entry {
	return Entry{Header: tar.Header{Typeflag: tar.TypeDir, Name: name, Mode: mode}}
}

// File is a regular file entry.
func File(name, body string, mode int64) Entry {
	return Entry{Header: tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: mode}, Body: body}
}

// Symlink is a symlink entry.
func Symlink(name, target string) Entry {
	return Entry{Header: tar.Header{Typeflag: tar.TypeSymlink, Name: name, Linkname: target, Mode: 0o777}}
}

// Hardlink is a hard link entry.
func Hardlink(name, target string) Entry {
	return Entry{Header: tar.Header{Typeflag: tar.TypeLink, Name: name, Linkname: target}}
}

// Tar returns the tar archive of entries, in order.
func Tar(t testing.TB, entries ...Entry) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		h := e.Header
		if h.ModTime.IsZero() {
			h.ModTime = Epoch
		}
		if h.Typeflag == tar.TypeReg {
			h.Size = int64(len(e.Body))
		}
		if h.Format == tar.FormatUnknown && len(h.PAXRecords) > 0 {
			h.Format = tar.FormatPAX
		}
		if err := tw.WriteHeader(&h); err != nil {
			t.Fatalf("imagetest: tar header %q: %v", h.Name, err)
		}
		if _, err := io.WriteString(tw, e.Body); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// Layer returns a (gzip-compressed) layer of entries.
func Layer(t testing.TB, entries ...Entry) v1.Layer {
	t.Helper()
	b := Tar(t, entries...)
	l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(b)), nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// Image returns an image of layers (lowest first) with cfg's User, Env
// and WorkingDir.
func Image(t testing.TB, cfg v1.Config, layers ...v1.Layer) v1.Image {
	t.Helper()
	img, err := mutate.AppendLayers(empty.Image, layers...)
	if err != nil {
		t.Fatal(err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", runtime.GOARCH
	cf.Config = cfg
	if img, err = mutate.ConfigFile(img, cf); err != nil {
		t.Fatal(err)
	}
	return img
}

// Layout writes img as an OCI image layout in a new directory under
// t.TempDir() and returns it.
func Layout(t testing.TB, img v1.Image) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "layout")
	p, err := layout.Write(dir, empty.Index)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.AppendImage(img); err != nil {
		t.Fatal(err)
	}
	return dir
}

// DockerArchive writes img as a docker-archive tar (docker save's format)
// and returns its path.
func DockerArchive(t testing.TB, img v1.Image) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "docker-archive.tar")
	tag, err := name.NewTag("corral.invalid/test:latest")
	if err != nil {
		t.Fatal(err)
	}
	if err := tarball.WriteToFile(p, tag, img); err != nil {
		t.Fatal(err)
	}
	return p
}

// OCIArchive writes img as an oci-archive tar (an OCI layout in a tar, as
// skopeo copy … oci-archive: writes) and returns its path.
func OCIArchive(t testing.TB, img v1.Image) string {
	t.Helper()
	dir := Layout(t, img)
	p := filepath.Join(t.TempDir(), "oci-archive.tar")
	f, err := os.Create(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	tw := tar.NewWriter(f)
	err = filepath.Walk(dir, func(path string, fi os.FileInfo, err error) error {
		if err != nil || path == dir {
			return err
		}
		rel, _ := filepath.Rel(dir, path)
		h, err := tar.FileInfoHeader(fi, "")
		if err != nil {
			return err
		}
		h.Name = filepath.ToSlash(rel)
		if fi.IsDir() {
			h.Name += "/"
		}
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
		if fi.Mode().IsRegular() {
			b, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			_, err = tw.Write(b)
			return err
		}
		return nil
	})
	if err == nil {
		err = tw.Close()
	}
	if err != nil {
		t.Fatal(err)
	}
	return p
}
