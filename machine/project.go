package machine

import (
	"errors"
	"fmt"

	"github.com/corral-sandbox/corral/internal/layout"
	"github.com/corral-sandbox/corral/wire"
)

// The guest layout (package internal/layout): where a machine's sessions
// find the project's workspace and its home. A request's cwd is a guest
// path under one of them.
const (
	GuestWorkspace = layout.Workspace
	GuestHome      = layout.Home
)

// Project identifies a project's machine and what it is built from.
type Project struct {
	// ID is the project's id; one machine per id.
	ID int64
	// Workspace is the absolute host path of the project's workspace,
	// under the worker's projects root.
	Workspace string
	// Image names the image of the machine's root filesystem. Empty means
	// the worker's default image, "base".
	Image string
	// Limits are the machine's resource limits; a zero field means the
	// worker's default.
	Limits Limits
}

// Limits are a machine's resource limits. A zero field means the worker's
// default; a negative one means no limit.
type Limits struct {
	// Memory is in bytes (swap included where the kernel accounts it).
	Memory int64
	// Pids bounds the machine's tasks (threads count).
	Pids int64
	// CPUMillis is in thousandths of a CPU (1500 is one and a half CPUs).
	CPUMillis int64
	// Disk bounds, in bytes, what the machine writes to its workspace, home
	// and upper layer.
	Disk int64
	// Tmp bounds the machine's /tmp and /dev/shm, in bytes, charged to
	// Memory.
	Tmp int64
}

// ErrUnsupported is returned (wrapped) when a request needs a protocol
// extension the connected worker did not announce: nothing was sent.
var ErrUnsupported = errors.New("machine: the worker does not support this")

// spec reports whether p asks for anything beyond id and workspace.
func (p Project) spec() bool { return p.Image != "" || p.Limits != (Limits{}) }

// wireProject translates p for a worker announcing features (see
// wire.Hello.Features); a request for an extension the worker lacks is an
// error wrapping ErrUnsupported.
func (p Project) wire(features *wire.Hello) (wire.Project, error) {
	wp := wire.Project{ID: p.ID, Workspace: p.Workspace}
	if !p.spec() {
		return wp, nil
	}
	if !features.Has(wire.FeatureMachineSpec) {
		return wp, fmt.Errorf("%w: machine image and limits (feature %q)", ErrUnsupported, wire.FeatureMachineSpec)
	}
	wp.Image = p.Image
	if p.Limits != (Limits{}) {
		l := p.Limits
		wp.Limits = &wire.Limits{Memory: l.Memory, Pids: l.Pids, CPU: l.CPUMillis, Disk: l.Disk, Tmp: l.Tmp}
	}
	return wp, nil
}

// ErrTooLarge is returned (wrapped) by CheckSize for a request that does not
// fit in one protocol frame.
var ErrTooLarge = errors.New("machine: request too large")

// MaxRequest is the protocol's frame size, which one ExecRequest must fit.
const MaxRequest = wire.MaxFrame

// CheckSize reports whether req, with every optional member set, fits in one
// protocol frame; the error wraps ErrTooLarge. Exec refuses such a request
// too, but only once a connection exists: callers check before they commit
// to anything (a lease).
func (req ExecRequest) CheckSize() error {
	// Below this many bytes of strings a frame fits whatever JSON escaping
	// does (every byte as \uXXXX), and nothing is encoded.
	const quick = (wire.MaxFrame - 4096) / 6
	n := len(req.Cwd) + len(req.User) + len(req.Project.Workspace) + len(req.Project.Image) + len(req.ID) + len(req.Lease)
	for _, a := range req.Argv {
		n += len(a) + 1
	}
	for k, v := range req.Env {
		n += len(k) + len(v) + 2
	}
	if n <= quick {
		return nil
	}
	wp := wire.Project{ID: req.Project.ID, Workspace: req.Project.Workspace, Image: req.Project.Image}
	if l := req.Project.Limits; l != (Limits{}) {
		wp.Limits = &wire.Limits{Memory: l.Memory, Pids: l.Pids, CPU: l.CPUMillis, Disk: l.Disk, Tmp: l.Tmp}
	}
	id := req.ID
	if id == "" {
		id = "00000000-0000-0000-0000-000000000000"
	}
	b, err := wire.Encode(&wire.ExecStart{ID: id, Project: wp, Account: req.Account, Lease: req.Lease,
		Argv: req.Argv, Cwd: req.Cwd, Env: req.Env, User: req.User})
	if err != nil {
		return fmt.Errorf("%w: %w", ErrTooLarge, err)
	}
	if len(b) > wire.MaxFrame {
		return fmt.Errorf("%w: %d bytes encoded, a request must fit in %d KiB", ErrTooLarge, len(b), wire.MaxFrame>>10)
	}
	return nil
}
