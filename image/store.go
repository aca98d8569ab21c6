package image

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/corral-sandbox/corral/internal/idrange"
)

const (
	layersDir = "layers"
	imagesDir = "images"
	tmpDir    = "tmp"
	lockFile  = "lock"
	baseLock  = "base.lock"
)

var nameRE = regexp.MustCompile(`^[a-z0-9][a-z0-9._-]{0,63}$`)

func checkName(name string) error {
	if !nameRE.MatchString(name) {
		return fmt.Errorf("%w: %q (want [a-z0-9][a-z0-9._-]{0,63})", ErrInvalidName, name)
	}
	return nil
}

// record is an image's file images/<name>.json. Layers are names of
// directories under layers/.
type record struct {
	Name      string    `json:"name"`
	ID        string    `json:"id"`
	Created   time.Time `json:"created"`
	Size      int64     `json:"size"`
	Layers    []string  `json:"layers"`
	HostBinds []string  `json:"host_binds,omitempty"`
	Config    Config    `json:"config"`
	// Source and Digest: see Image.
	Source string `json:"source,omitempty"`
	Digest string `json:"digest,omitempty"`
	// Version is the generator's stamp (base only).
	Version int `json:"version,omitempty"`
}

func open(dir string, opts Options) (*Store, error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, fmt.Errorf("image: store: %w", err)
	}
	if err := os.MkdirAll(abs, 0o700); err != nil {
		return nil, fmt.Errorf("image: store: %w", err)
	}
	st, err := os.Lstat(abs)
	if err != nil {
		return nil, fmt.Errorf("image: store: %w", err)
	}
	if !st.IsDir() {
		return nil, fmt.Errorf("image: store %s is not a directory", abs)
	}
	if uid := st.Sys().(*syscall.Stat_t).Uid; int(uid) != os.Geteuid() {
		return nil, fmt.Errorf("image: store %s is owned by uid %d, not by this user (%d)", abs, uid, os.Geteuid())
	}
	if st.Mode().Perm()&0o077 != 0 {
		if err := os.Chmod(abs, 0o700); err != nil {
			return nil, fmt.Errorf("image: store: %w", err)
		}
	}
	// The store's root and its directories are 0700 each: either alone
	// keeps other host users away from the layers.
	for _, d := range []string{layersDir, imagesDir, tmpDir} {
		p := filepath.Join(abs, d)
		if err := os.Mkdir(p, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
			return nil, fmt.Errorf("image: store: %w", err)
		}
		if err := os.Chmod(p, 0o700); err != nil {
			return nil, fmt.Errorf("image: store: %w", err)
		}
	}
	ids, err := idrange.Claim(opts.Registry, abs, IDCount)
	if err != nil {
		return nil, fmt.Errorf("image: store ids: %w", err)
	}
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	maxSize := opts.MaxSize
	if maxSize <= 0 {
		maxSize = DefaultMaxSize
	}
	return &Store{dir: abs, ids: ids, log: log, maxSize: maxSize}, nil
}

// lock takes the store's flock, shared or exclusive, and returns its
// release. It gives up when ctx ends.
func (s *Store) lock(ctx context.Context, exclusive bool) (func(), error) {
	return s.flock(ctx, lockFile, exclusive)
}

// flock takes a flock on the file name in the store.
func (s *Store) flock(ctx context.Context, name string, exclusive bool) (func(), error) {
	f, err := os.OpenFile(filepath.Join(s.dir, name), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("image: lock: %w", err)
	}
	how := unix.LOCK_SH
	if exclusive {
		how = unix.LOCK_EX
	}
	done := make(chan error, 1)
	go func() { done <- flockRetry(f, how) }()
	select {
	case err := <-done:
		if err != nil {
			f.Close()
			return nil, fmt.Errorf("image: lock: %w", err)
		}
		return func() { f.Close() }, nil
	case <-ctx.Done():
		// Closing the file drops the lock once flock returns.
		go func() { <-done; f.Close() }()
		return nil, ctx.Err()
	}
}

func flockRetry(f *os.File, how int) error {
	for {
		err := unix.Flock(int(f.Fd()), how)
		if err != unix.EINTR {
			return err
		}
	}
}

func (s *Store) recordPath(name string) string {
	return filepath.Join(s.dir, imagesDir, name+".json")
}

