package image_test

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"io/fs"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"golang.org/x/sys/unix"

	"github.com/corral-sandbox/corral/image"
	"github.com/corral-sandbox/corral/image/imagetest"
)

func needRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: the store chowns files into its block of host ids")
	}
}

type logBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logBuf) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logBuf) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// newStore opens a store in a temporary state directory with its own id
// registry.
func newStore(t *testing.T) (*image.Store, *logBuf) {
	t.Helper()
	needRoot(t)
	state := t.TempDir()
	// Only the store's own mode keeps other users out.
	for _, d := range []string{filepath.Dir(state), state} {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	var log logBuf
	s, err := image.Open(filepath.Join(state, "images"), image.Options{
		Registry: filepath.Join(t.TempDir(), "id-ranges.json"),
		Logger:   slog.New(slog.NewTextHandler(&log, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	return s, &log
}

func lstat(t *testing.T, p string) *unix.Stat_t {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Lstat(p, &st); err != nil {
		t.Fatal(err)
	}
	return &st
}

func xattr(p, name string) (string, error) {
	buf := make([]byte, 256)
	n, err := unix.Lgetxattr(p, name, buf)
	if err != nil {
		return "", err
	}
	return string(buf[:n]), nil
}

func withPAX(e imagetest.Entry, kv ...string) imagetest.Entry {
	e.PAXRecords = map[string]string{}
	for i := 0; i < len(kv); i += 2 {
		e.PAXRecords[kv[i]] = kv[i+1]
	}
	return e
}

func owned(e imagetest.Entry, uid, gid int) imagetest.Entry {
	e.Uid, e.Gid = uid, gid
	return e
}

func TestOpenTightensAndRefuses(t *testing.T) {
	needRoot(t)
	dir := filepath.Join(t.TempDir(), "images")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	reg := filepath.Join(t.TempDir(), "reg.json")
	s, err := image.Open(dir, image.Options{Registry: reg})
	if err != nil {
		t.Fatal(err)
	}
	if st := lstat(t, dir); st.Mode&0o777 != 0o700 {
		t.Errorf("store mode %o, want 0700", st.Mode&0o777)
	}
	if s.IDs().Size != image.IDCount || s.IDs().Start == 0 {
		t.Errorf("ids %+v", s.IDs())
	}
	// The same directory keeps its ids.
	s2, err := image.Open(dir, image.Options{Registry: reg})
	if err != nil || s2.IDs() != s.IDs() {
		t.Errorf("reopen: %+v %v, want %+v", s2, err, s.IDs())
	}
	other := filepath.Join(t.TempDir(), "images")
	os.Mkdir(other, 0o700)
	os.Chown(other, 1000, 1000)
	if _, err := image.Open(other, image.Options{Registry: reg}); err == nil {
		t.Error("a store owned by another user opened")
	}
}

// TestImport imports a two-layer image and checks every rule of
// unpacking on disk, then mounts the layers as an overlay with userxattr
// to check that the whiteouts hide what they should.
func TestImport(t *testing.T) {
	s, _ := newStore(t)
	ctx := context.Background()
	start := int(s.IDs().Start)
	mtime := time.Date(2001, 2, 3, 4, 5, 6, 0, time.UTC)
	old := imagetest.File("etc/old", "old\n", 0o644)
	old.ModTime = mtime
	low := imagetest.Layer(t,
		imagetest.Dir("./", 0o755),
		imagetest.Dir("etc/", 0o755),
		old,
		imagetest.File("etc/passwd", "root:x:0:0::/root:/bin/sh\n", 0o644),
		owned(imagetest.File("usr/bin/su", "su", 0o4755), 0, 0),
		imagetest.Hardlink("usr/bin/su-again", "usr/bin/su"),
		withPAX(imagetest.File("usr/bin/ping", "ping", 0o755),
			"SCHILY.xattr.security.capability", "\x01\x00\x00\x02\x00\x20\x00\x00",
			"SCHILY.xattr.user.keep", "kept",
			"SCHILY.xattr.user.overlay.opaque", "y",
			"SCHILY.xattr.trusted.overlay.opaque", "y"),
		imagetest.Symlink("usr/bin/python3", "/etc/alternatives/python3"),
		imagetest.Symlink("etc/alternatives", "/nonexistent-host-dir"),
		owned(imagetest.Dir("home/user", 0o700), 1000, 1000),
		owned(imagetest.File("home/user/.profile", "x", 0o600), 1000, 1001),
		imagetest.Entry{Header: tar.Header{Typeflag: tar.TypeChar, Name: "dev/null", Mode: 0o666, Devmajor: 1, Devminor: 3}},
		imagetest.Entry{Header: tar.Header{Typeflag: tar.TypeBlock, Name: "dev/sda", Mode: 0o660, Devmajor: 8}},
		imagetest.Entry{Header: tar.Header{Typeflag: tar.TypeFifo, Name: "run/fifo", Mode: 0o600}},
		imagetest.Dir("opt/", 0o755),
		imagetest.File("opt/lower", "", 0o644),
		imagetest.File("gone-char", "", 0o644),
	)
	high := imagetest.Layer(t,
		imagetest.File("etc/.wh.old", "", 0),
		imagetest.Dir("opt/", 0o755),
		imagetest.File("opt/.wh..wh..opq", "", 0),
		imagetest.File("opt/upper", "", 0o644),
		imagetest.Entry{Header: tar.Header{Typeflag: tar.TypeChar, Name: "gone-char", Devmajor: 0, Devminor: 0}},
	)
	cfg := v1.Config{User: "1000:1000", Env: []string{"PATH=/usr/bin", "LANG=C.UTF-8"}, WorkingDir: "/home/user"}
	img := imagetest.Image(t, cfg, low, high)
	want, _ := img.ConfigName()
	im, err := s.Import(ctx, imagetest.Layout(t, img), "test")
	if err != nil {
		t.Fatal(err)
	}
	if im.ID != want.String() || im.Name != "test" || len(im.Layers) != 2 || len(im.HostBinds) != 0 {
		t.Fatalf("image %+v, want id %s and 2 layers", im, want)
	}
	if im.Config.User != "1000:1000" || im.Config.WorkingDir != "/home/user" || strings.Join(im.Config.Env, " ") != "PATH=/usr/bin LANG=C.UTF-8" {
		t.Errorf("config %+v", im.Config)
	}
	l0, l1 := im.Layers[0], im.Layers[1]

	t.Run("owners shifted, none host root", func(t *testing.T) {
		for _, c := range []struct {
			path     string
			uid, gid int
		}{{"", 0, 0}, {"etc/passwd", 0, 0}, {"home/user", 1000, 1000}, {"home/user/.profile", 1000, 1001}, {"usr/bin/python3", 0, 0}, {"usr", 0, 0}} {
			st := lstat(t, filepath.Join(l0, c.path))
			if int(st.Uid) != start+c.uid || int(st.Gid) != start+c.gid {
				t.Errorf("%s: owner %d:%d, want %d:%d", c.path, st.Uid, st.Gid, start+c.uid, start+c.gid)
			}
		}
		for _, l := range im.Layers {
			filepath.WalkDir(l, func(p string, d fs.DirEntry, err error) error {
				if err != nil {
					t.Fatal(err)
				}
				if st := lstat(t, p); st.Uid < uint32(start) || st.Gid < uint32(start) {
					t.Errorf("%s owned by %d:%d, below the store's ids", p, st.Uid, st.Gid)
				}
				return nil
			})
		}
	})
	t.Run("other host users cannot reach the layers", func(t *testing.T) {
		for _, p := range []string{filepath.Join(l0, "etc/passwd"), filepath.Join(l0, "usr/bin/su")} {
			cmd := exec.Command("/bin/cat", p)
			cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
			if out, err := cmd.CombinedOutput(); err == nil || !strings.Contains(string(out), "Permission denied") {
				t.Errorf("nobody read %s: %v %q", p, err, out)
			}
		}
	})
	t.Run("modes, set-id kept, mtimes", func(t *testing.T) {
		if st := lstat(t, filepath.Join(l0, "usr/bin/su")); st.Mode&0o7777 != 0o4755 {
			t.Errorf("su mode %o, want 4755", st.Mode&0o7777)
		}
		if st := lstat(t, filepath.Join(l0, "home/user")); st.Mode&0o7777 != 0o700 {
			t.Errorf("home mode %o", st.Mode&0o7777)
		}
		fi, _ := os.Lstat(filepath.Join(l0, "etc/old"))
		if !fi.ModTime().Equal(mtime) {
			t.Errorf("etc/old mtime %v, want %v", fi.ModTime(), mtime)
		}
		fi, _ = os.Lstat(filepath.Join(l0, "etc"))
		if !fi.ModTime().Equal(imagetest.Epoch) {
			t.Errorf("etc mtime %v, want %v (directory times set after their entries)", fi.ModTime(), imagetest.Epoch)
		}
	})
	t.Run("hard link within the tree kept", func(t *testing.T) {
		a, b := lstat(t, filepath.Join(l0, "usr/bin/su")), lstat(t, filepath.Join(l0, "usr/bin/su-again"))
		if a.Ino != b.Ino || a.Nlink != 2 {
			t.Errorf("su ino %d nlink %d, su-again ino %d", a.Ino, a.Nlink, b.Ino)
		}
	})
	t.Run("xattrs: security.capability, trusted and user.overlay dropped, user kept", func(t *testing.T) {
		p := filepath.Join(l0, "usr/bin/ping")
		if v, err := xattr(p, "user.keep"); v != "kept" {
			t.Errorf("user.keep = %q, %v", v, err)
		}
		for _, x := range []string{"security.capability", "user.overlay.opaque", "trusted.overlay.opaque"} {
			if _, err := xattr(p, x); !errors.Is(err, unix.ENODATA) {
				t.Errorf("%s present (%v)", x, err)
			}
		}
	})
	t.Run("symlinks kept verbatim, devices and fifos skipped", func(t *testing.T) {
		if got, _ := os.Readlink(filepath.Join(l0, "usr/bin/python3")); got != "/etc/alternatives/python3" {
			t.Errorf("python3 -> %q", got)
		}
		for _, p := range []string{"dev/null", "dev/sda", "run/fifo"} {
			if _, err := os.Lstat(filepath.Join(l0, p)); !errors.Is(err, fs.ErrNotExist) {
				t.Errorf("%s unpacked (%v)", p, err)
			}
		}
	})
	t.Run("whiteouts in overlay userxattr form", func(t *testing.T) {
		for _, p := range []string{"etc/old", "gone-char"} {
			st := lstat(t, filepath.Join(l1, p))
			if st.Mode&unix.S_IFMT != unix.S_IFCHR || st.Rdev != 0 {
				t.Errorf("%s: mode %o rdev %d, want a 0/0 character device", p, st.Mode, st.Rdev)
			}
		}
		if _, err := os.Lstat(filepath.Join(l1, "etc/.wh.old")); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf(".wh.old kept: %v", err)
		}
		if v, err := xattr(filepath.Join(l1, "opt"), "user.overlay.opaque"); v != "y" {
			t.Errorf("opt opaque = %q, %v", v, err)
		}
		mnt := t.TempDir()
		if err := unix.Mount("overlay", mnt, "overlay", unix.MS_RDONLY, "userxattr,lowerdir="+l1+":"+l0); err != nil {
			t.Skipf("overlay with userxattr: %v", err)
		}
		defer unix.Unmount(mnt, unix.MNT_DETACH)
		for p, want := range map[string]bool{"etc/old": false, "etc/passwd": true, "gone-char": false, "opt/lower": false, "opt/upper": true, "usr/bin/su": true} {
			_, err := os.Lstat(filepath.Join(mnt, p))
			if got := err == nil; got != want {
				t.Errorf("overlay: %s present %v, want %v (%v)", p, got, want, err)
			}
		}
	})
}

// TestUnsafe: every tar hazard refuses the import, names the entry, and
// writes nothing outside the store.
func TestUnsafe(t *testing.T) {
	s, _ := newStore(t)
	ctx := context.Background()
	outside := t.TempDir()
	cases := []struct {
		name    string
		entries []imagetest.Entry
		entry   string
	}{
		{"dotdot", []imagetest.Entry{imagetest.File("../evil", "x", 0o644)}, "../evil"},
		{"dotdot inside", []imagetest.Entry{imagetest.Dir("a/", 0o755), imagetest.File("a/../../evil", "x", 0o644)}, "a/../../evil"},
		{"absolute", []imagetest.Entry{imagetest.File("/etc/evil", "x", 0o644)}, "/etc/evil"},
		{"through a symlink", []imagetest.Entry{imagetest.Symlink("link", outside), imagetest.File("link/pwned", "x", 0o644)}, "link/pwned"},
		{"through a relative symlink", []imagetest.Entry{imagetest.Dir("d/", 0o755), imagetest.Symlink("d/up", "../.."), imagetest.File("d/up/pwned", "x", 0o644)}, "d/up/pwned"},
		{"dir through a symlink", []imagetest.Entry{imagetest.Symlink("link", outside), imagetest.Dir("link/sub/", 0o755)}, "link/sub/"},
		{"hard link out", []imagetest.Entry{imagetest.Hardlink("h", "../../../etc/shadow")}, "h"},
		{"hard link absolute", []imagetest.Entry{imagetest.Hardlink("h", "/etc/shadow")}, "h"},
		{"hard link through a symlink", []imagetest.Entry{imagetest.Symlink("link", "/etc"), imagetest.Hardlink("h", "link/shadow")}, "h"},
		{"hard link to nothing", []imagetest.Entry{imagetest.Hardlink("h", "missing")}, "h"},
		{"owner 65536", []imagetest.Entry{owned(imagetest.File("f", "x", 0o644), 65536, 0)}, "f"},
		{"group 70000", []imagetest.Entry{owned(imagetest.File("f", "x", 0o644), 0, 70000)}, "f"},
		{"whiteout of dotdot", []imagetest.Entry{imagetest.File(".wh...", "", 0)}, ".wh..."},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			img := imagetest.Image(t, v1.Config{}, imagetest.Layer(t, c.entries...))
			_, err := s.Import(ctx, imagetest.Layout(t, img), "bad")
			if !errors.Is(err, image.ErrUnsafe) || !strings.Contains(err.Error(), `"`+c.entry+`"`) {
				t.Fatalf("import: %v, want ErrUnsafe naming %q", err, c.entry)
			}
			if _, err := s.Get(ctx, "bad"); !errors.Is(err, image.ErrNotFound) {
				t.Errorf("image recorded: %v", err)
			}
			if ents, _ := os.ReadDir(outside); len(ents) != 0 {
				t.Errorf("wrote outside the tree: %v", ents)
			}
		})
	}
	if _, err := os.Lstat("/etc/evil"); err == nil {
		t.Error("/etc/evil exists")
	}
}

// TestArchives: docker-archive and oci-archive import to the same image,
// and a layer shared by two images is unpacked once.
func TestArchives(t *testing.T) {
	s, log := newStore(t)
	ctx := context.Background()
	shared := imagetest.Layer(t, imagetest.File("shared", "s", 0o644))
	a := imagetest.Image(t, v1.Config{User: "a"}, shared)
	b := imagetest.Image(t, v1.Config{User: "b"}, shared, imagetest.Layer(t, imagetest.File("own", "b", 0o644)))
	wantA, _ := a.ConfigName()
	da, err := s.Import(ctx, imagetest.DockerArchive(t, a), "docker")
	if err != nil {
		t.Fatalf("docker-archive: %v", err)
	}
	before := lstat(t, da.Layers[0])
	oa, err := s.Import(ctx, imagetest.OCIArchive(t, a), "oci")
	if err != nil {
		t.Fatalf("oci-archive: %v", err)
	}
	ib, err := s.Import(ctx, imagetest.Layout(t, b), "b")
	if err != nil {
		t.Fatal(err)
	}
	if da.ID != wantA.String() || oa.ID != da.ID || oa.Config.User != "a" {
		t.Errorf("ids %s %s, want %s; config %+v", da.ID, oa.ID, wantA, oa.Config)
	}
	if oa.Layers[0] != da.Layers[0] || ib.Layers[0] != da.Layers[0] {
		t.Errorf("shared layer at %s, %s, %s", da.Layers[0], oa.Layers[0], ib.Layers[0])
	}
	if after := lstat(t, ib.Layers[0]); after.Ino != before.Ino {
		t.Error("shared layer unpacked again")
	}
	if n := strings.Count(log.String(), "layer unpacked"); n != 2 {
		t.Errorf("%d layers unpacked, want 2:\n%s", n, log)
	}
	list, err := s.List(ctx)
	if err != nil || len(list) != 3 || list[0].Name != "b" || list[1].Name != "docker" || list[2].Name != "oci" {
		t.Errorf("list %v %v", list, err)
	}
	// Importing a name again replaces the image.
	wantB, _ := b.ConfigName()
	if _, err := s.Import(ctx, imagetest.DockerArchive(t, b), "oci"); err != nil {
		t.Fatal(err)
	}
	if got, err := s.Get(ctx, "oci"); err != nil || got.ID != wantB.String() || len(got.Layers) != 2 {
		t.Errorf("replaced: %+v %v, want %s", got, err, wantB)
	}
	if _, err := s.Import(ctx, filepath.Join(t.TempDir(), "missing"), "x"); err == nil {
		t.Error("missing source imported")
	}
	notTar := filepath.Join(t.TempDir(), "x.tar")
	os.WriteFile(notTar, []byte("this is not a tar archive, not at all, and long enough for a header? no"), 0o644)
	if _, err := s.Import(ctx, notTar, "x"); err == nil {
		t.Errorf("a file that is no tar imported")
	}
	for _, n := range []string{"base", "Upper", "../x", ""} {
		if _, err := s.Import(ctx, imagetest.Layout(t, a), n); !errors.Is(err, image.ErrInvalidName) {
			t.Errorf("name %q: %v", n, err)
		}
	}
}

// TestConcurrentImports: two imports of the same layer at once both
// succeed with one intact copy.
func TestConcurrentImports(t *testing.T) {
	s, _ := newStore(t)
	ctx := context.Background()
	var ents []imagetest.Entry
	for i := range 200 {
		ents = append(ents, imagetest.File("f"+strings.Repeat("x", i%50)+string(rune('a'+i%26))+"/"+time.Duration(i).String(), strings.Repeat("y", i), 0o644))
	}
	src := imagetest.Layout(t, imagetest.Image(t, v1.Config{}, imagetest.Layer(t, ents...)))
	var wg sync.WaitGroup
	errs := make([]error, 4)
	ims := make([]*image.Image, 4)
	for i := range errs {
		wg.Go(func() { ims[i], errs[i] = s.Import(ctx, src, "c"+string(rune('0'+i))) })
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("import %d: %v", i, err)
		}
		if ims[i].Layers[0] != ims[0].Layers[0] {
			t.Errorf("layer %s != %s", ims[i].Layers[0], ims[0].Layers[0])
		}
	}
	n := 0
	filepath.WalkDir(ims[0].Layers[0], func(p string, d fs.DirEntry, err error) error {
		if d.Type().IsRegular() {
			n++
		}
		return err
	})
	if n != len(ents) {
		t.Errorf("%d files in the layer, want %d", n, len(ents))
	}
}

func TestRemove(t *testing.T) {
	s, _ := newStore(t)
	ctx := context.Background()
	shared := imagetest.Layer(t, imagetest.File("shared", "s", 0o644))
	a, err := s.Import(ctx, imagetest.Layout(t, imagetest.Image(t, v1.Config{}, shared)), "a")
	if err != nil {
		t.Fatal(err)
	}
	b, err := s.Import(ctx, imagetest.Layout(t, imagetest.Image(t, v1.Config{}, shared, imagetest.Layer(t, imagetest.File("own", "b", 0o644)))), "b")
	if err != nil {
		t.Fatal(err)
	}
	used := func(n string) (bool, error) { return n == "a", nil }
	if err := s.Remove(ctx, "a", used); !errors.Is(err, image.ErrInUse) {
		t.Fatalf("remove in use: %v", err)
	}
	if _, err := s.Get(ctx, "a"); err != nil {
		t.Fatalf("refused remove lost the image: %v", err)
	}
	if err := s.Remove(ctx, "nope", nil); !errors.Is(err, image.ErrNotFound) {
		t.Errorf("remove unknown: %v", err)
	}
	if err := s.Remove(ctx, "b", used); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(b.Layers[1]); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("b's own layer kept: %v", err)
	}
	if _, err := os.Stat(a.Layers[0]); err != nil {
		t.Errorf("shared layer removed while a names it: %v", err)
	}
	if err := s.Remove(ctx, "a", nil); err != nil {
		t.Fatal(err)
	}
	if ents, _ := os.ReadDir(filepath.Join(s.Dir(), "layers")); len(ents) != 0 {
		t.Errorf("layers left: %v", ents)
	}
	if _, err := s.Get(ctx, "a"); !errors.Is(err, image.ErrNotFound) {
		t.Errorf("get removed: %v", err)
	}
}

