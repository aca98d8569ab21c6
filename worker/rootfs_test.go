package worker

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"golang.org/x/sys/unix"

	"github.com/corral-sandbox/corral/image"
	"github.com/corral-sandbox/corral/image/imagetest"
	"github.com/corral-sandbox/corral/wire"
)

func randHex(t testing.TB) string {
	b := make([]byte, 6)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b)
}

// TestHostInvisible: a machine sees nothing of the host but its image
// (base: generated /etc and the host's /usr), its workspace and its home:
// not a world-readable file in /srv, /opt, /etc/shadow, the worker's state
// (homes, upper layers, the image store), other projects, nor a host Unix
// socket.
func TestHostInvisible(t *testing.T) {
	requireRoot(t)
	state, err := os.MkdirTemp("/var/tmp", "corral-state-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(state) })
	sentinel := "/srv/corral-sentinel-" + randHex(t)
	if err := os.WriteFile(sentinel, []byte("host secret"), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.Remove(sentinel) })
	sockDir := "/run/corral-test-" + randHex(t)
	if err := os.Mkdir(sockDir, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(sockDir) })
	ln, err := net.Listen("unix", sockDir+"/bus")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	if err := os.Chmod(sockDir+"/bus", 0o666); err != nil {
		t.Fatal(err)
	}
	optEntries, _ := os.ReadDir("/opt")

	h := newHarness(t, func(c *Config) { c.StateDir = state })
	c := h.dial(t)
	p1, p2 := h.project(t, 1), h.project(t, 2)
	h.run(t, c, p2, "true") // another project's machine, home and upper layer exist
	for _, path := range []string{sentinel, "/etc/shadow", sockDir, sockDir + "/bus", state, h.w.cfg.HomesRoot,
		h.w.cfg.ImagesDir, h.root, p2.Workspace, "/var/lib/corral", "/etc/corral"} {
		r := h.run(t, c, p1, "sh", "-c", `test -e "$1" || test -L "$1" && echo visible`, "sh", path)
		if r.code() != 1 || r.stdout != "" {
			t.Errorf("%s visible in a machine: %v", path, r)
		}
	}
	// Directories the image has but the host fills are the image's.
	r := h.run(t, c, p1, "sh", "-c", "ls -A /opt /root /var /run /mnt /srv 2>/dev/null")
	for _, e := range optEntries {
		if strings.Contains(r.stdout, e.Name()) {
			t.Errorf("the host's /opt/%s is visible: %v", e.Name(), r)
		}
	}
	// /etc is the image's: no host user in passwd.
	hostPasswd, _ := os.ReadFile("/etc/passwd")
	r = h.run(t, c, p1, "cat", "/etc/passwd")
	if r.code() != 0 || r.stdout == string(hostPasswd) || strings.Contains(r.stdout, "daemon:") {
		t.Errorf("/etc/passwd in a machine: %v", r)
	}
	// The host's /usr is there, read-only, so its tools run.
	if r := h.run(t, c, p1, "sh", "-c", "python3 -c 'print(6*7)' && git --version >/dev/null && echo ok"); r.stdout != "42\nok\n" {
		t.Errorf("host tools under base: %v", r)
	}
}

// synthetic returns an image whose only shell is the host's dash with its
// libraries (a root filesystem without the host's /usr bound), an
// /etc/os-release of its own and a tool in /usr/local/bin.
func synthetic(t testing.TB, osRelease string) v1.Image {
	t.Helper()
	dash, err := filepath.EvalSymlinks("/bin/sh")
	if err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command("ldd", dash).Output()
	if err != nil {
		t.Skip("ldd:", err)
	}
	files := []string{dash}
	for _, f := range strings.Fields(string(out)) {
		if strings.HasPrefix(f, "/") {
			files = append(files, f)
		}
	}
	seen := map[string]bool{}
	var entries []imagetest.Entry
	dir := func(d string) {
		var parts []string
		for _, c := range strings.Split(strings.Trim(d, "/"), "/") {
			parts = append(parts, c)
			p := strings.Join(parts, "/")
			if !seen[p] {
				seen[p] = true
				entries = append(entries, imagetest.Dir(p+"/", 0o755))
			}
		}
	}
	for _, d := range []string{"etc", "usr/local/bin", "tmp", "workspace", "home/corral"} {
		dir(d)
	}
	for _, f := range files {
		real, err := filepath.EvalSymlinks(f)
		if err != nil {
			t.Fatal(err)
		}
		b, err := os.ReadFile(real)
		if err != nil {
			t.Fatal(err)
		}
		name := strings.TrimPrefix(f, "/")
		dir(filepath.Dir(name))
		entries = append(entries, imagetest.File(name, string(b), 0o755))
	}
	entries = append(entries,
		imagetest.Symlink("bin", "usr/bin"),
		imagetest.Symlink("usr/bin/sh", filepath.Base(dash)),
		imagetest.File("etc/os-release", osRelease, 0o644),
		imagetest.File("usr/local/bin/corral-tool", "#!/bin/sh\necho \"tool ran as $(echo $SYNTH)\"\n", 0o755))
	if !seen["usr/bin"] {
		t.Skip("dash is not in /usr/bin on this host")
	}
	return imagetest.Image(t, v1.Config{Env: []string{"PATH=/usr/local/bin:/usr/bin", "SYNTH=synthetic"}},
		imagetest.Layer(t, entries...))
}

