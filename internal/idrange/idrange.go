// Package idrange hands out blocks of host user and group ids to corral's
// state directories, so that no two of them on one host ever map the same
// host ids into their machines or images.
//
// A block is claimed by an owner — the absolute path of a directory: a
// worker's state directory, an image store — in a host-wide registry file
// (DefaultRegistry), under an exclusive flock(2). A claim is stable: the
// same owner gets the same block for as long as the registry records it.
// Blocks are aligned to [Align] ids, start at or above [Floor], and never
// overlap another claim or any range that /etc/subuid or /etc/subgid grant
// (the host's own registry of subordinate ids, used by rootless containers
// and newuidmap). A claim whose owner directory no longer exists is
// reclaimed by the next Claim: a state directory removed (a test's
// temporary one, a wiped installation) frees its ids, and its files, which
// carried those ids, are gone with it.
//
// The ids of a claimed block belong to corral alone: nothing else on the
// host should use them (no login user, no other container runtime).
package idrange

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// DefaultRegistry is the host-wide registry of claims.
const DefaultRegistry = "/var/lib/corral/id-ranges.json"

// Floor is the lowest id a block may start at: far above the ids
// distributions give to users (1000–60000) and to the first ranges
// useradd writes to /etc/subuid (from 100000).
const Floor = 1 << 24

// Align is the alignment, and the unit, of blocks: the 65536 ids of one
// machine's user namespace.
const Align = 1 << 16

// Range is a block of host ids: [Start, Start+Size).
type Range struct {
	Start uint32 `json:"start"`
	Size  uint32 `json:"size"`
}

// End returns the first id after r.
func (r Range) End() uint64 { return uint64(r.Start) + uint64(r.Size) }

func (r Range) overlaps(o Range) bool {
	return uint64(r.Start) < o.End() && uint64(o.Start) < r.End()
}

// claim is one registry entry.
type claim struct {
	Owner string `json:"owner"`
	Range
}

// ErrExhausted is returned when no block of the requested size is free.
var ErrExhausted = errors.New("idrange: no free block of host ids")

// Claim returns owner's block in registry (DefaultRegistry if empty),
// claiming one of size ids (rounded up to Align) if owner has none. owner
// must be an existing directory; it is recorded by its absolute,
// symlink-free path. An owner whose recorded block is smaller than size
// gets an error: blocks never grow in place (the ids already handed out
// stay where they are). Claim is safe for concurrent use by processes and
// goroutines (it holds an exclusive lock on the registry while it reads
// and rewrites it).
func Claim(registry, owner string, size uint32) (Range, error) {
	if registry == "" {
		registry = DefaultRegistry
	}
	if size == 0 {
		return Range{}, errors.New("idrange: empty block requested")
	}
	want := (uint64(size) + Align - 1) / Align * Align
	if want > math.MaxUint32-Floor {
		return Range{}, fmt.Errorf("idrange: block of %d ids is too large", size)
	}
	abs, err := canonical(owner)
	if err != nil {
		return Range{}, err
	}
	var got Range
	err = update(registry, func(claims []claim) ([]claim, error) {
		// Reclaim the blocks of owners that are gone.
		claims = slices.DeleteFunc(claims, func(c claim) bool {
			st, err := os.Stat(c.Owner)
			return errors.Is(err, os.ErrNotExist) || err == nil && !st.IsDir()
		})
		for _, c := range claims {
			if c.Owner == abs {
				if uint64(c.Size) < want {
					return nil, fmt.Errorf("idrange: %s holds %d ids from %d, fewer than the %d asked for", abs, c.Size, c.Start, want)
				}
				got = c.Range
				return claims, nil
			}
		}
		taken := hostRanges()
		for _, c := range claims {
			taken = append(taken, c.Range)
		}
		r, ok := firstFit(taken, uint32(want))
		if !ok {
			return nil, fmt.Errorf("%w: %d ids wanted for %s", ErrExhausted, want, abs)
		}
		got = r
		return append(claims, claim{Owner: abs, Range: r}), nil
	})
	return got, err
}

