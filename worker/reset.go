package worker

import (
	"context"
	"fmt"
	"os"

	"github.com/corral-sandbox/corral/wire"
)

// Reset discards project id's persistent machine state: the upper layer
// of its root filesystem, where guest root's changes outside the
// workspace and the home live. A running machine of the project is
// stopped first; while it has sessions (or net-dials in flight) Reset
// refuses with an error whose code is "busy" (see ResetError). The
// workspace and the home are kept. No machine of the project starts
// until Reset returns. Resetting a project without state succeeds. It
// blocks until the machine is gone and the state deleted, or ctx ends.
func (w *Worker) Reset(ctx context.Context, id int64) error {
	w.mu.Lock()
	for {
		if w.closed {
			w.mu.Unlock()
			return errClosed
		}
		done := w.resetting[id]
		if done == nil {
			break
		}
		w.mu.Unlock()
		select {
		case <-done:
		case <-ctx.Done():
			return ctx.Err()
		}
		w.mu.Lock()
	}
	if m := w.machines[id]; m != nil {
		m.mu.Lock()
		if m.refs > 0 && !m.stopping {
			n := m.sessions
			m.mu.Unlock()
			w.mu.Unlock()
			return &rejection{wire.CodeBusy, fmt.Sprintf("project %d's machine has %d sessions", id, n)}
		}
		m.stopping = true
		m.mu.Unlock()
		delete(w.machines, id)
	}
	last := w.latest[id]
	done := make(chan struct{})
	w.resetting[id] = done
	w.mu.Unlock()
	defer func() {
		w.mu.Lock()
		delete(w.resetting, id)
		w.mu.Unlock()
		close(done)
	}()
	if last != nil {
		go last.stop("reset")
		select {
		case <-last.dead:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	dir := w.projectDir(id)
	if err := os.RemoveAll(dir); err != nil {
		return fmt.Errorf("worker: reset project %d: %w", id, err)
	}
	if err := os.Remove(dir + ".image"); err != nil && !os.IsNotExist(err) {
		return fmt.Errorf("worker: reset project %d: %w", id, err)
	}
	if err := w.resetDisk(id); err != nil {
		return fmt.Errorf("worker: reset project %d: %w", id, err)
	}
	w.log.Info("project reset", "project", id)
	return nil
}

// machineReset serves a machine-reset request.
func (c *conn) machineReset(m *wire.MachineReset) {
	ctx, cancel := context.WithTimeout(context.Background(), machineStartTimeout)
	defer cancel()
	reset := c.w.Reset
	if m.Forget {
		reset = c.w.Forget
	}
	err := reset(ctx, m.Project.ID)
	if err == nil {
		c.send(&wire.MachineResetDone{ID: m.ID})
		return
	}
	code := wire.CodeInternal
	if r, ok := err.(*rejection); ok {
		code, err = r.code, fmt.Errorf("%s", r.msg)
	}
	c.send(&wire.Error{ID: m.ID, Code: code, Message: err.Error()})
}