// importImage imports img into the worker's store as name.
func (h *harness) importImage(t testing.TB, img v1.Image, name string) {
	t.Helper()
	st, ok := h.w.images.(*image.Store)
	if !ok {
		t.Fatal("the worker has no image store")
	}
	if _, err := st.Import(context.Background(), imagetest.Layout(t, img), name); err != nil {
		t.Fatal(err)
	}
}

// TestImportedImageRoot: a machine of an imported image runs the image's
// tools with the image's environment and its /etc/os-release; guest root
// (the image's default user) writes under /usr, which persists across
// commands and machine restarts, is owned on the host by the machine's
// ids (never root), and is gone after a reset; an unknown image is
// rejected "bad-image".
func TestImportedImageRoot(t *testing.T) {
	h := newHarness(t, nil)
	c := h.dial(t)
	h.importImage(t, synthetic(t, "ID=corral-synthetic\n"), "synth")
	p := h.project(t, 3)
	p.Image = "synth"

	r := h.run(t, c, p, "sh", "-c", `read l </etc/os-release; echo "$l"; corral-tool; echo "$PATH"`)
	if r.code() != 0 || r.stdout != "ID=corral-synthetic\ntool ran as synthetic\n/usr/local/bin:/usr/bin\n" {
		t.Fatalf("synthetic image: %v", r)
	}
	write := `echo persisted >/usr/local/bin/mark && echo written`
	read := `read l </usr/local/bin/mark && echo "$l"`
	if r := h.run(t, c, p, "sh", "-c", write); r.stdout != "written\n" {
		t.Fatalf("guest root writing under /usr: %v", r)
	}
	if r := h.run(t, c, p, "sh", "-c", read); r.stdout != "persisted\n" {
		t.Fatalf("next command: %v", r)
	}
	m := h.machineOf(t, 3)
	if m.Image != "synth" || !strings.HasPrefix(m.ImageID, "sha256:") {
		t.Errorf("machine image %q %q", m.Image, m.ImageID)
	}
	upperFile := filepath.Join(h.w.projectDir(3), "upper/usr/local/bin/mark")
	var st unix.Stat_t
	if err := unix.Lstat(upperFile, &st); err != nil {
		t.Fatalf("upper layer: %v", err)
	}
	if st.Uid != m.HostUID || st.Uid == 0 || st.Mode&(unix.S_ISUID|unix.S_ISGID) != 0 {
		t.Errorf("upper file owned by %d mode %o on the host; want guest root's host id %d", st.Uid, st.Mode, m.HostUID)
	}
	// Restart the machine: stop it through a reset refused while busy,
	// then after an idle stop.
	run := h.start(t, c, p, "sh", "-c", "read x")
	if err := c.Send(&wire.MachineReset{ID: "r1", Project: p}); err != nil {
		t.Fatal(err)
	}
	if e, ok := recv(t, c).(*wire.Error); !ok || e.ID != "r1" || e.Code != wire.CodeBusy {
		t.Fatalf("reset of a busy machine: %#v", e)
	}
	run.wait(t)
	ctx := context.Background()
	h.w.mu.Lock()
	mach := h.w.machines[3]
	h.w.mu.Unlock()
	mach.stop("test")
	<-mach.dead
	if r := h.run(t, c, p, "sh", "-c", read); r.stdout != "persisted\n" {
		t.Fatalf("after a machine restart: %v", r)
	}
	if err := c.Send(&wire.MachineReset{ID: "r2", Project: p}); err != nil {
		t.Fatal(err)
	}
	if m, ok := recv(t, c).(*wire.MachineResetDone); !ok || m.ID != "r2" {
		t.Fatalf("reset: %#v", m)
	}
	if _, err := os.Stat(h.w.projectDir(3)); !os.IsNotExist(err) {
		t.Errorf("upper layer after reset: %v", err)
	}
	if r := h.run(t, c, p, "sh", "-c", read); r.code() == 0 {
		t.Fatalf("after a reset: %v", r)
	}
	if err := h.w.Reset(ctx, 99); err != nil {
		t.Errorf("reset of a project without a machine: %v", err)
	}

	bad := h.project(t, 4)
	bad.Image = "no-such-image"
	if err := c.Send(&wire.ExecStart{ID: "b", Project: bad, Argv: []string{"true"}}); err != nil {
		t.Fatal(err)
	}
	if m, ok := recv(t, c).(*wire.ExecRejected); !ok || m.Code != wire.CodeBadImage || !strings.Contains(m.Message, "no-such-image") {
		t.Fatalf("unknown image: %#v", m)
	}
}

