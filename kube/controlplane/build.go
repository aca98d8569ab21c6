package controlplane

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// KubernetesVersion is the release of k8s.io/kubernetes whose kube-apiserver,
// kube-controller-manager and kube-scheduler Build builds; its staging
// modules (k8s.io/api, k8s.io/apiserver, ...) are replaced by their tagged
// versions StagingVersion, the same ones k8s.io/client-go StagingVersion
// resolves to.
const (
	KubernetesVersion = "v1.37.2"
	StagingVersion    = "v0.37.2"
	// EtcdVersion is the release of go.etcd.io/etcd/server/v3 whose etcd
	// Build builds (the one KubernetesVersion itself requires).
	EtcdVersion = "v3.7.0"
)

// DefaultCache is where Build keeps its binaries unless $CORRAL_TEST_CACHE
// names another directory.
const DefaultCache = "/var/tmp/corral-test-cache"

// stagingModules are the modules k8s.io/kubernetes replaces by its own
// ./staging tree: outside that tree each must be replaced by its tagged
// version StagingVersion, or the module does not resolve (it requires them
// at v0.0.0).
var stagingModules = []string{
	"api", "apiextensions-apiserver", "apimachinery", "apiserver", "cli-runtime",
	"client-go", "cloud-provider", "cluster-bootstrap", "code-generator",
	"component-base", "component-helpers", "controller-manager", "cri-api",
	"cri-client", "cri-streaming", "csi-translation-lib",
	"dynamic-resource-allocation", "endpointslice", "externaljwt", "kms",
	"kube-aggregator", "kube-controller-manager", "kube-proxy", "kube-scheduler",
	"kubectl", "kubelet", "metrics", "mount-utils", "pod-security-admission",
	"sample-apiserver", "sample-cli-plugin", "sample-controller", "streaming",
}

// kubeCommands are the commands of k8s.io/kubernetes Build builds.
var kubeCommands = []string{"kube-apiserver", "kube-controller-manager", "kube-scheduler"}

// Binaries are the paths of the control plane's programs.
type Binaries struct {
	Etcd, APIServer, ControllerManager, Scheduler string
}

// CacheDir returns $CORRAL_TEST_CACHE, or DefaultCache when it is empty.
func CacheDir() string {
	if c := os.Getenv("CORRAL_TEST_CACHE"); c != "" {
		return c
	}
	return DefaultCache
}

// Build returns the control plane's programs built from Go modules
// (KubernetesVersion, EtcdVersion) into cacheDir (CacheDir() when empty),
// in a directory named by the versions and GOOS/GOARCH. The first call
// generates a throwaway module under cacheDir, resolves it through the Go
// module proxy (go mod tidy) and builds the four programs with the go
// command on PATH: about 8 minutes on 2 idle cores with empty module and
// build caches, seconds with warm ones; later calls find the binaries and
// return at once. Processes building at once serialize on a lock file in
// cacheDir; binaries appear in their directory only complete (renamed into
// place). log, when not nil, receives the go command's output. The error
// names the step that failed and carries the go command's output.
func Build(ctx context.Context, cacheDir string, log func(format string, args ...any)) (Binaries, error) {
	if log == nil {
		log = func(string, ...any) {}
	}
	bins, ok := Cached(cacheDir)
	if ok {
		return bins, nil
	}
	if cacheDir == "" {
		cacheDir = CacheDir()
	}
	dir := filepath.Dir(bins.Etcd)
	if err := os.MkdirAll(cacheDir, 0o755); err != nil {
		return Binaries{}, fmt.Errorf("controlplane: cache: %w", err)
	}
	lock, err := os.OpenFile(filepath.Join(cacheDir, "controlplane.lock"), os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return Binaries{}, fmt.Errorf("controlplane: cache lock: %w", err)
	}
	defer lock.Close()
	if err := flock(ctx, lock); err != nil {
		return Binaries{}, err
	}
	if bins.complete() { // another process built them while we waited
		return bins, nil
	}
	goCmd, err := exec.LookPath("go")
	if err != nil {
		return Binaries{}, fmt.Errorf("controlplane: building the control plane needs the go command: %w", err)
	}
	start := time.Now()
	src := filepath.Join(cacheDir, "src", fmt.Sprintf("controlplane-kubernetes-%s-etcd-%s", KubernetesVersion, EtcdVersion))
	if err := writeModule(src); err != nil {
		return Binaries{}, err
	}
	tmp := dir + ".tmp"
	if err := os.RemoveAll(tmp); err != nil {
		return Binaries{}, fmt.Errorf("controlplane: %w", err)
	}
	if err := os.MkdirAll(tmp, 0o755); err != nil {
		return Binaries{}, fmt.Errorf("controlplane: %w", err)
	}
	pkgs := []string{"./cmd/etcd"}
	for _, c := range kubeCommands {
		pkgs = append(pkgs, "k8s.io/kubernetes/cmd/"+c)
	}
	steps := [][]string{
		{"mod", "tidy"},
		append([]string{"build", "-trimpath", "-o", tmp + "/"}, pkgs...),
	}
	for _, args := range steps {
		cmd := exec.CommandContext(ctx, goCmd, args...)
		cmd.Dir = src
		cmd.Env = append(os.Environ(), "GOWORK=off", "GOFLAGS=-buildvcs=false", "GO111MODULE=on")
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		t := time.Now()
		err := cmd.Run()
		log("controlplane: go %s (%v)\n%s", strings.Join(args[:2], " "), time.Since(t).Round(time.Second), out.Bytes())
		if err != nil {
			return Binaries{}, fmt.Errorf("controlplane: go %s in %s: %w\n%s", strings.Join(args, " "), src, err, out.Bytes())
		}
	}
	if err := os.RemoveAll(dir); err != nil {
		return Binaries{}, fmt.Errorf("controlplane: %w", err)
	}
	if err := os.Rename(tmp, dir); err != nil {
		return Binaries{}, fmt.Errorf("controlplane: %w", err)
	}
	if !bins.complete() {
		return Binaries{}, errors.New("controlplane: the build left no binaries in " + dir)
	}
	log("controlplane: built in %v into %s", time.Since(start).Round(time.Second), dir)
	return bins, nil
}

