package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/corral-sandbox/corral/image"
	"github.com/corral-sandbox/corral/image/imagetest"
	"github.com/corral-sandbox/corral/store"
	"github.com/corral-sandbox/corral/worker"
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

// TestImagePullAndConfig: `corral image pull` from a registry the test
// starts records the image and its digest; a run without a command runs
// its Entrypoint and Cmd as its User in its WorkingDir with its Env (PATH
// included), the request's -e over it; `corral image import` of a plain
// root filesystem tar makes an image runs use as root with the default
// PATH.
func TestImagePullAndConfig(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("managed projects need root (CI runs as root)")
	}
	t.Setenv("CORRAL_TEST_AS_MAIN", "1")
	bin := filepath.Join(t.TempDir(), "showenv")
	build := exec.Command("go", "build", "-o", bin, "./testdata/showenv")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	prog, err := os.ReadFile(bin)
	if err != nil {
		t.Fatal(err)
	}
	files := append(loaderOf(t, os.Args[0]), imagetest.Dir("bin", 0o755), imagetest.File("bin/showenv", string(prog), 0o755), imagetest.Dir("tmp", 0o1777))
	img := imagetest.Image(t, v1.Config{
		User: "1234", Env: []string{"PATH=/opt/tools:/bin", "FOO=image"}, WorkingDir: "/workspace/sub",
		Entrypoint: []string{"/bin/showenv", "entry"}, Cmd: []string{"cmd"},
	}, imagetest.Layer(t, files...))
	host := imagetest.Registry(t)
	digest := imagetest.Push(t, host+"/tools/showenv:v1", img)

	state := t.TempDir()
	var out, errb bytes.Buffer
	if st := execute([]string{"image", "pull", "--state", state, host + "/tools/showenv:v1"}, &out, &errb); st != 0 || !strings.HasPrefix(out.String(), "showenv sha256:") || !strings.Contains(out.String(), digest) {
		t.Fatalf("image pull: %d %q %q", st, out.String(), errb.String())
	}
	out.Reset()
	if st := execute([]string{"image", "list", "--state", state, "--json"}, &out, &errb); st != 0 || !strings.Contains(out.String(), `"digest": "`+digest+`"`) {
		t.Fatalf("image list: %d %q", st, out.String())
	}

	ws := filepath.Join(t.TempDir(), "proj")
	if err := os.MkdirAll(filepath.Join(ws, "sub"), 0o755); err != nil {
		t.Fatal(err)
	}
	got, errs, status := corral(t, state, "--project", ws, "--image", "showenv")
	if want := "args=entry,cmd uid=1234 cwd=/workspace/sub PATH=/opt/tools:/bin FOO=image\n"; status != 0 || got != want {
		t.Fatalf("run without a command: %d %q %q, want %q", status, got, errs, want)
	}
	got, errs, status = corral(t, state, "--project", ws, "-e", "FOO=request", "-u", "0", "-w", "/workspace", "--", "/bin/showenv", "given")
	if want := "args=given uid=0 cwd=/workspace PATH=/opt/tools:/bin FOO=request\n"; status != 0 || got != want {
		t.Fatalf("run with a command: %d %q %q, want %q", status, got, errs, want)
	}

	rootfs := filepath.Join(t.TempDir(), "rootfs.tar")
	if err := os.WriteFile(rootfs, imagetest.Tar(t, files...), 0o644); err != nil {
		t.Fatal(err)
	}
	out.Reset()
	if st := execute([]string{"image", "import", "--state", state, rootfs, "--name", "plain"}, &out, &errb); st != 0 {
		t.Fatalf("import of a root filesystem tar: %d %q", st, errb.String())
	}
	got, errs, status = corral(t, state, "--project", ws, "--image", "plain", "--", "/bin/showenv")
	if want := "args= uid=0 cwd=/workspace PATH=" + worker.DefaultPath + " FOO=\n"; status != 0 || got != want {
		t.Fatalf("run in the imported root filesystem: %d %q %q, want %q", status, got, errs, want)
	}
	if _, errs, status = corral(t, state, "--project", ws); status != 125 || !strings.Contains(errs, "no Entrypoint or Cmd") {
		t.Fatalf("no command and none in the image: %d %q", status, errs)
	}
}

// loaderOf is the dynamic loader and libraries of the program at path, as
// image entries at their host paths: what an image without a libc needs for
// the machine's init to run its pid namespace holders (this binary,
// through /proc/self/exe, where the image has no GNU env and sleep). None
// for a static program.
func loaderOf(t *testing.T, path string) []imagetest.Entry {
	out, err := exec.Command("ldd", path).Output()
	if err != nil {
		return nil // "not a dynamic executable"
	}
	var entries []imagetest.Entry
	for _, line := range strings.Split(string(out), "\n") {
		f := strings.Fields(line)
		lib := ""
		switch {
		case len(f) >= 3 && f[1] == "=>" && strings.HasPrefix(f[2], "/"):
			lib = f[2]
		case len(f) >= 1 && strings.HasPrefix(f[0], "/"):
			lib = f[0]
		}
		if lib == "" {
			continue
		}
		b, err := os.ReadFile(lib)
		if err != nil {
			t.Fatal(err)
		}
		entries = append(entries, imagetest.File(strings.TrimPrefix(lib, "/"), string(b), 0o755))
	}
	return entries
}
