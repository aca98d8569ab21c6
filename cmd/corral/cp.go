package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"

	"github.com/corral-sandbox/corral/client"
	"github.com/corral-sandbox/corral/internal/errdefs"
	"github.com/corral-sandbox/corral/sandbox"
)

type cpFlags struct {
	project, state, workerSocket string
	daemon, token                string
	projectID                    int64
	user                         string
}

func newCpCmd() *cobra.Command {
	var f cpFlags
	cmd := &cobra.Command{
		Use:   "cp [-u USER] (--project DIR | --daemon ADDR --project-id N) SRC DST",
		Short: "Copy files and directories between the host and a project",
		Long: `Copy a file or a directory tree between the host and a project, like
docker cp. Exactly one of SRC and DST names the project's side, written with a
leading colon: ":/workspace/x", ":/home/corral/y", or ":x" (relative to the
workspace). The other is a host path; "-" is standard input or output (one
file).

A project path is resolved inside the project (a managed project's machine,
as -u USER or its default user; a host project's workspace, as its own user):
no symlink leads out of it. Copying onto an existing directory copies into it,
as cp -r does; files keep their permission bits; each file is replaced
atomically. Symlinks are not copied (they are reported and skipped).

Through a daemon (--daemon ADDR --project-id N) any project of the account
(--token, default $CORRAL_TOKEN); with --project DIR a managed project run by
the state directory's shared worker, as corral run does (root).`,
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			if status := cpMain(cmd, &f, args[0], args[1]); status != 0 {
				return exitError{status}
			}
			return nil
		},
	}
	fl := cmd.Flags()
	fl.StringVarP(&f.user, "user", "u", "", "act as `NAME|UID` of the machine")
	fl.StringVar(&f.project, "project", "", "the managed project whose workspace is `DIR` (root)")
	fl.StringVar(&f.state, "state", "", "state `DIR` (default $XDG_STATE_HOME/corral)")
	fl.StringVar(&f.workerSocket, "worker-socket", "", "use the running worker at `PATH` instead of starting one (--project)")
	fl.StringVar(&f.daemon, "daemon", "", "through the corral daemon at `ADDR` (a Unix socket path or host:port)")
	fl.StringVar(&f.token, "token", "", "bearer token for --daemon (default $CORRAL_TOKEN)")
	fl.Int64Var(&f.projectID, "project-id", 0, "the daemon's project `ID` (with --daemon)")
	return cmd
}

// remoteFiles is a project's files, whichever way they are reached.
type remoteFiles interface {
	read(ctx context.Context, p string) (io.ReadCloser, error)
	write(ctx context.Context, p string, mode uint32, r io.Reader) error
	stat(ctx context.Context, p string) (client.FileInfo, error)
	list(ctx context.Context, p string) ([]client.FileInfo, error)
	mkdir(ctx context.Context, p string, mode uint32) error
}

// errNotFound marks a missing remote file.
var errNotFound = errors.New("no such file")

func cpMain(cmd *cobra.Command, f *cpFlags, src, dst string) (status int) {
	var copyErr error // the copy's outcome
	stderr := cmd.ErrOrStderr()
	fail := func(err error) int {
		fmt.Fprintf(stderr, "corral: cp: %v\n", err)
		return 1
	}
	srcRemote, dstRemote := strings.HasPrefix(src, ":"), strings.HasPrefix(dst, ":")
	if srcRemote == dstRemote {
		return fail(errors.New("exactly one of SRC and DST must be a project path (\":/path\")"))
	}
	ctx := cmd.Context()
	var rf remoteFiles
	switch {
	case f.daemon != "":
		if f.project != "" || f.projectID <= 0 {
			return fail(errors.New("--daemon takes --project-id ID, not --project"))
		}
		c, err := daemonClient(f.daemon, f.token)
		if err != nil {
			return fail(err)
		}
		rf = &daemonFiles{c: c, id: f.projectID, user: f.user}
	case f.project != "":
		env, err := openRunEnv(ctx, &runFlags{project: f.project, state: f.state, workerSocket: f.workerSocket})
		if err != nil {
			return fail(err)
		}
		defer env.close()
		// One lease covers the whole copy, heartbeated while it runs and
		// released at the end (a failed release fails the copy).
		files, err := env.control.OpenFiles(ctx, sandbox.FilesInput{Project: env.project, User: f.user,
			Journal: []string{"files", "cp", src, dst}}, &env.actor)
		if err != nil {
			return fail(err)
		}
		defer func() {
			// The copy's outcome is journaled.
			if err := files.Close(copyErr); err != nil {
				status = fail(err)
			}
		}()
		rf = &leasedFiles{f: files}
	default:
		return fail(errors.New("give --project DIR or --daemon ADDR --project-id N"))
	}
	if srcRemote {
		copyErr = cpFromProject(ctx, rf, remotePath(src), dst, cmd.OutOrStdout(), stderr)
	} else {
		copyErr = cpToProject(ctx, rf, src, remotePath(dst), cmd.InOrStdin(), stderr)
	}
	if copyErr != nil {
		return fail(copyErr)
	}
	return 0
}

