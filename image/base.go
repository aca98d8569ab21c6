package image

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// baseVersion is the stamp of the generator below: a base record with
// another stamp is remade. Bump it when the generated tree changes.
const baseVersion = 2

// baseHostBinds are the host paths a base machine binds read-only.
var baseHostBinds = []string{"/usr"}

// The generated /etc. passwd and group name root and the guest user
// "user" (1000), whose home is where the machine mounts the project's
// persistent home; nobody for programs that drop to it. Machines have no
// network: resolv.conf names no server and hosts only localhost. gitconfig
// trusts the workspace: a host checkout owned by root is bound into the
// machine as is (its owner shows as the overflow id), and git would refuse
// it as of dubious ownership; the host's own git is not affected.
var baseFiles = map[string]string{
	"etc/passwd": "root:x:0:0:root:/root:/bin/sh\n" +
		"user:x:1000:1000:corral user:/home/corral:/bin/sh\n" +
		"nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n",
	"etc/group":       "root:x:0:\nuser:x:1000:\nnogroup:x:65534:\n",
	"etc/hostname":    "corral\n",
	"etc/hosts":       "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n",
	"etc/resolv.conf": "# A corral machine has no network, hence no name server.\n",
	"etc/nsswitch.conf": "passwd: files\ngroup: files\nshadow: files\nhosts: files\n" +
		"networks: files\nprotocols: files\nservices: files\nethers: files\nrpc: files\n",
	"etc/gitconfig": "[safe]\n\tdirectory = /workspace\n\tdirectory = /workspace/*\n",
}

// baseDirs are the generated directories: mount points and the skeleton.
var baseDirs = []struct {
	path string
	mode fs.FileMode
	uid  uint32
}{
	{"usr", 0o755, 0}, {"proc", 0o555, 0}, {"sys", 0o555, 0}, {"dev", 0o755, 0},
	{"tmp", 0o1777, 0}, {"run", 0o755, 0}, {"var", 0o755, 0}, {"var/tmp", 0o1777, 0},
	{"home", 0o755, 0}, {"home/corral", 0o755, 1000}, {"workspace", 0o755, 0},
	{"root", 0o700, 0}, {"etc", 0o755, 0}, {"etc/ssl", 0o755, 0}, {"etc/ssl/certs", 0o755, 0},
	{"etc/ld.so.conf.d", 0o755, 0}, {"etc/alternatives", 0o755, 0},
}

// baseLinks are generated symlinks.
var baseLinks = map[string]string{
	"etc/mtab":      "../proc/self/mounts",
	"etc/localtime": "/usr/share/zoneinfo/Etc/UTC",
}

// baseCopies are host files copied (regular files as files, symlinks as
// symlinks) when the host has them: the dynamic linker's cache and
// configuration, the CA bundle, OpenSSL's configuration, the host's
// os-release (Debian's is a link into /usr/lib, which the machine sees),
// and netbase's protocol and service tables. Directories marked "/*" are
// copied one level deep, their regular files and symlinks only.
var baseCopies = []string{
	"/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d/*",
	"/etc/ssl/certs/*", "/etc/ssl/openssl.cnf",
	"/etc/alternatives/*",
	"/etc/os-release", "/etc/protocols", "/etc/services",
}

// base returns the image "base", making it if the store has none or an
// older generator's.
func (s *Store) base(ctx context.Context) (*Image, error) {
	if r, err := s.readRecord(BaseName); err == nil && r.Version == baseVersion {
		return s.toImage(r), nil
	} else if err != nil && !errors.Is(err, ErrNotFound) {
		return nil, err
	}
	// Shared with imports (which need not wait), exclusive among makers
	// of base; Remove waits.
	unlock, err := s.lock(ctx, false)
	if err != nil {
		return nil, err
	}
	defer unlock()
	unlockBase, err := s.flock(ctx, baseLock, true)
	if err != nil {
		return nil, err
	}
	defer unlockBase()
	if r, err := s.readRecord(BaseName); err == nil && r.Version == baseVersion {
		return s.toImage(r), nil // made meanwhile
	}
	start := time.Now()
	r, err := s.makeBase()
	if err != nil {
		return nil, err
	}
	if err := s.writeRecord(r); err != nil {
		return nil, err
	}
	s.log.Info("image: base made", "layer", r.Layers[0], "files", r.Size, "duration", time.Since(start))
	return s.toImage(r), nil
}

