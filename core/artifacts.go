package core

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"path"
	"strconv"
	"strings"
	"time"

	"github.com/corral-sandbox/corral/plugin"
	"github.com/corral-sandbox/corral/sandbox"
)

// ArtifactReader is the core-only sandboxArtifacts control: it reads files
// out of a project's sandbox and deletes artifacts core owns there. Plugins
// can never resolve it.
type ArtifactReader interface {
	ReadFile(ctx context.Context, req ArtifactRequest, max int64) ([]byte, error)
	Delete(ctx context.Context, req ArtifactRequest) error
}

// ArtifactRequest names one file inside a project's sandbox.
type ArtifactRequest struct {
	Actor   sandbox.Actor
	Project sandbox.ProjectRef
	// Path is an absolute, clean guest path under /workspace, /tmp or
	// /home/corral. Symbolic links are never followed.
	Path string
	// LeaseKind covers the reads (for example sandbox.LeaseGitHub).
	LeaseKind sandbox.LeaseKind
}

// Errors of the artifacts control.
var (
	ErrArtifactPath     = errors.New("core: artifact path not allowed")
	ErrArtifactTooLarge = errors.New("core: artifact too large")
	ErrArtifactNotFile  = errors.New("core: artifact is not a regular file")
)

// artifactChunk is how many bytes one read command returns.
const artifactChunk = 4 << 20

// Artifacts implements ArtifactReader through the sandbox control: every
// read is a bounded RunCommand inside the machine, so it is leased,
// heartbeated, journaled and cancelled like any other command.
type Artifacts struct {
	resolve func() (*sandbox.Control, error)
}

var _ ArtifactReader = (*Artifacts)(nil)

var artifactRoots = []string{sandbox.GuestWorkspace + "/", "/tmp/", sandbox.GuestHome + "/"}

func checkArtifactPath(p string) error {
	if p == "" || strings.IndexByte(p, 0) >= 0 || !path.IsAbs(p) || path.Clean(p) != p {
		return fmt.Errorf("%w: %q is not an absolute, clean guest path", ErrArtifactPath, p)
	}
	for _, r := range artifactRoots {
		if strings.HasPrefix(p, r) {
			return nil
		}
	}
	return fmt.Errorf("%w: %q is outside %v", ErrArtifactPath, p, artifactRoots)
}

func (a *Artifacts) run(ctx context.Context, req ArtifactRequest, limit int64, argv ...string) (string, error) {
	ctl, err := a.resolve()
	if err != nil {
		return "", err
	}
	in := sandbox.ExecInput{
		Command:   sandbox.Command{Type: sandbox.CommandTypeArgv, File: argv[0], Args: argv[1:]},
		LeaseKind: req.LeaseKind,
		Project:   req.Project,
	}
	actor := req.Actor
	res, err := ctl.RunCommand(ctx, in, &actor, &sandbox.RunOptions{
		Timeout:     60 * time.Second,
		OutputLimit: sandbox.OutputLimit{Stdout: limit, Stderr: 64 << 10},
	})
	if err != nil {
		return "", err
	}
	if res.Code == nil || *res.Code != 0 {
		return "", fmt.Errorf("core: %s in the sandbox failed (code %v, signal %q): %s", argv[0], res.Code, res.Signal, strings.TrimSpace(res.Stderr))
	}
	return res.Stdout, nil
}

// ReadFile reads the regular file at req.Path, at most max bytes, in
// chunks. A symbolic link (at the last component) is refused, a file
// larger than max fails with ErrArtifactTooLarge before it is read.
func (a *Artifacts) ReadFile(ctx context.Context, req ArtifactRequest, max int64) ([]byte, error) {
	if err := checkArtifactPath(req.Path); err != nil {
		return nil, err
	}
	out, err := a.run(ctx, req, 4096, "stat", "-c", "%s:%F", "--", req.Path)
	if err != nil {
		return nil, err
	}
	sizeStr, kind, _ := strings.Cut(strings.TrimSpace(out), ":")
	if kind != "regular file" && kind != "regular empty file" {
		return nil, fmt.Errorf("%w: %s is a %s", ErrArtifactNotFile, req.Path, kind)
	}
	size, err := strconv.ParseInt(sizeStr, 10, 64)
	if err != nil {
		return nil, fmt.Errorf("core: stat %s: %q", req.Path, out)
	}
	if size > max {
		return nil, fmt.Errorf("%w: %s has %d bytes, more than %d", ErrArtifactTooLarge, req.Path, size, max)
	}
	data := make([]byte, 0, size)
	for off := int64(0); off < size; off += artifactChunk {
		n := min(int64(artifactChunk), size-off)
		// iflag=nofollow refuses a symlink swapped in after the stat.
		enc, err := a.run(ctx, req, int64(base64.StdEncoding.EncodedLen(int(n)))+16,
			"sh", "-c", `dd if="$1" iflag=nofollow,skip_bytes,count_bytes bs=65536 skip="$2" count="$3" status=none | base64 -w0`,
			"sh", req.Path, strconv.FormatInt(off, 10), strconv.FormatInt(n, 10))
		if err != nil {
			return nil, err
		}
		chunk, err := base64.StdEncoding.DecodeString(strings.TrimSpace(enc))
		if err != nil {
			return nil, fmt.Errorf("core: read %s: %w", req.Path, err)
		}
		if int64(len(chunk)) != n {
			return nil, fmt.Errorf("core: read %s: file changed while reading (%d of %d bytes at %d)", req.Path, len(chunk), n, off)
		}
		data = append(data, chunk...)
	}
	return data, nil
}

// Delete removes the file at req.Path (not following symbolic links).
// Deleting a file that does not exist succeeds.
func (a *Artifacts) Delete(ctx context.Context, req ArtifactRequest) error {
	if err := checkArtifactPath(req.Path); err != nil {
		return err
	}
	_, err := a.run(ctx, req, 4096, "rm", "-f", "--", req.Path)
	return err
}

// Artifacts resolves the core-only sandboxArtifacts control.
func (c *Core) Artifacts() (ArtifactReader, error) {
	return plugin.ResolveCoreAs[ArtifactReader](c.registry, plugin.DomainSandboxArtifacts)
}