// remotePath turns ":x" into a guest path (relative ones are the
// workspace's).
func remotePath(s string) string {
	p := strings.TrimPrefix(s, ":")
	if p == "" {
		return sandbox.GuestWorkspace
	}
	if !path.IsAbs(p) {
		p = path.Join(sandbox.GuestWorkspace, p)
	}
	return path.Clean(p)
}

// cpFromProject copies remote src to host dst.
func cpFromProject(ctx context.Context, rf remoteFiles, src, dst string, stdout, stderr io.Writer) error {
	fi, err := rf.stat(ctx, src)
	if err != nil {
		return err
	}
	if dst == "-" {
		if fi.IsDir() {
			return fmt.Errorf("%s is a directory: it cannot go to standard output", src)
		}
		return readTo(ctx, rf, src, stdout)
	}
	if st, err := os.Stat(dst); err == nil && st.IsDir() {
		dst = filepath.Join(dst, path.Base(src))
	}
	return pullTree(ctx, rf, fi, dst, stderr)
}

func readTo(ctx context.Context, rf remoteFiles, src string, w io.Writer) error {
	r, err := rf.read(ctx, src)
	if err != nil {
		return err
	}
	defer r.Close()
	_, err = io.Copy(w, r)
	return err
}

func pullTree(ctx context.Context, rf remoteFiles, fi client.FileInfo, dst string, stderr io.Writer) error {
	switch fi.Type {
	case "file":
		tmp, err := os.CreateTemp(filepath.Dir(dst), ".corral-cp-*")
		if err != nil {
			return err
		}
		err = readTo(ctx, rf, fi.Path, tmp)
		if err == nil {
			err = tmp.Chmod(fs.FileMode(fi.Perm() & 0o777))
		}
		if cerr := tmp.Close(); err == nil {
			err = cerr
		}
		if err == nil {
			err = os.Rename(tmp.Name(), dst)
		}
		if err != nil {
			os.Remove(tmp.Name())
		}
		return err
	case "dir":
		if err := os.Mkdir(dst, fs.FileMode(fi.Perm()&0o777|0o700)); err != nil && !errors.Is(err, fs.ErrExist) {
			return err
		}
		entries, err := rf.list(ctx, fi.Path)
		if err != nil {
			return err
		}
		for _, e := range entries {
			// The names come from the project: each must be one path
			// element, or it would lead the copy out of dst on the host
			// ("../x", "/x") or into itself forever (".").
			if !validEntryName(e.Name) {
				return fmt.Errorf("%s: the project listed an entry named %q: not copied", fi.Path, e.Name)
			}
			if err := pullTree(ctx, rf, e, filepath.Join(dst, e.Name), stderr); err != nil {
				return err
			}
		}
		return nil
	default:
		fmt.Fprintf(stderr, "corral: cp: skipping %s (%s)\n", fi.Path, fi.Type)
		return nil
	}
}

// validEntryName reports whether name is a single path element, neither
// "." nor "..".
func validEntryName(name string) bool {
	return name != "" && name != "." && name != ".." && !strings.ContainsAny(name, "/\x00")
}

// cpToProject copies host src to remote dst.
func cpToProject(ctx context.Context, rf remoteFiles, src, dst string, stdin io.Reader, stderr io.Writer) error {
	if src == "-" {
		if fi, err := rf.stat(ctx, dst); err == nil && fi.IsDir() {
			return fmt.Errorf("%s is a directory: name the file to write", dst)
		}
		return rf.write(ctx, dst, 0, stdin)
	}
	st, err := os.Lstat(src)
	if err != nil {
		return err
	}
	if fi, err := rf.stat(ctx, dst); err == nil && fi.IsDir() {
		dst = path.Join(dst, filepath.Base(src))
	} else if err != nil && !errors.Is(err, errNotFound) {
		return err
	}
	return pushTree(ctx, rf, src, st, dst, stderr)
}

