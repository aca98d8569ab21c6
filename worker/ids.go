package worker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"

	"github.com/corral-sandbox/corral/internal/idrange"
)

// slotsFile, in the state directory, records each project's id-range slot.
const slotsFile = "id-slots.json"

// slotState is the content of slotsFile.
type slotState struct {
	// Start is the first host id of the worker's block when the file was
	// written (informative: slots are relative to the block).
	Start uint32 `json:"start"`
	// Slots maps project ids (decimal) to slots.
	Slots map[string]int `json:"slots"`
	// Workspaces maps project ids (decimal) to the host workspace their
	// machine was last started for: a slot whose workspace is gone is
	// freed at the worker's start (see reconcileSlots). Absent in files
	// of older workers.
	Workspaces map[string]string `json:"workspaces,omitempty"`
}

// claimIDs returns the worker's block of host ids: Config.UIDBase's if set
// (unsafe, unregistered), else its state directory's claim in the host-wide
// registry.
func claimIDs(cfg *Config, stateDir string) (idrange.Range, error) {
	size := uint64(cfg.MaxProjects) * RangeSize
	if size > 1<<32-1-idrange.Floor {
		return idrange.Range{}, fmt.Errorf("worker: MaxProjects %d needs more host ids than exist", cfg.MaxProjects)
	}
	if cfg.UIDBase != 0 {
		if cfg.UIDBase < RangeSize {
			return idrange.Range{}, fmt.Errorf("worker: UIDBase %d would map guests onto ordinary host ids (below %d)", cfg.UIDBase, RangeSize)
		}
		if uint64(cfg.UIDBase)+size > 1<<32-1 {
			size = (1<<32 - 1 - uint64(cfg.UIDBase)) / RangeSize * RangeSize
		}
		return idrange.Range{Start: cfg.UIDBase, Size: uint32(size)}, nil
	}
	r, err := idrange.Claim(cfg.IDRegistry, stateDir, uint32(size))
	if err != nil {
		return idrange.Range{}, fmt.Errorf("worker: host ids: %w", err)
	}
	return r, nil
}

// loadSlots reads the persisted project slots (none if the file is
// missing).
func (w *Worker) loadSlots() error {
	b, err := os.ReadFile(filepath.Join(w.cfg.StateDir, slotsFile))
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("worker: %w", err)
	}
	var st slotState
	if err := json.Unmarshal(b, &st); err != nil {
		return fmt.Errorf("worker: %s is corrupt: %w", slotsFile, err)
	}
	if st.Start != 0 && st.Start != w.ids.Start {
		w.log.Warn("the worker's host id block moved: files of existing projects keep their old owners",
			"was", st.Start, "now", w.ids.Start)
	}
	for k, s := range st.Slots {
		id, err := strconv.ParseInt(k, 10, 64)
		if err != nil || s < 0 {
			return fmt.Errorf("worker: %s: bad entry %q: %d", slotsFile, k, s)
		}
		w.slots[id] = s
		w.used[s] = true
		if ws := st.Workspaces[k]; ws != "" {
			w.workspaces[id] = ws
		}
	}
	return nil
}

// reconcileSlots frees the slot, home and machine state of every project
// whose recorded workspace is gone (its project was deleted while no
// worker ran, or by a daemon that could not tell the worker). Called
// by New before any machine starts.
func (w *Worker) reconcileSlots() {
	for id, ws := range w.workspaces {
		if _, err := os.Lstat(ws); !errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err := w.ForgetProject(id); err != nil {
			w.log.Warn("cannot free the id range of a project whose workspace is gone", "project", id, "workspace", ws, "err", err)
			continue
		}
		w.log.Info("freed the id range of a project whose workspace is gone", "project", id, "workspace", ws)
	}
}

// saveSlots persists the slots atomically (a new file renamed over the
// old one, both synced). Called with w.mu held.
func (w *Worker) saveSlots() error {
	st := slotState{Start: w.ids.Start, Slots: make(map[string]int, len(w.slots)), Workspaces: make(map[string]string, len(w.workspaces))}
	for id, s := range w.slots {
		st.Slots[strconv.FormatInt(id, 10)] = s
		if ws := w.workspaces[id]; ws != "" {
			st.Workspaces[strconv.FormatInt(id, 10)] = ws
		}
	}
	b, err := json.MarshalIndent(st, "", "\t")
	if err != nil {
		return err
	}
	dir := w.cfg.StateDir
	f, err := os.CreateTemp(dir, slotsFile+".*")
	if err != nil {
		return fmt.Errorf("worker: save slots: %w", err)
	}
	tmp := f.Name()
	_, err = f.Write(append(b, '\n'))
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, filepath.Join(dir, slotsFile))
	}
	if err != nil {
		os.Remove(tmp)
		return fmt.Errorf("worker: save slots: %w", err)
	}
	if d, err := os.Open(dir); err == nil {
		_ = d.Sync()
		d.Close()
	}
	return nil
}

