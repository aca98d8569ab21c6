package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"syscall"

	"github.com/corral-sandbox/corral/core"
	"github.com/corral-sandbox/corral/image"
	"github.com/corral-sandbox/corral/internal/safepath"
	"github.com/corral-sandbox/corral/machine"
	"github.com/corral-sandbox/corral/projects"
	"github.com/corral-sandbox/corral/sandbox"
	"github.com/corral-sandbox/corral/store"
)

// cliLogger is the logger of one-shot CLI commands: corral's stderr carries
// the command's output, so only errors are logged, unless $CORRAL_LOG is
// "debug", "info" or "warn".
func cliLogger() *slog.Logger {
	level := slog.LevelError
	_ = level.UnmarshalText([]byte(os.Getenv("CORRAL_LOG")))
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
}

// localAccount is the account `corral run` acts as on its embedded defaults.
const localAccount = "local"

// stateDir returns the state directory: the flag, else
// $XDG_STATE_HOME/corral, else ~/.local/state/corral.
func stateDir(flag string) (string, error) {
	if flag != "" {
		return filepath.Abs(flag)
	}
	if x := os.Getenv("XDG_STATE_HOME"); x != "" && filepath.IsAbs(x) {
		return filepath.Join(x, "corral"), nil
	}
	home, err := os.UserHomeDir()
	if err != nil {
		return "", fmt.Errorf("no state directory: set --state or $XDG_STATE_HOME: %w", err)
	}
	return filepath.Join(home, ".local", "state", "corral"), nil
}

// openRunEnv composes a core on the embedded defaults and registers the
// project named by the flags.
func openRunEnv(ctx context.Context, f *runFlags) (*runEnv, error) {
	state, err := stateDir(f.state)
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(state, 0o700); err != nil {
		return nil, fmt.Errorf("state directory: %w", err)
	}
	if err := checkStateDir(state); err != nil {
		return nil, err
	}
	env := &runEnv{state: state}
	ok := false
	defer func() {
		if !ok {
			env.close()
		}
	}()
	var transport = envTransport(f)
	if f.project != "" {
		t, stop, err := startManagedTransport(ctx, f, state)
		if err != nil {
			return nil, err
		}
		env.closers = append(env.closers, stop)
		transport = t
	}
	c, err := core.Build(ctx, core.Options{
		StorePath:           store.DefaultURL(state),
		StateDir:            state,
		Migrate:             true,
		PrivilegedTransport: transport,
		Logger:              cliLogger(),
		Egress:              core.EgressOptions{AllowCIDRs: f.egressAllowCIDR},
	})
	if err != nil {
		return nil, err
	}
	env.closers = append(env.closers, func() { c.Close() })
	env.core = c
	ctl, err := c.Sandbox()
	if err != nil {
		return nil, err
	}
	env.control = ctl

	st := c.Store()
	acct, err := ensureAccount(ctx, st, localAccount)
	if err != nil {
		return nil, err
	}
	env.actor = sandbox.Actor{AccountUserID: acct.ID}

	kind, dir := store.ProjectHost, f.host
	if f.project != "" {
		kind, dir = store.ProjectManaged, f.project
	}
	proj, err := ensureProject(ctx, st, kind, dir)
	if err != nil {
		return nil, err
	}
	env.image = proj.Image
	if f.image != "" && f.image != proj.Image {
		if err := changeImage(ctx, state, c, proj, f.image); err != nil {
			return nil, err
		}
		env.image = f.image
	}
	if _, err := st.GetMember(ctx, proj.ID, acct.ID); errors.Is(err, store.ErrNotFound) {
		if _, err := st.AddMember(ctx, store.Member{Project: proj.ID, Account: acct.ID, Role: store.RoleOwner}); err != nil && !errors.Is(err, store.ErrExists) {
			return nil, err
		}
	} else if err != nil {
		return nil, err
	}
	if len(f.egressAllow) > 0 {
		restore, err := oneOffEgress(ctx, st, proj.ID, f.egressAllow)
		if err != nil {
			return nil, err
		}
		env.closers = append(env.closers, restore)
	}
	env.project = sandbox.ProjectRef{Kind: sandbox.ProjectKind(kind), ProjectID: proj.ID}
	env.cwd = f.cwd
	if env.cwd == "" && kind == store.ProjectHost {
		env.cwd = proj.Root
	}
	ok = true
	return env, nil
}

