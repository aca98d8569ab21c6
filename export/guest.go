package export

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/corral-sandbox/corral/core"
	"github.com/corral-sandbox/corral/sandbox"
)

// guestTimeout bounds the short commands in the machine (rev-parse).
const guestTimeout = 30 * time.Second

// cleanupTimeout bounds deleting a bundle after the request's context may
// have ended.
const cleanupTimeout = 30 * time.Second

// guest runs an export's commands inside the project's machine.
type guest struct {
	x       *Exporter
	actor   sandbox.Actor
	project sandbox.ProjectRef
}

// git runs git in the workspace with lease kind github.
func (g *guest) git(ctx context.Context, opts *sandbox.RunOptions, args ...string) (*sandbox.CommandResult, error) {
	ctl, err := g.x.core.Sandbox()
	if err != nil {
		return nil, err
	}
	argv := append([]string{"-c", "core.fsmonitor=false", "-C", guestWorkspace}, args...)
	in := sandbox.ExecInput{
		Command:   sandbox.Command{Type: sandbox.CommandTypeArgv, File: "git", Args: argv},
		LeaseKind: sandbox.LeaseGitHub,
		Project:   g.project,
	}
	actor := g.actor
	res, err := ctl.RunCommand(ctx, in, &actor, opts)
	if err != nil {
		return nil, fmt.Errorf("export: git %s: %w", args[0], err)
	}
	return res, nil
}

func guestError(cmd string, res *sandbox.CommandResult, sentinel error) *GitError {
	return &GitError{Where: "machine", Command: cmd, Code: res.Code, Signal: res.Signal, Stderr: redactText(res.Stderr, "", ""), err: sentinel}
}

// head returns the commit branch points at.
func (g *guest) head(ctx context.Context, branch string) (string, error) {
	res, err := g.git(ctx, &sandbox.RunOptions{Timeout: guestTimeout, OutputLimit: sandbox.OutputLimit{Stdout: 4096, Stderr: 64 << 10}},
		"rev-parse", "--verify", "--quiet", "refs/heads/"+branch+"^{commit}")
	if err != nil {
		return "", err
	}
	switch {
	case exited(res, 0):
		head := strings.TrimSpace(res.Stdout)
		if !hexHead().MatchString(head) {
			return "", fmt.Errorf("export: rev-parse answered %q", head)
		}
		return head, nil
	case exited(res, 1):
		return "", fmt.Errorf("%w: %s", ErrNoBranch, branch)
	case exited(res, 128):
		return "", guestError("rev-parse", res, ErrNotRepository)
	}
	return "", guestError("rev-parse", res, nil)
}

// bundle creates the bundle of branch in the machine, reads it out and
// deletes it there. The bundle's ownership is recorded by OnStart, after
// preparation was accepted; from then on the bundle is deleted on every
// path, or left recorded for the Sweeper if deleting fails.
func (g *guest) bundle(ctx context.Context, branch string, arts core.ArtifactReader) (data []byte, err error) {
	path := newBundlePath()
	var artifact int64 // recorded, not yet deleted
	onStart := func(info sandbox.StartInfo) error {
		a, err := g.x.core.Store().RecordArtifact(ctx, g.project.ProjectID, path, info.LeaseID)
		if err != nil {
			return fmt.Errorf("export: record the bundle's ownership: %w", err)
		}
		g.x.track(a.ID, true)
		artifact = a.ID
		return nil
	}
	defer func() {
		if artifact == 0 {
			return
		}
		if derr := g.deleteBundle(ctx, arts, artifact, path); derr != nil {
			g.x.log.Warn("export: bundle left for the sweeper", "project", g.project.ProjectID, "path", path, "err", derr)
		}
		g.x.track(artifact, false)
	}()

	res, err := g.git(ctx, &sandbox.RunOptions{
		Timeout:     g.x.opts.BundleTimeout,
		OutputLimit: sandbox.OutputLimit{Stdout: 64 << 10, Stderr: 256 << 10},
		OnStart:     onStart,
	}, "bundle", "create", "-q", path, "refs/heads/"+branch)
	if err != nil {
		return nil, err
	}
	if !exited(res, 0) {
		return nil, guestError("bundle", res, nil)
	}
	data, err = arts.ReadFile(ctx, core.ArtifactRequest{
		Actor: g.actor, Project: g.project, Path: path, LeaseKind: sandbox.LeaseGitHub,
	}, g.x.opts.MaxBundle)
	if errors.Is(err, core.ErrArtifactTooLarge) {
		return nil, fmt.Errorf("%w: %w", ErrTooLarge, err)
	}
	if err != nil {
		return nil, fmt.Errorf("export: read the bundle: %w", err)
	}
	return data, nil
}

// deleteBundle deletes an owned bundle in the machine and records that it
// is gone. It runs even when ctx has ended.
func (g *guest) deleteBundle(ctx context.Context, arts core.ArtifactReader, id int64, path string) error {
	dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
	defer cancel()
	return deleteArtifact(dctx, g.x.core, arts, g.actor, g.project, id, path)
}

// deleteArtifact deletes one owned artifact and marks it deleted.
func deleteArtifact(ctx context.Context, c *core.Core, arts core.ArtifactReader, actor sandbox.Actor, project sandbox.ProjectRef, id int64, path string) error {
	err := arts.Delete(ctx, core.ArtifactRequest{Actor: actor, Project: project, Path: path, LeaseKind: sandbox.LeaseGitHub})
	if err != nil {
		return fmt.Errorf("export: delete %s: %w", path, err)
	}
	if err := c.Store().MarkArtifactDeleted(ctx, id); err != nil {
		return fmt.Errorf("export: mark %s deleted: %w", path, err)
	}
	return nil
}

func exited(res *sandbox.CommandResult, code int) bool {
	return res.Code != nil && *res.Code == code
}
