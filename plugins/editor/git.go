package editor

import (
	"context"
	"errors"
	"fmt"
	"path"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/corral-sandbox/corral/internal/redact"
	"github.com/corral-sandbox/corral/sandbox"
)

// hardenedEnv is set for every git command (through env(1), since a
// command's environment is the provider's). It keeps the system and global
// configuration (a host project's HOME is its root) and the system
// attributes out, never prompts, takes no optional locks and keeps git's
// messages in English so they can be recognised.
var hardenedEnv = []string{
	"GIT_CONFIG_NOSYSTEM=1",
	"GIT_CONFIG_GLOBAL=/dev/null",
	"GIT_ATTR_NOSYSTEM=1",
	"GIT_TERMINAL_PROMPT=0",
	"GIT_OPTIONAL_LOCKS=0",
	"GIT_NO_LAZY_FETCH=1",
	"GIT_PAGER=cat",
	"PAGER=cat",
	"LC_ALL=C",
}

// hardenedConfig outranks the repository's configuration: nothing a read
// does may run a program the project chose.
var hardenedConfig = []string{
	"core.fsmonitor=false",
	"core.hooksPath=/dev/null",
	"core.pager=cat",
	"diff.external=",
	"core.sshCommand=false",
	"protocol.allow=never",
	"log.showSignature=false",
	"log.follow=false",
	"color.ui=false",
	"diff.submodule=short",
	"submodule.recurse=false",
	"core.quotePath=false",
}

// gitRunner runs hardened git commands for one method call.
type gitRunner struct {
	ctl     *sandbox.Control
	actor   sandbox.Actor
	project sandbox.ProjectRef
	dir     string
	timeout time.Duration
	// extra holds configuration overrides given through GIT_CONFIG_COUNT
	// (filter drivers, whose names may hold any byte but NUL and newline).
	extra [][2]string
}

// gitOutput is one git command's result, redacted.
type gitOutput struct {
	stdout string
	stderr string
	code   *int
	signal string
	// overflowed: the output limit was reached; stdout is partial.
	overflowed bool
	// redacted: redaction changed stdout.
	redacted bool
}

func newOutput(stdout, stderr string) *gitOutput {
	o := &gitOutput{stdout: redact.String(stdout), stderr: redact.String(stderr)}
	o.redacted = o.stdout != stdout
	return o
}

func (o *gitOutput) ok() bool { return o.code != nil && *o.code == 0 }

func (o *gitOutput) exit(c int) bool { return o.code != nil && *o.code == c }

// errNotRepo reports a project directory that is not a Git repository.
var errNotRepo = errors.New("editor: not a git repository")

// notRepo reports git's answer in a directory that is not a repository:
// "fatal: not a git repository" (128), or diff's usage warning "Not a git
// repository" (129).
func (o *gitOutput) notRepo() bool {
	return (o.exit(128) || o.exit(129)) && strings.Contains(strings.ToLower(o.stderr), "not a git repository")
}

func (o *gitOutput) gitError(cmd string) error {
	return &GitError{Command: cmd, Code: o.code, Signal: o.signal, Stderr: o.stderr}
}

// argv returns the full command line of git args.
func (g *gitRunner) argv(args []string) []string {
	argv := make([]string, 0, len(hardenedEnv)+2*len(g.extra)+2*len(hardenedConfig)+len(args)+12)
	argv = append(argv, hardenedEnv...)
	if len(g.extra) > 0 {
		argv = append(argv, "GIT_CONFIG_COUNT="+strconv.Itoa(len(g.extra)))
		for i, kv := range g.extra {
			n := strconv.Itoa(i)
			argv = append(argv, "GIT_CONFIG_KEY_"+n+"="+kv[0], "GIT_CONFIG_VALUE_"+n+"="+kv[1])
		}
	}
	argv = append(argv, "git")
	for _, c := range hardenedConfig {
		argv = append(argv, "-c", c)
	}
	argv = append(argv, "-C", g.dir, "--git-dir=.git", "--work-tree=.", "--no-pager",
		"--literal-pathspecs", "--no-optional-locks")
	return append(argv, args...)
}

// run runs git args with stdout bounded to limit bytes (stderr gets 64 KiB
// more, as one combined limit). If the output overflows and partial is
// true, the partial output is returned with overflowed set; otherwise an
// overflow is an error. A not-a-repository exit is errNotRepo.
func (g *gitRunner) run(ctx context.Context, limit int64, partial bool, args ...string) (*gitOutput, error) {
	argv := g.argv(args)
	in := sandbox.ExecInput{
		Command:   sandbox.Command{Type: sandbox.CommandTypeArgv, File: "env", Args: argv},
		LeaseKind: sandbox.LeaseEditor,
		Project:   g.project,
	}
	actor := g.actor
	res, err := g.ctl.RunCommand(ctx, in, &actor, &sandbox.RunOptions{
		Timeout:     g.timeout,
		OutputLimit: sandbox.OutputLimit{Combined: limit + stderrSlack},
	})
	if err != nil {
		var ce *sandbox.CommandError
		if partial && errors.As(err, &ce) && ce.Kind == sandbox.KindOverflow && ce.Cleanup == nil {
			out := newOutput(ce.Stdout, ce.Stderr)
			out.overflowed = true
			return out, nil
		}
		return nil, redactError(err)
	}
	out := newOutput(res.Stdout, res.Stderr)
	out.code, out.signal = res.Code, res.Signal
	if out.notRepo() {
		return nil, errNotRepo
	}
	return out, nil
}