func ensureAccount(ctx context.Context, st store.Store, name string) (store.Account, error) {
	a, err := st.AccountByName(ctx, name)
	if errors.Is(err, store.ErrNotFound) {
		a, err = st.CreateAccount(ctx, name)
		if errors.Is(err, store.ErrExists) {
			return st.AccountByName(ctx, name)
		}
	}
	return a, err
}

// ensureProject finds the project of that kind rooted at dir, or creates it.
func ensureProject(ctx context.Context, st store.Store, kind store.ProjectKind, dir string) (store.Project, error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return store.Project{}, err
	}
	root, err := filepath.EvalSymlinks(abs)
	if err != nil {
		return store.Project{}, fmt.Errorf("project directory: %w", err)
	}
	fi, err := os.Stat(root)
	if err != nil || !fi.IsDir() {
		return store.Project{}, fmt.Errorf("project directory %s is not a directory", dir)
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok && st.Uid == 0 && kind == store.ProjectManaged && os.Geteuid() == 0 {
		// The shared worker makes a root-owned workspace writable to the
		// machine: it must be root's by a path only root controls, not
		// a symlink of another user pointing at root's files.
		if err := safepath.Check(abs, 0); err != nil {
			return store.Project{}, fmt.Errorf("project directory %s is root's, reached through what another user controls: %w", dir, err)
		}
	}
	projects, err := st.ListProjects(ctx)
	if err != nil {
		return store.Project{}, err
	}
	for _, p := range projects {
		if p.Kind == kind && p.Root == root {
			return p, nil
		}
	}
	p, err := st.CreateProject(ctx, store.NewProject{Kind: kind, Name: string(kind) + ":" + root, Root: root})
	if errors.Is(err, store.ErrExists) {
		return st.ProjectByName(ctx, string(kind)+":"+root)
	}
	return p, err
}

// changeImage records name as proj's image, after checking that the image
// store holds it (a name that is not there is refused, and nothing is
// recorded) and stopping the project's machine, which the shared worker
// may keep running on the previous image (refused while other commands
// use it). The machine's next start discards the upper layer made over
// the previous image.
func changeImage(ctx context.Context, state string, c *core.Core, proj store.Project, name string) error {
	if err := checkImage(ctx, state, name); err != nil {
		return err
	}
	if gw := c.Gateway(); gw != nil && gw.HasTransport() {
		err := projects.ResetMachine(ctx, c.Store(), gw, proj)
		switch {
		case errors.Is(err, store.ErrProjectBusy):
			return fmt.Errorf("--image %s: project %s is in use by other commands; its image can change once they ended", name, proj.Name)
		case err != nil && !errors.Is(err, machine.ErrUnsupported):
			return fmt.Errorf("--image %s: stopping the machine: %w", name, err)
		}
	}
	// Recorded: later runs without --image keep it.
	return c.Store().SetProjectMachine(ctx, proj.ID, name, proj.Limits)
}

// checkImage refuses an image name the state directory's image store does
// not hold ("base" is always there: it is made on first use).
func checkImage(ctx context.Context, state, name string) error {
	if name == image.BaseName || name == "" {
		return nil
	}
	imgs, err := image.Open(filepath.Join(state, "images"), image.Options{Logger: cliLogger()})
	if err != nil {
		return err
	}
	if _, err := imgs.Get(ctx, name); errors.Is(err, image.ErrNotFound) {
		return fmt.Errorf("--image %s: no such image (see corral image list; base is the default)", name)
	} else if err != nil {
		return fmt.Errorf("--image %s: %w", name, err)
	}
	return nil
}
