package provider

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	"github.com/corral-sandbox/corral/confine"
	"github.com/corral-sandbox/corral/sandbox"
	"github.com/corral-sandbox/corral/store"
	"golang.org/x/sys/unix"
)

// ErrOutsideRoots is wrapped when a host command's working directory does
// not lie inside the project root or one of the actor's roots.
var ErrOutsideRoots = errors.New("provider: working directory outside the project and actor roots")

// prepareHost prepares a host project's execution (tenancy already checked).
//
// The roots are resolved through symlinks: the project root, and each of the
// actor's roots, which must be absolute, existing directories. The working
// directory (empty: the project root; relative: relative to it) is resolved
// through symlinks too and must then lie inside one of those roots, so
// neither ".." nor a symlink leads out of them.
//
// The command is confined (package confine) unless the actor is a trusted
// member, in which case it is launched directly, unconfined, as corral's
// own user (root, for a root daemon: trust a member with that only). The
// launch of a confined command is the confinement helper, confine.Command,
// and carries the same confinement as a sandbox.Confinement, which
// RunCommand applies without the helper's process. Confinement is never
// skipped silently: if the kernel cannot confine, preparation is refused.
// A confined command:
//
//   - may read and execute beneath the system directories
//     (confine.SystemDirs), the project root and the actor's roots only,
//     and write beneath the roots only;
//   - has the host's network only if the project allows it
//     (store.Project.Network); otherwise no TCP (Landlock), and, as root,
//     no network at all;
//   - cannot signal processes outside its Landlock domain nor connect to
//     abstract Unix sockets made outside it (Landlock ABI 6);
//   - when corral is root (with the capabilities it takes: canSwitchUsers),
//     runs as the project's own user (uid and gid
//     HostIDs' block start + project id, no supplementary groups), with no
//     capability and no_new_privs, in a pid namespace of its own that dies
//     with its main process. At the project's first confined preparation
//     (per process), every root is made writable for that user with POSIX
//     ACLs (a named-user entry in the access and default ACLs of the root
//     and of what lies beneath it: see posixacl.GrantUser), rather than by chown,
//     because host roots are existing directories whose owners must keep
//     them; and each directory above a root that the user cannot search
//     (a 0700 home) gets an ACL entry that lets that user, and nobody
//     else, search it (x only: see posixacl.GrantSearch; Landlock still decides
//     what it may read). A project whose id does not fit the block is
//     refused.
//   - when corral is not root, keeps corral's user: Landlock and
//     no_new_privs only, no pid namespace (a descendant that leaves the
//     process group survives the command), and whatever that user can
//     read beneath the system directories.
//
// The environment is minimal and never the daemon's: PATH, HOME (the
// project root), LANG, TERM, then Options.Env, then the request's Env (which
// wins). A confined command refuses requested names beginning with LD_: a
// Launch run through the confinement helper's own process would hand them
// to the dynamic loader of the helper before it confines itself.
//
// Paths are checked at preparation and used at start. The kernel enforces
// confinement at each access, on the roots as they resolved when the
// command started; so whoever can replace a root (or its parent) with a
// symlink between two preparations redirects what later commands may
// write. Roots must therefore not lie beneath a directory an untrusted
// command can write.
func (p *Provider) prepareHost(ctx context.Context, in sandbox.ExecInput, actor sandbox.Actor, proj store.Project, member store.Member) (sandbox.Prepared, error) {
	if !filepath.IsAbs(proj.Root) {
		return nil, fmt.Errorf("provider: project %d root %q is not absolute", proj.ID, proj.Root)
	}
	root, err := realDir(proj.Root)
	if err != nil {
		return nil, fmt.Errorf("provider: project %d root: %w", proj.ID, err)
	}
	if root == "/" {
		return nil, fmt.Errorf("provider: project %d: the root directory / cannot be a project root", proj.ID)
	}
	roots := []string{root}
	for _, r := range actor.Roots {
		if !filepath.IsAbs(r) {
			return nil, fmt.Errorf("provider: actor root %q is not absolute", r)
		}
		rr, err := realDir(r)
		if err != nil {
			return nil, fmt.Errorf("provider: actor root: %w", err)
		}
		if !containsPath(roots, rr) {
			roots = append(roots, rr)
		}
	}
	cwd, err := resolveCwd(in.Cwd, root, roots)
	if err != nil {
		return nil, err
	}

	mode := sandbox.LocalConfined
	if member.Trusted {
		mode = sandbox.LocalDirect
	}
	if mode == sandbox.LocalConfined {
		for k := range in.Env {
			if strings.HasPrefix(k, "LD_") {
				return nil, fmt.Errorf("provider: environment variable %s is refused for a confined host command (the dynamic loader's)", k)
			}
		}
	}
	env := buildEnv(root, append(append([]string(nil), p.env...), envList(in.Env)...))
	var launch sandbox.Launch
	switch mode {
	case sandbox.LocalConfined:
		if _, err := p.available(); err != nil {
			return nil, fmt.Errorf("landlock unavailable: refusing to run unconfined: %w", err)
		}
		policy := confine.Policy{Writable: roots, Network: proj.Network}
		if p.users != nil {
			u, err := p.users.user(proj.ID)
			if err != nil {
				return nil, err
			}
			for _, r := range roots {
				if err := p.users.prepareRoot(r, u); err != nil {
					return nil, err
				}
			}
			policy.User, policy.Init = u, p.self
		}
		argv := in.Command.Argv()
		path, args := confine.Command(p.self, policy, argv)
		launch = sandbox.Launch{Path: path, Args: args, Env: env, Dir: cwd, ExecStatus: true,
			Confine: &sandbox.Confinement{
				Path:     lookPath(in.Command.File, cwd, envValue(env, "PATH")),
				Args:     argv,
				Writable: roots,
				Network:  policy.Network,
				User:     policy.User,
				Init:     policy.Init,
			}}
	case sandbox.LocalDirect:
		path := lookPath(in.Command.File, cwd, envValue(env, "PATH"))
		launch = sandbox.Launch{Path: path, Args: in.Command.Argv(), Env: env, Dir: cwd}
	}

	// Every check passed: mint the lease last.
	l, err := p.mintLease(ctx, in, actor)
	if err != nil {
		return nil, err
	}
	hostRoots := []string{root}
	if clean := filepath.Clean(proj.Root); clean != root {
		hostRoots = append(hostRoots, clean)
	}
	p.log.DebugContext(ctx, "prepared host execution", "project", proj.ID, "account", actor.AccountUserID,
		"lease", l.ID(), "mode", mode, "cwd", cwd)
	return &sandbox.LocalPrepared{
		PreparedCommon: sandbox.PreparedCommon{
			Project:      in.Project,
			Cwd:          cwd,
			DisplayCwd:   displayPath(cwd, root),
			Lease:        l,
			Sanitize:     sanitizer(hostRoots),
			SanitizeHold: sanitizeHold(hostRoots),
		},
		Mode:   mode,
		Launch: launch,
		// Cancel is nil: core kills the process group (and the pid
		// namespace), and nothing else is held for a host execution.
	}, nil
}