func (s *Store) readRecord(name string) (*record, error) {
	b, err := os.ReadFile(s.recordPath(name))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("%w: %s", ErrNotFound, name)
	}
	if err != nil {
		return nil, fmt.Errorf("image: %s: %w", name, err)
	}
	var r record
	if err := json.Unmarshal(b, &r); err != nil {
		return nil, fmt.Errorf("image: %s: bad record: %w", name, err)
	}
	return &r, nil
}

// writeRecord writes r atomically (a temporary file renamed over the
// record).
func (s *Store) writeRecord(r *record) error {
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	tmp := s.recordPath(r.Name) + "." + randHex() + ".tmp"
	if err := os.WriteFile(tmp, append(b, '\n'), 0o600); err != nil {
		return fmt.Errorf("image: %s: %w", r.Name, err)
	}
	if err := os.Rename(tmp, s.recordPath(r.Name)); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("image: %s: %w", r.Name, err)
	}
	return nil
}

func (s *Store) toImage(r *record) *Image {
	im := &Image{
		Name:      r.Name,
		ID:        r.ID,
		Created:   r.Created,
		Size:      r.Size,
		HostBinds: slices.Clone(r.HostBinds),
		Config:    r.Config,
		Source:    r.Source,
		Digest:    r.Digest,
	}
	for _, l := range r.Layers {
		im.Layers = append(im.Layers, filepath.Join(s.dir, layersDir, l))
	}
	return im
}

func (s *Store) get(ctx context.Context, name string) (*Image, error) {
	if name == BaseName {
		return s.base(ctx)
	}
	if err := checkName(name); err != nil {
		return nil, err
	}
	r, err := s.readRecord(name)
	if err != nil {
		return nil, err
	}
	return s.toImage(r), nil
}

func (s *Store) list(ctx context.Context) ([]Image, error) {
	ents, err := os.ReadDir(filepath.Join(s.dir, imagesDir))
	if err != nil {
		return nil, fmt.Errorf("image: list: %w", err)
	}
	var out []Image
	for _, e := range ents {
		name, ok := strings.CutSuffix(e.Name(), ".json")
		if !ok || checkName(name) != nil {
			continue
		}
		r, err := s.readRecord(name)
		if errors.Is(err, ErrNotFound) {
			continue // removed meanwhile
		}
		if err != nil {
			return nil, err
		}
		out = append(out, *s.toImage(r))
	}
	return out, ctx.Err()
}

func (s *Store) remove(ctx context.Context, name string, inUse func(string) (bool, error)) error {
	if err := checkName(name); err != nil {
		return err
	}
	unlock, err := s.lock(ctx, true)
	if err != nil {
		return err
	}
	defer unlock()
	if _, err := s.readRecord(name); err != nil {
		return err
	}
	if inUse != nil {
		used, err := inUse(name)
		if err != nil {
			return fmt.Errorf("image: %s: %w", name, err)
		}
		if used {
			return fmt.Errorf("%w: %s", ErrInUse, name)
		}
	}
	if err := os.Remove(s.recordPath(name)); err != nil {
		return fmt.Errorf("image: %s: %w", name, err)
	}
	return s.collect()
}

// collect deletes the layers no image names and leftovers of interrupted
// imports. The caller holds the exclusive lock.
func (s *Store) collect() error {
	imgs, err := s.list(context.Background())
	if err != nil {
		return err
	}
	keep := map[string]bool{}
	for _, im := range imgs {
		for _, l := range im.Layers {
			keep[filepath.Base(l)] = true
		}
	}
	var errs []error
	ents, err := os.ReadDir(filepath.Join(s.dir, layersDir))
	if err != nil {
		return fmt.Errorf("image: collect: %w", err)
	}
	for _, e := range ents {
		layer, _ := strings.CutSuffix(e.Name(), ".json")
		if !keep[layer] {
			s.log.Info("image: layer removed", "layer", e.Name())
			errs = append(errs, removeAll(filepath.Join(s.dir, layersDir, e.Name())))
		}
	}
	ents, err = os.ReadDir(filepath.Join(s.dir, tmpDir))
	if err != nil {
		return fmt.Errorf("image: collect: %w", err)
	}
	for _, e := range ents {
		errs = append(errs, removeAll(filepath.Join(s.dir, tmpDir, e.Name())))
	}
	return errors.Join(errs...)
}

// removeAll removes a tree; os.RemoveAll never follows symlinks. An
// immutable or append-only flag cannot be set by the unpacker, so every
// file is removable by root.
func removeAll(path string) error {
	if err := os.RemoveAll(path); err != nil {
		return fmt.Errorf("image: %w", err)
	}
	return nil
}

func randHex() string {
	var b [8]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}