// Release drops owner's claim, if any: its ids may be handed out again.
// The caller must make sure nothing carries them any more.
func Release(registry, owner string) error {
	if registry == "" {
		registry = DefaultRegistry
	}
	abs, err := canonical(owner)
	if err != nil {
		return err
	}
	return update(registry, func(claims []claim) ([]claim, error) {
		return slices.DeleteFunc(claims, func(c claim) bool { return c.Owner == abs }), nil
	})
}

func canonical(owner string) (string, error) {
	abs, err := filepath.Abs(owner)
	if err == nil {
		abs, err = filepath.EvalSymlinks(abs)
	}
	if err != nil {
		return "", fmt.Errorf("idrange: owner: %w", err)
	}
	st, err := os.Stat(abs)
	if err != nil {
		return "", fmt.Errorf("idrange: owner: %w", err)
	}
	if !st.IsDir() {
		return "", fmt.Errorf("idrange: owner %s is not a directory", abs)
	}
	return abs, nil
}

// firstFit returns the lowest aligned block of size ids at or above Floor
// that overlaps none of taken.
func firstFit(taken []Range, size uint32) (Range, bool) {
	slices.SortFunc(taken, func(a, b Range) int {
		switch {
		case a.Start < b.Start:
			return -1
		case a.Start > b.Start:
			return 1
		}
		return 0
	})
	start := uint64(Floor)
	for _, t := range taken {
		cand := Range{Start: uint32(start), Size: size}
		if start+uint64(size) > math.MaxUint32 {
			return Range{}, false
		}
		if cand.overlaps(t) {
			start = max(start, (t.End()+Align-1)/Align*Align)
		}
	}
	if start+uint64(size) > math.MaxUint32 {
		return Range{}, false
	}
	return Range{Start: uint32(start), Size: size}, true
}

// subIDFiles are the host's registries of subordinate ids.
var subIDFiles = []string{"/etc/subuid", "/etc/subgid"}

// hostRanges returns the subordinate id ranges /etc/subuid and /etc/subgid
// grant (lines "name:start:count"); unreadable files grant none.
func hostRanges() []Range {
	var out []Range
	for _, f := range subIDFiles {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(b), "\n") {
			parts := strings.Split(strings.TrimSpace(line), ":")
			if len(parts) != 3 {
				continue
			}
			start, err1 := strconv.ParseUint(parts[1], 10, 32)
			count, err2 := strconv.ParseUint(parts[2], 10, 32)
			if err1 != nil || err2 != nil || count == 0 {
				continue
			}
			out = append(out, Range{Start: uint32(start), Size: uint32(min(count, math.MaxUint32-start))})
		}
	}
	return out
}

// update rewrites the registry through fn under an exclusive lock. The
// registry is replaced by rename, so a crash leaves the old or the new
// contents, never a torn file; the lock is taken on a separate lock file,
// which the rename does not replace.
func update(registry string, fn func([]claim) ([]claim, error)) error {
	if err := os.MkdirAll(filepath.Dir(registry), 0o700); err != nil {
		return fmt.Errorf("idrange: registry: %w", err)
	}
	lock, err := os.OpenFile(registry+".lock", os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return fmt.Errorf("idrange: registry: %w", err)
	}
	defer lock.Close()
	for {
		err = unix.Flock(int(lock.Fd()), unix.LOCK_EX)
		if err != unix.EINTR {
			break
		}
	}
	if err != nil {
		return fmt.Errorf("idrange: lock registry: %w", err)
	}
	var claims []claim
	b, err := os.ReadFile(registry)
	switch {
	case errors.Is(err, os.ErrNotExist):
	case err != nil:
		return fmt.Errorf("idrange: registry: %w", err)
	case len(b) > 0:
		if err := json.Unmarshal(b, &claims); err != nil {
			return fmt.Errorf("idrange: registry %s is corrupt: %w", registry, err)
		}
	}
	claims, err = fn(claims)
	if err != nil {
		return err
	}
	out, err := json.MarshalIndent(claims, "", "\t")
	if err != nil {
		return err
	}
	tmp := registry + ".tmp"
	if err := os.WriteFile(tmp, append(out, '\n'), 0o600); err != nil {
		return fmt.Errorf("idrange: registry: %w", err)
	}
	if err := os.Rename(tmp, registry); err != nil {
		return fmt.Errorf("idrange: registry: %w", err)
	}
	return nil
}