func TestBase(t *testing.T) {
	s, log := newStore(t)
	ctx := context.Background()
	if l, _ := s.List(ctx); len(l) != 0 {
		t.Fatalf("base listed before use: %v", l)
	}
	start := time.Now()
	b, err := s.Get(ctx, "base")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("base made in %v", time.Since(start))
	if len(b.Layers) != 1 || len(b.HostBinds) != 1 || b.HostBinds[0] != "/usr" || b.Config.User != "user" {
		t.Fatalf("base %+v", b)
	}
	root := b.Layers[0]
	passwd, err := os.ReadFile(filepath.Join(root, "etc/passwd"))
	if err != nil || !strings.Contains(string(passwd), "\nuser:x:1000:1000:") || !strings.HasPrefix(string(passwd), "root:x:0:0:") {
		t.Errorf("passwd %q %v", passwd, err)
	}
	for _, p := range []string{"etc/shadow", "etc/gshadow", "etc/ssl/private", "root/.bashrc", "var/lib", "srv", "opt", "mnt", "run/dbus", "etc/sudoers", "etc/machine-id"} {
		if _, err := os.Lstat(filepath.Join(root, p)); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("%s in base (%v)", p, err)
		}
	}
	for _, p := range []string{"proc", "sys", "dev", "tmp", "run", "var/tmp", "home/corral", "workspace", "root", "usr", "etc/hosts", "etc/resolv.conf", "etc/nsswitch.conf", "etc/hostname", "etc/group"} {
		if _, err := os.Lstat(filepath.Join(root, p)); err != nil {
			t.Errorf("%s missing: %v", p, err)
		}
	}
	if hostT, err := os.Readlink("/bin"); err == nil {
		if got, _ := os.Readlink(filepath.Join(root, "bin")); got != hostT {
			t.Errorf("bin -> %q, host's -> %q", got, hostT)
		}
	}
	if _, err := os.Stat("/etc/ssl/certs/ca-certificates.crt"); err == nil {
		if _, err := os.Stat(filepath.Join(root, "etc/ssl/certs/ca-certificates.crt")); err != nil {
			t.Errorf("CA bundle: %v", err)
		}
	}
	if st := lstat(t, filepath.Join(root, "root")); st.Mode&0o777 != 0o700 || st.Uid != s.IDs().Start {
		t.Errorf("/root mode %o owner %d", st.Mode&0o777, st.Uid)
	}
	if st := lstat(t, root); st.Uid != s.IDs().Start || st.Mode&0o777 != 0o755 {
		t.Errorf("root owner %d mode %o, want %d 0755", st.Uid, st.Mode&0o777, s.IDs().Start)
	}
	if st := lstat(t, filepath.Join(root, "home/corral")); st.Uid != s.IDs().Start+1000 {
		t.Errorf("home owner %d", st.Uid)
	}
	filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if st := lstat(t, p); st.Uid < s.IDs().Start {
			t.Errorf("%s owned by host uid %d", p, st.Uid)
		}
		return err
	})
	again, err := s.Get(ctx, "base")
	if err != nil || again.Layers[0] != root || !again.Created.Equal(b.Created) {
		t.Errorf("second Get %+v %v: base made again", again, err)
	}
	if l, _ := s.List(ctx); len(l) != 1 || l[0].Name != "base" {
		t.Errorf("list %v", l)
	}
	if n := strings.Count(log.String(), "base made"); n != 1 {
		t.Errorf("base made %d times", n)
	}

	t.Run("programs work in it", func(t *testing.T) {
		bwrap, err := exec.LookPath("bwrap")
		if err != nil {
			t.Skip("bwrap not installed")
		}
		script := `set -e
id -un; getent passwd user | cut -d: -f6
cd /tmp && git init -q r && cd r && git status --short && echo git-ok
test ! -e /etc/shadow && echo no-shadow`
		out, err := exec.Command(bwrap, "--ro-bind", root, "/", "--ro-bind", "/usr", "/usr", "--proc", "/proc", "--dev", "/dev",
			"--tmpfs", "/tmp", "--unshare-user", "--uid", "1000", "--gid", "1000", "--clearenv",
			"--setenv", "HOME", "/home/corral", "--setenv", "PATH", "/usr/bin:/bin", "/bin/sh", "-c", script).CombinedOutput()
		if err != nil || string(out) != "user\n/home/corral\ngit-ok\nno-shadow\n" {
			t.Errorf("in base: %v\n%s", err, out)
		}
	})

	t.Run("remove remakes", func(t *testing.T) {
		if err := s.Remove(ctx, "base", nil); err != nil {
			t.Fatal(err)
		}
		if _, err := os.Lstat(root); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("old base layer kept: %v", err)
		}
		if l, _ := s.List(ctx); len(l) != 0 {
			t.Errorf("list after rm: %v", l)
		}
		nb, err := s.Get(ctx, "base")
		if err != nil || nb.Layers[0] == root {
			t.Errorf("remade %+v %v", nb, err)
		}
	})
}

