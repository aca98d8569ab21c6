package imagetest

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/compression"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"golang.org/x/sys/unix"
)

// DefaultCache is where Debian keeps its image unless $CORRAL_TEST_CACHE
// names another directory.
const DefaultCache = "/var/tmp/corral-test-cache"

// DebianSuite is the release Debian builds.
const DebianSuite = "bookworm"

var debianMu sync.Mutex

// Debian returns an OCI image layout directory holding a minimal Debian
// root filesystem (mmdebstrap --variant=minbase DebianSuite) in one
// zstd-compressed layer, built from
// Debian's mirror once a day and cached under $CORRAL_TEST_CACHE (default
// DefaultCache): the first call of a day takes a minute or so, later ones
// none. The layout has one layer and the config User "" (root), Env PATH,
// WorkingDir "/". Callers must not modify the directory. Debian skips t
// when mmdebstrap is not installed and fails it when the build fails.
// Processes building at once serialize on a lock file in the cache.
func Debian(t testing.TB) (ociLayoutDir string) {
	t.Helper()
	if _, err := exec.LookPath("mmdebstrap"); err != nil {
		t.Skip("imagetest: mmdebstrap is not installed (apt-get install mmdebstrap debian-archive-keyring)")
	}
	cache := os.Getenv("CORRAL_TEST_CACHE")
	if cache == "" {
		cache = DefaultCache
	}
	debianMu.Lock()
	defer debianMu.Unlock()
	if err := os.MkdirAll(cache, 0o755); err != nil {
		t.Fatalf("imagetest: cache: %v", err)
	}
	lock, err := os.OpenFile(filepath.Join(cache, "lock"), os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		t.Fatalf("imagetest: cache: %v", err)
	}
	defer lock.Close()
	if err := unix.Flock(int(lock.Fd()), unix.LOCK_EX); err != nil {
		t.Fatalf("imagetest: cache lock: %v", err)
	}
	dir := filepath.Join(cache, fmt.Sprintf("debian-%s-minbase-zstd-%s", DebianSuite, time.Now().UTC().Format("20060102")))
	if _, err := os.Stat(filepath.Join(dir, "index.json")); err == nil {
		return dir
	}
	// Earlier days' builds go.
	if old, err := filepath.Glob(filepath.Join(cache, "debian-*")); err == nil {
		for _, o := range old {
			os.RemoveAll(o)
		}
	}
	start := time.Now()
	tmp, err := os.MkdirTemp(cache, "build-")
	if err != nil {
		t.Fatalf("imagetest: %v", err)
	}
	defer os.RemoveAll(tmp)
	rootfs := filepath.Join(tmp, "rootfs.tar")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "mmdebstrap", "--quiet", "--variant=minbase", "--format=tar", DebianSuite, rootfs)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("imagetest: mmdebstrap: %v\n%s", err, out)
	}
	built := time.Since(start)
	// zstd: the layer decompresses several times faster than gzip on
	// every import.
	l, err := tarball.LayerFromFile(rootfs, tarball.WithCompression(compression.ZStd), tarball.WithMediaType(types.OCILayerZStd))
	if err != nil {
		t.Fatalf("imagetest: %v", err)
	}
	img, err := mutate.AppendLayers(empty.Image, l)
	if err != nil {
		t.Fatalf("imagetest: %v", err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatalf("imagetest: %v", err)
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", runtime.GOARCH
	cf.Config = v1.Config{Env: []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}, WorkingDir: "/"}
	if img, err = mutate.ConfigFile(img, cf); err != nil {
		t.Fatalf("imagetest: %v", err)
	}
	out := filepath.Join(tmp, "layout")
	p, err := layout.Write(out, empty.Index)
	if err == nil {
		err = p.AppendImage(img)
	}
	if err == nil {
		os.RemoveAll(dir)
		err = os.Rename(out, dir)
	}
	if err != nil {
		t.Fatalf("imagetest: layout: %v", err)
	}
	t.Logf("imagetest: Debian %s minbase built in %v (mmdebstrap %v), cached in %s", DebianSuite, time.Since(start).Round(time.Millisecond), built.Round(time.Millisecond), dir)
	return dir
}
