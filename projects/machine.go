package projects

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"

	"github.com/corral-sandbox/corral/internal/errdefs"
	"github.com/corral-sandbox/corral/machine"
	"github.com/corral-sandbox/corral/store"
)

// ResetMachine discards managed project p's machine state through gw (see
// machine.Gateway.Reset). It refuses with store.ErrProjectBusy while the
// project has a live lease or its machine has sessions; without a
// privileged transport it is machine.ErrNoPrivilegedTransport.
func ResetMachine(ctx context.Context, st store.Store, gw *machine.Gateway, p store.Project) error {
	live, err := st.ProjectLiveLeases(ctx, p.ID)
	if err != nil {
		return err
	}
	if live > 0 {
		return fmt.Errorf("project %d has %d live lease(s): %w", p.ID, live, store.ErrProjectBusy)
	}
	if !gw.HasTransport() {
		return fmt.Errorf("reset project %d: %w", p.ID, machine.ErrNoPrivilegedTransport)
	}
	err = gw.Reset(ctx, machine.Project{ID: p.ID, Workspace: p.Root})
	var rej *machine.RejectedError
	switch {
	case errors.As(err, &rej) && errors.Is(err, machine.ErrBusy):
		return fmt.Errorf("%s: %w", rej.Message, store.ErrProjectBusy)
	case errors.Is(err, machine.ErrUnsupported):
		return errdefs.Wrap(fmt.Errorf("the worker cannot reset machines: %w", err), errdefs.Unavailable)
	}
	return err
}

// RemoveMachineState removes what a worker keeps of project id under the
// worker state directory workerState (<state>/worker): the upper layer of
// its machine's root. For a worker that is not running, or a project that
// is gone.
func RemoveMachineState(workerState string, id int64) error {
	dir := filepath.Join(workerState, "uppers", strconv.FormatInt(id, 10))
	if err := os.RemoveAll(dir); err != nil {
		return err
	}
	if err := os.Remove(dir + ".image"); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}