// TestDebianImageInstallsPackage: a Debian root filesystem from mmdebstrap
// imports, and root installs a real .deb with dpkg -i in it.
func TestDebianImageInstallsPackage(t *testing.T) {
	requireRoot(t)
	if _, err := exec.LookPath("dpkg-deb"); err != nil {
		t.Skip("dpkg-deb is not installed on this host")
	}
	layout := imagetest.Debian(t)
	h := newHarness(t, nil)
	c := h.dial(t)
	st := h.w.images.(*image.Store)
	if _, err := st.Import(context.Background(), layout, "debian"); err != nil {
		t.Fatal(err)
	}
	// A tiny package, built on the host.
	pkg := t.TempDir()
	for name, body := range map[string]string{
		"DEBIAN/control":           "Package: corral-hello\nVersion: 1.0\nArchitecture: all\nMaintainer: corral <corral@example.com>\nDescription: test\n",
		"usr/bin/corral-hello":     "#!/bin/sh\necho hello from a package\n",
		"usr/share/doc/corral/txt": "doc\n",
	} {
		if err := os.MkdirAll(filepath.Join(pkg, filepath.Dir(name)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(pkg, name), []byte(body), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	p := h.project(t, 5)
	p.Image = "debian"
	if out, err := exec.Command("dpkg-deb", "--root-owner-group", "--build", pkg, filepath.Join(p.Workspace, "hello.deb")).CombinedOutput(); err != nil {
		t.Fatalf("dpkg-deb: %v\n%s", err, out)
	}
	r := h.run(t, c, p, "sh", "-c", "grep ^ID= /etc/os-release && id -u && dpkg -i /workspace/hello.deb >/dev/null && corral-hello")
	if r.code() != 0 || r.stdout != "ID=debian\n0\nhello from a package\n" {
		t.Fatalf("dpkg -i in a Debian machine: %v", r)
	}
	if r := h.run(t, c, p, "sh", "-c", "dpkg -s corral-hello | grep ^Status"); !strings.Contains(r.stdout, "install ok installed") {
		t.Fatalf("package not recorded: %v", r)
	}
	// Guest root plants no set-id file in its upper layer either.
	if r := h.run(t, c, p, "sh", "-c", "chmod u+s /usr/bin/corral-hello || echo refused; cp /bin/true /usr/local/bin/t && chmod g+s /usr/local/bin/t || echo refused"); r.stdout != "refused\nrefused\n" {
		t.Errorf("set-id bits in the upper layer: %v", r)
	}
	assertNoRootOwned(t, h.w.projectDir(5))
}

// assertNoRootOwned fails t if a file of the tree at dir is owned by host
// root or carries a set-id bit.
func assertNoRootOwned(t testing.TB, dir string) {
	t.Helper()
	_ = filepath.Walk(dir, func(p string, fi os.FileInfo, err error) error {
		if err != nil {
			return nil
		}
		var st unix.Stat_t
		if unix.Lstat(p, &st) != nil {
			return nil
		}
		if p != dir && (st.Uid == 0 || st.Gid == 0) {
			t.Errorf("%s is owned by %d:%d on the host", p, st.Uid, st.Gid)
		}
		if st.Mode&unix.S_IFMT == unix.S_IFREG && st.Mode&(unix.S_ISUID|unix.S_ISGID) != 0 {
			t.Errorf("%s carries set-id bits (%o)", p, st.Mode)
		}
		return nil
	})
}

// TestBaseRootWritesPersist: on base, `--user root` writes outside /usr
// (the host's, read-only) land in the project's upper layer: seen by the
// next command, owned on the host by the machine's ids, gone after reset.
func TestBaseRootWritesPersist(t *testing.T) {
	h := newHarness(t, nil)
	c := h.dial(t)
	p := h.project(t, 1)
	if r := h.runAs(t, c, p, "root", "sh", "-c", "echo kept > /etc/corral-mark && mkdir -p /opt/tool && touch /usr/x 2>/dev/null || echo usr-read-only"); r.stdout != "usr-read-only\n" {
		t.Fatalf("root's writes: %v", r)
	}
	if r := h.run(t, c, p, "cat", "/etc/corral-mark"); r.stdout != "kept\n" {
		t.Fatalf("next command: %v", r)
	}
	assertNoRootOwned(t, h.w.projectDir(1))
	if err := h.w.Reset(context.Background(), 1); err != nil {
		t.Fatal(err)
	}
	if r := h.run(t, c, p, "sh", "-c", "test -e /etc/corral-mark || test -e /opt/tool || echo gone"); r.stdout != "gone\n" {
		t.Fatalf("after reset: %v", r)
	}
}