func BenchmarkBase(b *testing.B) {
	if os.Geteuid() != 0 {
		b.Skip("needs root")
	}
	for b.Loop() {
		s, err := image.Open(filepath.Join(b.TempDir(), "images"), image.Options{Registry: filepath.Join(b.TempDir(), "reg.json")})
		if err != nil {
			b.Fatal(err)
		}
		if _, err := s.Get(context.Background(), "base"); err != nil {
			b.Fatal(err)
		}
	}
}

// TestSparse: a sparse entry is written with holes, and one that claims
// more than MaxSize is refused before anything is written.
func TestSparse(t *testing.T) {
	s, _ := newStore(t)
	ctx := context.Background()
	layer := func(p string) v1.Layer {
		l, err := tarball.LayerFromFile(p)
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
	im, err := s.Import(ctx, imagetest.Layout(t, imagetest.Image(t, v1.Config{}, layer("testdata/sparse-1g.tar"))), "sparse")
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(im.Layers[0], "big")
	st := lstat(t, p)
	if st.Size != 1<<30+3 || st.Blocks*512 > 1<<20 {
		t.Errorf("big: size %d, %d bytes on disk; want %d and a hole", st.Size, st.Blocks*512, 1<<30+3)
	}
	f, _ := os.Open(p)
	end := make([]byte, 3)
	f.ReadAt(end, 1<<30)
	f.Close()
	if string(end) != "end" {
		t.Errorf("big ends with %q", end)
	}
	start := time.Now()
	_, err = s.Import(ctx, imagetest.Layout(t, imagetest.Image(t, v1.Config{}, layer("testdata/sparse-1t.tar"))), "huge")
	if !errors.Is(err, image.ErrUnsafe) || !strings.Contains(err.Error(), `"huge"`) {
		t.Errorf("a terabyte sparse file: %v, want ErrUnsafe", err)
	}
	t.Logf("refused in %v", time.Since(start))
}

// TestImportRootfs imports a plain root filesystem tar, as docker import
// does (what docker export and build tools write), plain and gzipped: one
// layer, an empty configuration.
func TestImportRootfs(t *testing.T) {
	s, _ := newStore(t)
	ctx := context.Background()
	raw := imagetest.Tar(t, imagetest.Dir("etc", 0o755), imagetest.File("etc/hostname", "rootfs\n", 0o644), imagetest.File("bin/tool", "#!/bin/sh\n", 0o755))
	plain := filepath.Join(t.TempDir(), "rootfs.tar")
	if err := os.WriteFile(plain, raw, 0o644); err != nil {
		t.Fatal(err)
	}
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	zw.Write(raw)
	zw.Close()
	zipped := filepath.Join(t.TempDir(), "rootfs.tar.gz")
	if err := os.WriteFile(zipped, gz.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	for name, src := range map[string]string{"plain": plain, "zipped": zipped} {
		img, err := s.Import(ctx, src, name)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if len(img.Layers) != 1 || img.Config.User != "" || len(img.Config.Env) != 0 || img.Source != src || img.Digest != "" {
			t.Fatalf("%s: %+v", name, img)
		}
		b, err := os.ReadFile(filepath.Join(img.Layers[0], "etc", "hostname"))
		if err != nil || string(b) != "rootfs\n" {
			t.Fatalf("%s: the layer's file: %q %v", name, b, err)
		}
	}
}

// TestPull pulls an image from a registry the test starts: its layers,
// configuration (Env, User, WorkingDir, Entrypoint, Cmd) and manifest
// digest are recorded; an unknown tag and an unreachable registry fail
// and record nothing.
func TestPull(t *testing.T) {
	s, _ := newStore(t)
	ctx := context.Background()
	host := imagetest.Registry(t)
	cfg := v1.Config{User: "1000", Env: []string{"PATH=/opt/bin:/bin", "A=1"}, WorkingDir: "/srv",
		Entrypoint: []string{"/bin/tool"}, Cmd: []string{"serve"}}
	img := imagetest.Image(t, cfg, imagetest.Layer(t, imagetest.File("bin/tool", "x", 0o755)), imagetest.Layer(t, imagetest.File("srv/data", "d", 0o644)))
	digest := imagetest.Push(t, host+"/team/tool:v1", img)
	got, err := s.Pull(ctx, host+"/team/tool:v1", "tool")
	if err != nil {
		t.Fatal(err)
	}
	want, _ := img.ConfigName()
	if got.ID != want.String() || got.Digest != digest || got.Source != host+"/team/tool:v1" || len(got.Layers) != 2 {
		t.Fatalf("pulled %+v, want id %s digest %s", got, want, digest)
	}
	if c := got.Config; c.User != "1000" || strings.Join(c.Env, " ") != "PATH=/opt/bin:/bin A=1" || c.WorkingDir != "/srv" ||
		strings.Join(c.Entrypoint, " ") != "/bin/tool" || strings.Join(c.Cmd, " ") != "serve" {
		t.Fatalf("config %+v", c)
	}
	if again, err := s.Get(ctx, "tool"); err != nil || again.Digest != digest {
		t.Fatalf("recorded: %+v %v", again, err)
	}
	// By digest too.
	if _, err := s.Pull(ctx, host+"/team/tool@"+digest, "bydigest"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Pull(ctx, host+"/team/tool:nope", "nope"); err == nil {
		t.Error("an unknown tag pulled")
	}
	if _, err := s.Get(ctx, "nope"); !errors.Is(err, image.ErrNotFound) {
		t.Errorf("a failed pull recorded the image: %v", err)
	}
	if _, err := s.Pull(ctx, "not a reference", "x"); err == nil {
		t.Error("a bad reference pulled")
	}
	if _, err := s.Pull(ctx, host+"/team/tool:v1", "base"); !errors.Is(err, image.ErrInvalidName) {
		t.Errorf("pull over base: %v", err)
	}
}