// realDir resolves dir through symlinks and checks that it is an existing
// directory.
func realDir(dir string) (string, error) {
	// The kernel resolves the path once (three system calls, where
	// filepath.EvalSymlinks makes one per component); /proc names what it
	// opened. Without /proc, the path is resolved component by component.
	fd, err := unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err == unix.ENOTDIR {
		return "", fmt.Errorf("%s is not a directory", dir)
	}
	if err != nil {
		return "", &os.PathError{Op: "open", Path: dir, Err: err}
	}
	real, err := os.Readlink("/proc/self/fd/" + strconv.Itoa(fd))
	unix.Close(fd)
	if err == nil && filepath.IsAbs(real) {
		return real, nil
	}
	return evalDir(dir)
}

// evalDir is realDir without /proc.
func evalDir(dir string) (string, error) {
	real, err := filepath.EvalSymlinks(dir)
	if err != nil {
		return "", err
	}
	real, err = filepath.Abs(real)
	if err != nil {
		return "", err
	}
	fi, err := os.Stat(real)
	if err != nil {
		return "", err
	}
	if !fi.IsDir() {
		return "", fmt.Errorf("%s is not a directory", dir)
	}
	return real, nil
}

// resolveCwd resolves the requested working directory against the project
// root and checks it lies inside one of roots (all symlink-free).
func resolveCwd(req, root string, roots []string) (string, error) {
	switch {
	case req == "":
		return root, nil
	case !filepath.IsAbs(req):
		req = filepath.Join(root, req)
	}
	cwd, err := realDir(req)
	if err != nil {
		return "", fmt.Errorf("provider: working directory %q: %w", req, err)
	}
	for _, r := range roots {
		if within(cwd, r) {
			return cwd, nil
		}
	}
	return "", fmt.Errorf("%w: %q resolves to %s", ErrOutsideRoots, req, cwd)
}

