package export

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
)

// Host git runs with these variables only (plus PATH and those of the
// call): no system or global configuration, no prompts, C messages.
func baseEnv(home string) []string {
	env := []string{
		"HOME=" + home,
		"GIT_CONFIG_NOSYSTEM=1",
		"GIT_CONFIG_GLOBAL=/dev/null",
		"GIT_TERMINAL_PROMPT=0",
		"GIT_ASKPASS=/bin/false",
		"SSH_ASKPASS=/bin/false",
		"LC_ALL=C",
	}
	if p, ok := os.LookupEnv("PATH"); ok {
		env = append(env, "PATH="+p)
	}
	return env
}

// The environment variables the credential helper reads. They are set for
// the host git of the push alone.
const (
	envUsername = "CORRAL_EXPORT_USERNAME"
	envToken    = "CORRAL_EXPORT_TOKEN"
)

// credentialHelper answers git's "get" with the username and token from
// the environment. Its text names the variables, never their values.
const credentialHelper = `!f() { test "$1" = get || exit 0; echo "username=${` + envUsername + `}"; echo "password=${` + envToken + `}"; }; f`

// credentialArgs configure the credential helper for exactly the remote's
// URL: git consults it only for a credential request whose protocol, host,
// port and path match (useHttpPath makes the path count), never for
// another server or repository.
func credentialArgs(remote *url.URL) []string {
	u := credentialURL(remote)
	return []string{
		"-c", "credential.useHttpPath=true",
		"-c", "credential." + u + ".helper=" + credentialHelper,
	}
}

// hostResult is a finished host git.
type hostResult struct {
	stdout, stderr string
	code           *int
	signal         string
}

func (r *hostResult) ok() bool { return r.code != nil && *r.code == 0 }

// hostGit runs the host's git in dir ("" for the current directory) with
// the base environment plus env, and returns its result; err is for git
// that could not be run or was cancelled.
func (x *Exporter) hostGit(ctx context.Context, dir string, env []string, args ...string) (*hostResult, error) {
	home := dir
	if home == "" {
		home = os.TempDir()
	}
	cmd := exec.CommandContext(ctx, x.opts.Git, args...)
	cmd.Dir = dir
	cmd.Env = append(baseEnv(home), env...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &limited{b: &stdout, n: 1 << 20}, &limited{b: &stderr, n: 1 << 20}
	err := cmd.Run()
	if ctx.Err() != nil {
		return nil, fmt.Errorf("export: host git %s: %w", args[0], ctx.Err())
	}
	var ee *exec.ExitError
	if err != nil && !errors.As(err, &ee) {
		return nil, fmt.Errorf("export: run the host's git: %w", err)
	}
	r := &hostResult{stdout: stdout.String(), stderr: stderr.String()}
	ws, _ := cmd.ProcessState.Sys().(syscall.WaitStatus)
	if ws.Signaled() {
		r.signal = ws.Signal().String()
	} else {
		c := cmd.ProcessState.ExitCode()
		r.code = &c
	}
	return r, nil
}

// limited keeps at most n bytes and discards the rest.
type limited struct {
	b *bytes.Buffer
	n int
}

func (l *limited) Write(p []byte) (int, error) {
	if room := l.n - l.b.Len(); room > 0 {
		l.b.Write(p[:min(len(p), room)])
	}
	return len(p), nil
}

// hostRepo is a temporary bare repository on the host.
type hostRepo struct {
	x    *Exporter
	dir  string // private temporary directory
	repo string // dir/repo.git
}

func (x *Exporter) newHostRepo() (*hostRepo, error) {
	dir, err := os.MkdirTemp(x.opts.TempDir, "corral-export-")
	if err != nil {
		return nil, fmt.Errorf("export: %w", err)
	}
	return &hostRepo{x: x, dir: dir, repo: filepath.Join(dir, "repo.git")}, nil
}

func (h *hostRepo) remove() {
	if err := os.RemoveAll(h.dir); err != nil {
		h.x.log.Warn("export: remove the temporary repository", "dir", h.dir, "err", err)
	}
}

func (h *hostRepo) fail(cmd string, r *hostResult, sentinel error, rawRemote, token string) *GitError {
	return &GitError{Where: "host", Command: cmd, Code: r.code, Signal: r.signal, Stderr: redactText(r.stderr, rawRemote, token), err: sentinel}
}

// fetchBundle writes the bundle next to a new bare repository, fetches its
// branch into it (checking every object) and returns the fetched head.
func (h *hostRepo) fetchBundle(ctx context.Context, bundle []byte, branch string) (string, error) {
	bpath := filepath.Join(h.dir, "export.bundle")
	if err := os.WriteFile(bpath, bundle, 0o600); err != nil {
		return "", fmt.Errorf("export: %w", err)
	}
	r, err := h.x.hostGit(ctx, h.dir, nil, "init", "--bare", "-q", h.repo)
	if err != nil {
		return "", err
	}
	if !r.ok() {
		return "", h.fail("init", r, nil, "", "")
	}
	ref := "refs/heads/" + branch
	r, err = h.x.hostGit(ctx, h.repo, nil,
		"-c", "fetch.fsckObjects=true", "-c", "core.hooksPath=/dev/null",
		"-c", "protocol.allow=never", "-c", "protocol.file.allow=always",
		"fetch", "--no-tags", "--quiet", bpath, "+"+ref+":"+ref)
	if err != nil {
		return "", err
	}
	if !r.ok() {
		return "", h.fail("fetch", r, nil, "", "")
	}
	r, err = h.x.hostGit(ctx, h.repo, nil, "rev-parse", "--verify", "--quiet", ref+"^{commit}")
	if err != nil {
		return "", err
	}
	if !r.ok() {
		return "", h.fail("rev-parse", r, nil, "", "")
	}
	return strings.TrimSpace(r.stdout), nil
}

// push pushes the branch to the remote, offering token (if any) to http(s)
// remotes through the credential helper.
func (h *hostRepo) push(ctx context.Context, rawRemote string, remote *url.URL, branch, token string) error {
	args := []string{
		"-c", "core.hooksPath=/dev/null",
		"-c", "protocol.allow=never",
		"-c", "protocol." + remote.Scheme + ".allow=always",
		"-c", "credential.helper=",
		"-c", "http.followRedirects=false",
	}
	var env []string
	if token != "" && (remote.Scheme == "https" || remote.Scheme == "http") {
		args = append(args, credentialArgs(remote)...)
		env = []string{envUsername + "=" + h.x.opts.Username, envToken + "=" + token}
	}
	ref := "refs/heads/" + branch
	args = append(args, "push", "--porcelain", "--no-verify", rawRemote, ref+":"+ref)
	r, err := h.x.hostGit(ctx, h.repo, env, args...)
	if err != nil {
		return err
	}
	if r.ok() {
		return nil
	}
	// --porcelain: "!\t<src>:<dst>\t[rejected] (reason)" for a refused ref.
	for _, line := range strings.Split(r.stdout, "\n") {
		if strings.HasPrefix(line, "!\t") {
			ge := h.fail("push", r, ErrRejected, rawRemote, token)
			ge.Stderr = strings.TrimSpace(redactText(line+"\n"+r.stderr, rawRemote, token))
			return ge
		}
	}
	return h.fail("push", r, ErrPush, rawRemote, token)
}
