package image

import (
	"archive/tar"
	"bytes"
	"context"
	"os"
	"path/filepath"
	"testing"
)

func fuzzTar(entries ...tar.Header) []byte {
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	for _, h := range entries {
		tw.WriteHeader(&h)
	}
	tw.Close()
	return b.Bytes()
}

// FuzzUnpack feeds arbitrary tar streams to the layer unpacker: it must
// not panic, and whatever it accepts or refuses, nothing appears outside
// the tree (a sibling directory, which a symlink entry may point at,
// stays empty).
func FuzzUnpack(f *testing.F) {
	if os.Geteuid() != 0 {
		f.Skip("needs root: the unpacker chowns")
	}
	for _, seed := range [][]tar.Header{
		{{Name: "link", Typeflag: tar.TypeSymlink, Linkname: "../outside"}, {Name: "link/x", Typeflag: tar.TypeReg}},
		{{Name: "a/", Typeflag: tar.TypeDir, Mode: 0o755}, {Name: "a/../../outside/x", Typeflag: tar.TypeReg}},
		{{Name: "h", Typeflag: tar.TypeLink, Linkname: "../outside/x"}},
		{{Name: "d/", Typeflag: tar.TypeDir}, {Name: "d/.wh..wh..opq", Typeflag: tar.TypeReg}, {Name: "d/.wh.x", Typeflag: tar.TypeReg}},
		{{Name: "f", Typeflag: tar.TypeReg, Mode: 0o4755}, {Name: "f", Typeflag: tar.TypeDir}, {Name: "f/g", Typeflag: tar.TypeLink, Linkname: "f"}},
	} {
		f.Add(fuzzTar(seed...))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		base := t.TempDir()
		root, outside := filepath.Join(base, "root"), filepath.Join(base, "outside")
		if err := os.Mkdir(root, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.Mkdir(outside, 0o700); err != nil {
			t.Fatal(err)
		}
		unpack(context.Background(), bytes.NewReader(b), root, modeLayer, 1<<24, 1<<20)
		if ents, _ := os.ReadDir(outside); len(ents) != 0 {
			t.Fatalf("wrote outside the tree: %v", ents)
		}
		if ents, _ := os.ReadDir(base); len(ents) != 2 {
			t.Fatalf("wrote beside the tree: %v", ents)
		}
	})
}