// within reports whether path is base or beneath it; both are clean and
// absolute.
func within(path, base string) bool {
	if base == "/" {
		return true
	}
	return path == base || strings.HasPrefix(path, base+"/")
}

func containsPath(paths []string, p string) bool {
	for _, q := range paths {
		if q == p {
			return true
		}
	}
	return false
}

// displayPath expresses path with the project root shown as DisplayRoot;
// paths outside the root (the actor's roots) are shown as they are.
func displayPath(path, root string) string {
	if within(path, root) {
		return DisplayRoot + path[len(root):]
	}
	return path
}

// buildEnv returns the minimal environment, then extra; a later entry
// replaces an earlier one of the same name.
func buildEnv(home string, extra []string) []string {
	env := []string{"PATH=" + DefaultPath, "HOME=" + home, "LANG=C.UTF-8", "TERM=dumb"}
	for _, kv := range extra {
		name, _, _ := strings.Cut(kv, "=")
		replaced := false
		for i, e := range env {
			if strings.HasPrefix(e, name+"=") {
				env[i], replaced = kv, true
				break
			}
		}
		if !replaced {
			env = append(env, kv)
		}
	}
	return env
}

func envValue(env []string, name string) string {
	for _, e := range env {
		if v, ok := strings.CutPrefix(e, name+"="); ok {
			return v
		}
	}
	return ""
}

// lookPath resolves a direct command's program as the confinement helper
// would: a name with a slash is taken as is (relative to cwd), a bare name is
// searched in path only, never in cwd. If nothing executable is found, it
// returns a path that does not exist, so that starting it fails with a start
// error (never a prepare error, never an exit code).
func lookPath(file, cwd, path string) string {
	if strings.Contains(file, "/") {
		if !filepath.IsAbs(file) {
			file = filepath.Join(cwd, file)
		}
		return file
	}
	var first string
	for _, dir := range filepath.SplitList(path) {
		if dir == "" || !filepath.IsAbs(dir) {
			continue // never the working directory
		}
		cand := filepath.Join(dir, file)
		if first == "" {
			first = cand
		}
		if fi, err := os.Stat(cand); err == nil && fi.Mode().IsRegular() &&
			unix.Faccessat(unix.AT_FDCWD, cand, unix.X_OK, unix.AT_EACCESS) == nil {
			return cand
		}
	}
	if first == "" {
		return filepath.Join("/nonexistent", file)
	}
	return first
}

// sanitizer returns a function that shows each host root as DisplayRoot,
// longest root first (so a root that contains another is replaced whole),
// and only where the root ends a path component: a sibling such as
// "/srv/project2" of root "/srv/project" is left alone.
func sanitizer(hostRoots []string) func(string) string {
	roots := append([]string(nil), hostRoots...)
	sort.Slice(roots, func(i, j int) bool { return len(roots[i]) > len(roots[j]) })
	return func(s string) string {
		for _, r := range roots {
			s = replacePath(s, r, DisplayRoot)
		}
		return s
	}
}

// sanitizeHold returns the SanitizeHold of sanitizer(hostRoots): the
// longest suffix of s that is a prefix of a root, the whole root included
// (whether it is replaced depends on the byte after it).
func sanitizeHold(hostRoots []string) func(string) int {
	roots := append([]string(nil), hostRoots...)
	return func(s string) int {
		hold := 0
		for _, r := range roots {
			for k := min(len(r), len(s)); k > hold; k-- {
				if strings.HasSuffix(s, r[:k]) {
					hold = k
					break
				}
			}
		}
		return hold
	}
}

// envList returns env as NAME=VALUE entries, sorted by name.
func envList(env map[string]string) []string {
	out := make([]string, 0, len(env))
	for k, v := range env {
		out = append(out, k+"="+v)
	}
	sort.Strings(out)
	return out
}

// replacePath replaces every occurrence of root in s that is followed by a
// path separator or a character that cannot continue a file name.
func replacePath(s, root, repl string) string {
	if !strings.Contains(s, root) {
		return s
	}
	var b strings.Builder
	for {
		i := strings.Index(s, root)
		if i < 0 {
			b.WriteString(s)
			return b.String()
		}
		end := i + len(root)
		b.WriteString(s[:i])
		if end == len(s) || !nameByte(s[end]) {
			b.WriteString(repl)
		} else {
			b.WriteString(root)
		}
		s = s[end:]
	}
}

// nameByte reports whether c commonly continues a file name.
func nameByte(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' ||
		c == '.' || c == '_' || c == '-' || c == '+' || c == '~' || c >= 0x80
}