// stderrSlack is the room left for git's standard error beyond a
// command's stdout limit.
const stderrSlack = 64 << 10

// neutralizeFilters lists the repository's filter drivers and overrides
// each one's commands with nothing, for the reads that compare the working
// tree (and so may clean files through a filter).
func (g *gitRunner) neutralizeFilters(ctx context.Context) error {
	out, err := g.run(ctx, 1<<20, false, "config", "-z", "--name-only", "--get-regexp", `^filter\.`)
	if err != nil {
		return err
	}
	if !out.ok() && !out.exit(1) { // 1: no such key
		return out.gitError("config")
	}
	seen := map[string]bool{}
	for _, key := range strings.Split(out.stdout, "\x00") {
		// filter.<driver>.<key>: the driver may contain dots.
		rest, ok := strings.CutPrefix(key, "filter.")
		if !ok {
			continue
		}
		i := strings.LastIndexByte(rest, '.')
		if i <= 0 {
			continue
		}
		driver := rest[:i]
		if seen[driver] {
			continue
		}
		seen[driver] = true
		for _, k := range []string{"clean", "smudge", "process"} {
			g.extra = append(g.extra, [2]string{"filter." + driver + "." + k, ""})
		}
		g.extra = append(g.extra, [2]string{"filter." + driver + ".required", "false"})
	}
	return nil
}

// maxRefLen bounds a ref given by a caller.
const maxRefLen = 1024

// checkRef validates a caller's ref (a revision expression: a name, a hash,
// HEAD~2, main..topic). It may not be empty, start with '-', or contain NUL
// or control characters.
func checkRef(what, ref string) error {
	switch {
	case ref == "":
		return fmt.Errorf("%w: %s is empty", ErrBadInput, what)
	case len(ref) > maxRefLen:
		return fmt.Errorf("%w: %s is longer than %d bytes", ErrBadInput, what, maxRefLen)
	case ref[0] == '-':
		return fmt.Errorf("%w: %s %q starts with '-'", ErrBadInput, what, ref)
	}
	for i := 0; i < len(ref); i++ {
		if c := ref[i]; c < 0x20 || c == 0x7f || c == ' ' {
			return fmt.Errorf("%w: %s %q contains a space or control character", ErrBadInput, what, ref)
		}
	}
	return nil
}

// cleanPath validates a caller's path, relative to the repository root,
// and returns it cleaned ("" for the whole repository). It may not be
// absolute, start with '-', contain NUL, or climb out with "..".
func cleanPath(p string) (string, error) {
	if p == "" {
		return "", nil
	}
	switch {
	case len(p) > 4096:
		return "", fmt.Errorf("%w: path is longer than 4096 bytes", ErrBadInput)
	case strings.IndexByte(p, 0) >= 0:
		return "", fmt.Errorf("%w: path contains a NUL byte", ErrBadInput)
	case p[0] == '-':
		return "", fmt.Errorf("%w: path %q starts with '-'", ErrBadInput, p)
	case path.IsAbs(p):
		return "", fmt.Errorf("%w: path %q is absolute (paths are relative to the repository root)", ErrBadInput, p)
	}
	c := path.Clean(p)
	if c == ".." || strings.HasPrefix(c, "../") {
		return "", fmt.Errorf("%w: path %q leaves the repository", ErrBadInput, p)
	}
	if c == "." {
		return "", nil
	}
	return c, nil
}

// unknownRevision reports whether a failed git command's stderr says a
// ref or path did not resolve.
func unknownRevision(o *gitOutput) bool {
	if !o.exit(128) {
		return false
	}
	for _, s := range []string{
		"unknown revision", "bad revision", "ambiguous argument", "Not a valid object name",
		"not a valid object", "bad object", "invalid object name", "Invalid symmetric difference",
		"does not exist in", "exists on disk, but not in", "not a tree object",
	} {
		if strings.Contains(o.stderr, s) {
			return true
		}
	}
	return false
}

func revisionError(o *gitOutput) error {
	return fmt.Errorf("%w: %s", ErrUnknownRevision, firstLine(o.stderr))
}

func firstLine(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		s = s[:i]
	}
	return strings.TrimPrefix(s, "fatal: ")
}

// cut returns s cut to at most max bytes, at the last newline if there is
// one in the second half, else at a UTF-8 boundary.
func cut(s string, max int64) string {
	if int64(len(s)) <= max {
		return s
	}
	s = s[:max]
	if i := strings.LastIndexByte(s, '\n'); i >= 0 && int64(i) >= max/2 {
		return s[:i+1]
	}
	// Drop a multi-byte character whose continuation was cut off.
	for i := 0; i < utf8.UTFMax && len(s) > 0; i++ {
		r, size := utf8.DecodeLastRuneInString(s)
		if r != utf8.RuneError || size > 1 {
			break
		}
		s = s[:len(s)-1]
	}
	return s
}
