package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/corral-sandbox/corral/image"
	"github.com/corral-sandbox/corral/image/imagetest"
	"github.com/corral-sandbox/corral/store"
)

func corralImage(t *testing.T, state, registry string, args ...string) (stdout, stderr string, status int) {
	t.Helper()
	var out, errb bytes.Buffer
	status = execute(append([]string{"image", "--state", state, "--id-registry", registry}, args...), &out, &errb)
	return out.String(), errb.String(), status
}

// TestImageCLI imports, lists and removes images with `corral image`; rm
// is refused while a project uses the image.
func TestImageCLI(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("the image store needs root")
	}
	state, reg := t.TempDir(), filepath.Join(t.TempDir(), "reg.json")
	img := imagetest.Image(t, v1.Config{User: "1000"}, imagetest.Layer(t, imagetest.File("hello", "hi", 0o644)))
	src := imagetest.DockerArchive(t, img)

	if _, errs, st := corralImage(t, state, reg, "import", src); st != 2 || !strings.Contains(errs, "--name NAME is required") {
		t.Errorf("import without --name: %d %q", st, errs)
	}
	if _, errs, st := corralImage(t, state, reg, "rm"); st != 2 || !strings.Contains(errs, "accepts 1 arg") {
		t.Errorf("rm without a name: %d %q", st, errs)
	}
	out, errs, st := corralImage(t, state, reg, "import", src, "--name", "hello")
	if st != 0 || !strings.HasPrefix(out, "hello sha256:") {
		t.Fatalf("import: %d %q %q", st, out, errs)
	}
	if _, errs, st := corralImage(t, state, reg, "import", filepath.Join(state, "nothing"), "--name", "x"); st != 1 || !strings.Contains(errs, "corral: image:") {
		t.Errorf("import of nothing: %d %q", st, errs)
	}
	out, _, st = corralImage(t, state, reg, "list")
	if st != 0 || !strings.Contains(out, "NAME") || !strings.Contains(out, "\nhello ") || strings.Contains(out, "base") {
		t.Errorf("list: %d %q", st, out)
	}
	// base appears once made.
	s, err := image.Open(filepath.Join(state, "images"), image.Options{Registry: reg})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Get(context.Background(), "base"); err != nil {
		t.Fatal(err)
	}
	out, _, st = corralImage(t, state, reg, "list", "--json")
	var ims []image.Image
	if err := json.Unmarshal([]byte(out), &ims); st != 0 || err != nil || len(ims) != 2 || ims[0].Name != "base" || ims[1].Name != "hello" || ims[1].Config.User != "1000" {
		t.Fatalf("list --json: %d %v %q", st, err, out)
	}

	ctx := context.Background()
	db, err := store.Open(ctx, filepath.Join(state, "corral.db"), store.Options{Migrate: true})
	if err != nil {
		t.Fatal(err)
	}
	p, err := db.CreateProject(ctx, store.NewProject{Kind: store.ProjectManaged, Name: "proj", Root: t.TempDir(), Image: "hello"})
	db.Close()
	if err != nil {
		t.Fatal(err)
	}
	if _, errs, st := corralImage(t, state, reg, "rm", "hello"); st != 1 || !strings.Contains(errs, "image: in use: hello (used by project(s) proj)") {
		t.Errorf("rm in use: %d %q", st, errs)
	}
	if _, errs, st := corralImage(t, state, reg, "rm", "base"); st != 0 {
		t.Errorf("rm base (no project uses it): %d %q", st, errs)
	}
	db, _ = store.Open(ctx, filepath.Join(state, "corral.db"), store.Options{})
	if err := db.SetProjectMachine(ctx, p.ID, "base", store.MachineLimits{}); err != nil {
		t.Fatal(err)
	}
	db.Close()
	if _, errs, st := corralImage(t, state, reg, "rm", "hello"); st != 0 {
		t.Errorf("rm: %d %q", st, errs)
	}
	if _, errs, st := corralImage(t, state, reg, "rm", "hello"); st != 1 || !strings.Contains(errs, "not found") {
		t.Errorf("rm again: %d %q", st, errs)
	}
	if out, _, _ := corralImage(t, state, reg, "list"); strings.Contains(out, "hello") {
		t.Errorf("list after rm: %q", out)
	}
}