// Cached returns where Build puts the programs in cacheDir (CacheDir()
// when empty), and whether all four are there: it builds nothing.
func Cached(cacheDir string) (Binaries, bool) {
	if cacheDir == "" {
		cacheDir = CacheDir()
	}
	dir := filepath.Join(cacheDir, fmt.Sprintf("controlplane-kubernetes-%s-etcd-%s-%s-%s", KubernetesVersion, EtcdVersion, runtime.GOOS, runtime.GOARCH))
	bins := Binaries{
		Etcd:              filepath.Join(dir, "etcd"),
		APIServer:         filepath.Join(dir, "kube-apiserver"),
		ControllerManager: filepath.Join(dir, "kube-controller-manager"),
		Scheduler:         filepath.Join(dir, "kube-scheduler"),
	}
	return bins, bins.complete()
}

func (b Binaries) complete() bool {
	for _, p := range []string{b.Etcd, b.APIServer, b.ControllerManager, b.Scheduler} {
		if fi, err := os.Stat(p); err != nil || !fi.Mode().IsRegular() || fi.Mode()&0o111 == 0 {
			return false
		}
	}
	return true
}

// flock takes an exclusive lock on f, giving up when ctx ends.
func flock(ctx context.Context, f *os.File) error {
	for {
		err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
		if err == nil {
			return nil
		}
		if !errors.Is(err, unix.EWOULDBLOCK) {
			return fmt.Errorf("controlplane: cache lock: %w", err)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("controlplane: waiting for another build: %w", ctx.Err())
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// writeModule writes the throwaway module that builds the control plane:
// k8s.io/kubernetes with its staging modules replaced by their tags, its
// commands as tools, and an etcd main calling etcdmain.
func writeModule(src string) error {
	var mod strings.Builder
	fmt.Fprintf(&mod, "// Generated by github.com/corral-sandbox/corral/kube/controlplane; rewritten on every build.\nmodule corral.local/controlplane-build\n\ngo 1.26.0\n\n")
	fmt.Fprintf(&mod, "require (\n\tk8s.io/kubernetes %s\n\tgo.etcd.io/etcd/server/v3 %s\n)\n\ntool (\n", KubernetesVersion, EtcdVersion)
	for _, c := range kubeCommands {
		fmt.Fprintf(&mod, "\tk8s.io/kubernetes/cmd/%s\n", c)
	}
	mod.WriteString(")\n\nreplace (\n")
	for _, m := range stagingModules {
		fmt.Fprintf(&mod, "\tk8s.io/%s => k8s.io/%s %s\n", m, m, StagingVersion)
	}
	mod.WriteString(")\n")
	etcdMain := "// Generated by github.com/corral-sandbox/corral/kube/controlplane.\npackage main\n\nimport (\n\t\"os\"\n\n\t\"go.etcd.io/etcd/server/v3/etcdmain\"\n)\n\nfunc main() { etcdmain.Main(os.Args) }\n"
	if err := os.MkdirAll(filepath.Join(src, "cmd", "etcd"), 0o755); err != nil {
		return fmt.Errorf("controlplane: module: %w", err)
	}
	files := map[string]string{"go.mod": mod.String(), filepath.Join("cmd", "etcd", "main.go"): etcdMain}
	for name, text := range files {
		p := filepath.Join(src, name)
		if old, err := os.ReadFile(p); err == nil && string(old) == text {
			continue // keeps go.sum's and go.mod's tidy state
		}
		if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
			return fmt.Errorf("controlplane: module: %w", err)
		}
	}
	return nil
}