func (s *Store) makeBase() (*record, error) {
	tmp, err := os.MkdirTemp(filepath.Join(s.dir, tmpDir), "base-")
	if err != nil {
		return nil, fmt.Errorf("image: base: %w", err)
	}
	done := false
	defer func() {
		if !done {
			os.RemoveAll(tmp)
		}
	}()
	b := &baseBuilder{root: tmp, shift: s.ids.Start, sum: sha256.New()}
	if err := b.build(); err != nil {
		return nil, fmt.Errorf("image: base: %w", err)
	}
	now := time.Now().UTC()
	layer := fmt.Sprintf("base-%d", now.UnixNano())
	if err := s.writeLayerMeta(layer, layerMeta{Size: b.size, Files: b.files}); err != nil {
		return nil, fmt.Errorf("image: base: %w", err)
	}
	if err := os.Rename(tmp, filepath.Join(s.dir, layersDir, layer)); err != nil {
		return nil, fmt.Errorf("image: base: %w", err)
	}
	done = true
	return &record{
		Name:      BaseName,
		ID:        "sha256:" + hex.EncodeToString(b.sum.Sum(nil)),
		Created:   now,
		Size:      b.size,
		Layers:    []string{layer},
		HostBinds: baseHostBinds,
		// No WorkingDir: the worker's default, the machine's workspace.
		Config:  Config{User: "user"},
		Version: baseVersion,
	}, nil
}

// baseBuilder writes the base tree into root, a fresh private directory,
// owning every file by the store's ids.
type baseBuilder struct {
	root  string
	shift uint32
	size  int64
	files int
	sum   hash.Hash
}

func (b *baseBuilder) note(kind, path, what string) {
	fmt.Fprintf(b.sum, "%s %s %s\n", kind, path, what)
}

func (b *baseBuilder) own(p string, uid uint32) error {
	return os.Lchown(p, int(b.shift+uid), int(b.shift+uid))
}

func (b *baseBuilder) build() error {
	if err := os.Chmod(b.root, 0o755); err != nil {
		return err
	}
	if err := b.own(b.root, 0); err != nil {
		return err
	}
	for _, d := range baseDirs {
		p := filepath.Join(b.root, d.path)
		if err := os.Mkdir(p, d.mode); err != nil {
			return err
		}
		if err := os.Chmod(p, d.mode); err != nil { // past the umask
			return err
		}
		if err := b.own(p, d.uid); err != nil {
			return err
		}
		b.note("dir", d.path, d.mode.String())
	}
	// The host's merged-usr links: top-level symlinks into usr.
	ents, err := os.ReadDir("/")
	if err != nil {
		return err
	}
	for _, e := range ents {
		if e.Type()&fs.ModeSymlink == 0 {
			continue
		}
		target, err := os.Readlink("/" + e.Name())
		if err != nil {
			return err
		}
		if t := strings.TrimPrefix(filepath.Clean(target), "/"); t == "usr" || strings.HasPrefix(t, "usr/") {
			if err := b.link(e.Name(), target); err != nil {
				return err
			}
		}
	}
	for p, c := range baseFiles {
		if err := b.file(p, strings.NewReader(c), 0o644); err != nil {
			return err
		}
	}
	for p, t := range baseLinks {
		if err := b.link(p, t); err != nil {
			return err
		}
	}
	for _, c := range baseCopies {
		dir, ok := strings.CutSuffix(c, "/*")
		if !ok {
			if err := b.copy(c); err != nil {
				return err
			}
			continue
		}
		ents, err := os.ReadDir(dir)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return err
		}
		for _, e := range ents {
			if err := b.copy(filepath.Join(dir, e.Name())); err != nil {
				return err
			}
		}
	}
	return nil
}

func (b *baseBuilder) link(rel, target string) error {
	p := filepath.Join(b.root, rel)
	if err := os.Symlink(target, p); err != nil {
		return err
	}
	b.files++
	b.note("link", rel, target)
	return b.own(p, 0)
}

func (b *baseBuilder) file(rel string, r io.Reader, mode fs.FileMode) error {
	p := filepath.Join(b.root, rel)
	f, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_EXCL, mode)
	if err != nil {
		return err
	}
	h := sha256.New()
	n, err := io.Copy(f, io.TeeReader(r, h))
	if err == nil {
		err = f.Chmod(mode)
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	b.size += n
	b.files++
	b.note("file", rel, hex.EncodeToString(h.Sum(nil)))
	return b.own(p, 0)
}

// copy copies the host's path (absolute, under /etc) into the tree if it
// is a regular file or a symlink; anything else, or nothing, is skipped.
func (b *baseBuilder) copy(host string) error {
	rel := strings.TrimPrefix(host, "/")
	st, err := os.Lstat(host)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	switch {
	case st.Mode()&fs.ModeSymlink != 0:
		t, err := os.Readlink(host)
		if err != nil {
			return err
		}
		return b.link(rel, t)
	case st.Mode().IsRegular():
		f, err := os.Open(host)
		if err != nil {
			return err
		}
		defer f.Close()
		return b.file(rel, f, st.Mode().Perm()&0o755)
	}
	return nil
}