// ErrTooManyProjects is returned (wrapped, and as a "machine-failed"
// rejection on the wire) when a new project needs an id-range slot and
// all Config.MaxProjects are taken.
var ErrTooManyProjects = errors.New("too-many-projects")

// slot returns the id-range slot of project id, allocating and persisting
// one on first use, and records ws as its workspace. Called with w.mu
// held.
func (w *Worker) slot(id int64, ws string) (int, error) {
	if s, ok := w.slots[id]; ok {
		if ws != "" && w.workspaces[id] != ws {
			prev, had := w.workspaces[id]
			w.workspaces[id] = ws
			if err := w.saveSlots(); err != nil {
				if had {
					w.workspaces[id] = prev
				} else {
					delete(w.workspaces, id)
				}
				return 0, err
			}
		}
		return s, nil
	}
	n := int(w.ids.Size / RangeSize)
	s := 0
	for s < n && w.used[s] {
		s++
	}
	if s == n {
		return 0, fmt.Errorf("%w: this worker holds id ranges for %d projects, its maximum (MaxProjects): discard a project to free one", ErrTooManyProjects, n)
	}
	w.used[s] = true
	w.slots[id] = s
	if ws != "" {
		w.workspaces[id] = ws
	}
	if err := w.saveSlots(); err != nil {
		delete(w.slots, id)
		delete(w.used, s)
		delete(w.workspaces, id)
		return 0, err
	}
	return s, nil
}

// hostUIDOf returns the host id guest root of a machine in slot s maps to.
func (w *Worker) hostUIDOf(s int) uint32 { return w.ids.Start + uint32(s)*RangeSize }

// Forget discards everything the worker keeps of project id: its machine
// (stopped first; refused with code "busy" while it has sessions, as
// Reset), its upper layer, disk and home, and its id-range slot, which a
// new project may then have. Call it when the project is deleted. ctx
// bounds the wait for the machine to stop.
func (w *Worker) Forget(ctx context.Context, id int64) error {
	if err := w.Reset(ctx, id); err != nil {
		return err
	}
	return w.ForgetProject(id)
}

// ForgetProject frees project id's id-range slot, so that a new project
// may have it, after removing what carries its ids: its home, the upper
// layer of its machine and its disk. Call it when the project is
// discarded (Forget also refuses while the machine has sessions). A
// running machine of the project is stopped first; ForgetProject waits
// until it is gone. Forgetting an unknown project does nothing. It fails
// if the files cannot be removed or the slots cannot be persisted (the
// slot then stays taken).
func (w *Worker) ForgetProject(id int64) error {
	w.mu.Lock()
	m := w.machines[id]
	if m != nil {
		delete(w.machines, id)
	}
	last := w.latest[id]
	w.mu.Unlock()
	if m != nil {
		m.stop("project discarded")
		<-m.dead
	}
	if last != nil && last != m {
		last.stop("project discarded")
		<-last.dead
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if m := w.machines[id]; m != nil {
		return fmt.Errorf("worker: project %d started a new machine while being forgotten", id)
	}
	s, ok := w.slots[id]
	if !ok {
		return nil
	}
	if err := w.removeProjectState(id); err != nil {
		return fmt.Errorf("worker: forget project %d: %w", id, err)
	}
	delete(w.slots, id)
	ws, hadWS := w.workspaces[id]
	delete(w.workspaces, id)
	if err := w.saveSlots(); err != nil {
		w.slots[id] = s
		if hadWS {
			w.workspaces[id] = ws
		}
		return err
	}
	delete(w.used, s)
	return nil
}

// removeProjectState removes the files that carry project id's ids: its
// home, its upper layer (and the record of its image) and its disk. No
// machine of the project runs.
func (w *Worker) removeProjectState(id int64) error {
	dir := w.projectDir(id)
	image, _ := w.disks.paths(id)
	for _, p := range []string{filepath.Join(w.cfg.HomesRoot, strconv.FormatInt(id, 10)), dir, dir + ".image", image, image + ".reset"} {
		if err := os.RemoveAll(p); err != nil {
			return err
		}
	}
	return nil
}