func pushTree(ctx context.Context, rf remoteFiles, src string, st fs.FileInfo, dst string, stderr io.Writer) error {
	switch {
	case st.Mode().IsRegular():
		f, err := os.Open(src)
		if err != nil {
			return err
		}
		defer f.Close()
		return rf.write(ctx, dst, uint32(st.Mode().Perm()), f)
	case st.IsDir():
		if err := rf.mkdir(ctx, dst, uint32(st.Mode().Perm())); err != nil {
			return err
		}
		entries, err := os.ReadDir(src)
		if err != nil {
			return err
		}
		for _, e := range entries {
			info, err := e.Info()
			if err != nil {
				return err
			}
			if err := pushTree(ctx, rf, filepath.Join(src, e.Name()), info, path.Join(dst, e.Name()), stderr); err != nil {
				return err
			}
		}
		return nil
	default:
		fmt.Fprintf(stderr, "corral: cp: skipping %s (not a regular file or directory)\n", src)
		return nil
	}
}

// daemonFiles reaches a project through a daemon.
type daemonFiles struct {
	c    *client.Client
	id   int64
	user string
}

func daemonErr(err error) error {
	var ce *client.Error
	if errors.As(err, &ce) && ce.Status == 404 {
		return fmt.Errorf("%w: %s", errNotFound, ce.Message)
	}
	return err
}

func (d *daemonFiles) read(ctx context.Context, p string) (io.ReadCloser, error) {
	r, _, err := d.c.ReadFile(ctx, d.id, p, d.user)
	return r, daemonErr(err)
}

func (d *daemonFiles) write(ctx context.Context, p string, mode uint32, r io.Reader) error {
	_, err := d.c.WriteFile(ctx, d.id, p, d.user, mode, r)
	return daemonErr(err)
}

func (d *daemonFiles) stat(ctx context.Context, p string) (client.FileInfo, error) {
	fi, err := d.c.StatFile(ctx, d.id, p, d.user)
	return fi, daemonErr(err)
}

func (d *daemonFiles) list(ctx context.Context, p string) ([]client.FileInfo, error) {
	l, err := d.c.ListFiles(ctx, d.id, p, d.user, 1, 0)
	if err != nil {
		return nil, daemonErr(err)
	}
	if l.Truncated {
		return nil, fmt.Errorf("%s has more entries than one listing holds", p)
	}
	return l.Entries, nil
}

func (d *daemonFiles) mkdir(ctx context.Context, p string, mode uint32) error {
	_, err := d.c.Mkdir(ctx, d.id, p, d.user, mode, true)
	return daemonErr(err)
}

// leasedFiles is a project's files through the sandbox control, under the
// lease of one OpenFiles (corral cp --project).
type leasedFiles struct {
	f *sandbox.Files
}

// note returns err with a missing file marked errNotFound.
func (l *leasedFiles) note(err error) error {
	if err == nil {
		return nil
	}
	if errdefs.Is(err, errdefs.NotFound) {
		return fmt.Errorf("%w: %w", errNotFound, err)
	}
	return err
}

func (l *leasedFiles) read(_ context.Context, p string) (io.ReadCloser, error) {
	f, _, err := l.f.Open(p)
	if err != nil {
		return nil, l.note(err)
	}
	return f, nil
}

func (l *leasedFiles) write(_ context.Context, p string, mode uint32, r io.Reader) error {
	_, err := l.f.Write(p, mode, r)
	return l.note(err)
}

func toClientInfo(fi sandbox.FileInfo) client.FileInfo {
	return client.FileInfo{Name: fi.Name, Path: fi.Path, Type: fi.Type, Size: fi.Size,
		Mode: fmt.Sprintf("%04o", fi.Mode), MTime: fi.MTime, Target: fi.Target}
}

func (l *leasedFiles) stat(_ context.Context, p string) (client.FileInfo, error) {
	fi, err := l.f.Stat(p)
	return toClientInfo(fi), l.note(err)
}

func (l *leasedFiles) list(_ context.Context, p string) ([]client.FileInfo, error) {
	_, es, trunc, err := l.f.List(p, 1, 0)
	if err != nil {
		return nil, l.note(err)
	}
	if trunc {
		return nil, l.note(fmt.Errorf("%s has more entries than one listing holds", p))
	}
	out := make([]client.FileInfo, len(es))
	for i, e := range es {
		out[i] = toClientInfo(e)
	}
	return out, nil
}

func (l *leasedFiles) mkdir(_ context.Context, p string, mode uint32) error {
	_, err := l.f.Mkdir(p, mode, true)
	return l.note(err)
}
