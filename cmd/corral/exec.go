package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/coder/websocket"
	"github.com/spf13/cobra"
	"golang.org/x/sys/unix"
	"golang.org/x/term"

	"github.com/corral-sandbox/corral/sandbox"
)

// execFlags are the flags of `corral exec`.
type execFlags struct {
	interactive, tty bool
	env              []string
	workdir, user    string

	project      string
	state        string
	workerSocket string

	daemon    string
	token     string
	projectID int64
}

func newExecCmd() *cobra.Command {
	var f execFlags
	cmd := &cobra.Command{
		Use:   "exec [-i] [-t] [-e K=V] [-w DIR] [-u USER] (--project DIR | --daemon ADDR --project-id N) -- CMD [ARG...]",
		Short: "Run an interactive command (a shell) in a project",
		Long: `Run a command in a managed project (--project DIR, through the shared
worker as corral run does) or through a daemon (--daemon ADDR --project-id N,
over its WebSocket session API), like docker exec.

-t runs it on a terminal allocated in the machine (its /dev/pts), sized as
corral's terminal and resized with it (SIGWINCH); corral's terminal is put in
raw mode meanwhile, so keys such as ^C reach the command. -i passes corral's
standard input to the command (without it the command reads nothing). -it
with a standard input that is not a terminal is refused at once ("the input
device is not a TTY"), as docker exec refuses it.

corral exits with the command's exit status, or 128+N when signal N killed
it; 127 when the program was not found, 126 when it cannot be executed, 125
when corral could not run it otherwise (the reason is on stderr).`,
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if status := execMain(cmd, &f, args); status != 0 {
				return exitError{status}
			}
			return nil
		},
	}
	fl := cmd.Flags()
	fl.BoolVarP(&f.interactive, "interactive", "i", false, "pass standard input to the command")
	fl.BoolVarP(&f.tty, "tty", "t", false, "run the command on a terminal")
	fl.StringArrayVarP(&f.env, "env", "e", nil, "set `K=V` in the command's environment (repeatable)")
	fl.StringVarP(&f.workdir, "workdir", "w", "", "working `DIR` (a guest path)")
	fl.StringVarP(&f.user, "user", "u", "", "run as `NAME|UID` of the machine")
	fl.StringVar(&f.project, "project", "", "the managed project whose workspace is `DIR` (root)")
	fl.StringVar(&f.state, "state", "", "state `DIR` (default $XDG_STATE_HOME/corral)")
	fl.StringVar(&f.workerSocket, "worker-socket", "", "use the running worker at `PATH` instead of starting one (--project)")
	fl.StringVar(&f.daemon, "daemon", "", "run through the corral daemon at `ADDR` (a Unix socket path or host:port)")
	fl.StringVar(&f.token, "token", "", "bearer token for --daemon (default $CORRAL_TOKEN)")
	fl.Int64Var(&f.projectID, "project-id", 0, "the daemon's project `ID` (with --daemon)")
	return cmd
}

// execSession is a started command, whichever way it runs.
type execSession interface {
	// stdin is nil when the command takes none.
	input() io.WriteCloser
	// copyOutput writes the command's output to stdout and stderr until
	// it ends.
	copyOutput(stdout, stderr io.Writer)
	resize(rows, cols uint16)
	// wait returns corral's exit status for the command's outcome.
	wait() (int, error)
	close()
}

func execMain(cmd *cobra.Command, f *execFlags, argv []string) int {
	stderr := cmd.ErrOrStderr()
	fail := func(err error) int {
		var ce *sandbox.CommandError
		if errors.As(err, &ce) {
			fmt.Fprintf(stderr, "corral: %s: %s\n", ce.Kind, ce.Message)
			return failureStatus(ce)
		}
		fmt.Fprintf(stderr, "corral: %v\n", err)
		return exitFailure
	}
	switch {
	case f.daemon != "":
		if f.project != "" || f.projectID <= 0 {
			return fail(errors.New("--daemon takes --project-id ID, not --project"))
		}
	case f.project == "":
		return fail(errors.New("give --project DIR or --daemon ADDR --project-id N"))
	}
	for _, kv := range f.env {
		if k, _, ok := strings.Cut(kv, "="); !ok || !sandbox.ValidEnvName(k) {
			return fail(fmt.Errorf("-e %q: want K=V with a valid name", kv))
		}
	}
	inFD := int(os.Stdin.Fd())
	outFD := int(os.Stdout.Fd())
	if f.tty && f.interactive && !term.IsTerminal(inFD) {
		// As docker exec -it refuses: raw mode and a remote terminal over a
		// pipe or a file would wait forever for keys that never come.
		return fail(errors.New("the input device is not a TTY"))
	}
	var size *sandbox.TTYSize
	if f.tty {
		size = &sandbox.TTYSize{Rows: 24, Cols: 80}
		if cols, rows, err := term.GetSize(outFD); err == nil && rows > 0 && cols > 0 {
			size = &sandbox.TTYSize{Rows: uint16(rows), Cols: uint16(cols)}
		}
	}
	ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGTERM)
	defer stop()
	var (
		s   execSession
		err error
	)
	if f.daemon != "" {
		s, err = startDaemonExec(ctx, f, argv, size)
	} else {
		s, err = startProjectExec(ctx, f, argv, size)
	}
	if err != nil {
		return fail(err)
	}
	defer s.close()

	if f.tty && term.IsTerminal(inFD) {
		old, err := term.MakeRaw(inFD)
		if err == nil {
			defer term.Restore(inFD, old)
		}
		winch := make(chan os.Signal, 1)
		signal.Notify(winch, unix.SIGWINCH)
		defer signal.Stop(winch)
		go func() {
			for range winch {
				if cols, rows, err := term.GetSize(outFD); err == nil && rows > 0 && cols > 0 {
					s.resize(uint16(rows), uint16(cols))
				}
			}
		}()
	}
	if in := s.input(); in != nil && f.interactive {
		go func() {
			_, _ = io.Copy(in, os.Stdin)
			if !f.tty {
				_ = in.Close()
			}
		}()
	} else if in != nil && !f.tty {
		_ = in.Close()
	}
	s.copyOutput(cmd.OutOrStdout(), stderr)
	status, err := s.wait()
	if err != nil {
		return fail(err)
	}
	return status
}

// statusOf is corral's exit status for an exit: the code, or 128+N.
func statusOf(e sandbox.Exit) int {
	if e.Code != nil {
		return *e.Code
	}
	if sig := unix.SignalNum(e.Signal); sig != 0 {
		return 128 + int(sig)
	}
	return 125
}

// projectExec is a --project session: a sandbox session of the local core
// (Control.Open keeps its lease alive while it runs).
type projectExec struct {
	env  *runEnv
	sess *sandbox.Session
	once sync.Once
}

// envMap turns checked K=V strings into an environment (nil for none).
func envMap(kvs []string) map[string]string {
	if len(kvs) == 0 {
		return nil
	}
	m := make(map[string]string, len(kvs))
	for _, kv := range kvs {
		k, v, _ := strings.Cut(kv, "=")
		m[k] = v
	}
	return m
}

func startProjectExec(ctx context.Context, f *execFlags, argv []string, size *sandbox.TTYSize) (*projectExec, error) {
	env, err := openRunEnv(ctx, &runFlags{project: f.project, state: f.state, workerSocket: f.workerSocket, cwd: f.workdir, user: f.user})
	if err != nil {
		return nil, err
	}
	if env.project.Kind != sandbox.ProjectManaged {
		env.close()
		return nil, errors.New("not a managed project")
	}
	in := sandbox.ExecInput{
		Command:   sandbox.Command{Type: sandbox.CommandTypeArgv, File: argv[0], Args: argv[1:]},
		Cwd:       env.cwd,
		User:      f.user,
		LeaseKind: sandbox.LeaseTerminal,
		Project:   env.project,
		TTY:       size,
		Env:       envMap(f.env),
	}
	sess, err := env.control.Open(ctx, in, &env.actor, nil)
	if err != nil {
		env.close()
		return nil, err
	}
	return &projectExec{env: env, sess: sess}, nil
}

func (p *projectExec) input() io.WriteCloser { return p.sess.Stdin }

func (p *projectExec) copyOutput(stdout, stderr io.Writer) {
	// The session bounds the drain after the exit: it closes the streams.
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); _, _ = io.Copy(stdout, p.sess.Stdout) }()
	go func() { defer wg.Done(); _, _ = io.Copy(stderr, p.sess.Stderr) }()
	wg.Wait()
}

func (p *projectExec) resize(rows, cols uint16) { _ = p.sess.Resize(rows, cols) }

func (p *projectExec) wait() (int, error) {
	exit, err := p.sess.Wait()
	if err != nil {
		return 0, err
	}
	return statusOf(exit), nil
}

func (p *projectExec) close() {
	p.once.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = p.sess.Close(ctx)
		p.env.close()
	})
}

// daemonExec is a --daemon session over the daemon's WebSocket API.
type daemonExec struct {
	conn   *websocket.Conn
	ctx    context.Context
	status int
	err    error
}

func startDaemonExec(ctx context.Context, f *execFlags, argv []string, size *sandbox.TTYSize) (*daemonExec, error) {
	c, err := daemonClient(f.daemon, f.token)
	if err != nil {
		return nil, err
	}
	q := url.Values{"argv": argv}
	if f.workdir != "" {
		q.Set("cwd", f.workdir)
	}
	if f.user != "" {
		q.Set("user", f.user)
	}
	// The session's environment, as ExecInput.Env (names checked above).
	q["env"] = f.env
	if size != nil {
		q.Set("tty", "1")
		q.Set("rows", strconv.Itoa(int(size.Rows)))
		q.Set("cols", strconv.Itoa(int(size.Cols)))
	}
	u := c.URL(fmt.Sprintf("/v1/projects/%d/sessions", f.projectID)) + "?" + q.Encode()
	u = "ws" + strings.TrimPrefix(u, "http")
	conn, _, err := websocket.Dial(ctx, u, &websocket.DialOptions{HTTPClient: c.HTTPClient(), HTTPHeader: c.Header()})
	if err != nil {
		return nil, fmt.Errorf("daemon session: %w", err)
	}
	conn.SetReadLimit(1 << 20)
	return &daemonExec{conn: conn, ctx: ctx}, nil
}

func (d *daemonExec) input() io.WriteCloser { return daemonStdin{d} }

type daemonStdin struct{ d *daemonExec }

func (w daemonStdin) Write(p []byte) (int, error) {
	if err := w.d.conn.Write(w.d.ctx, websocket.MessageBinary, append([]byte{0}, p...)); err != nil {
		return 0, err
	}
	return len(p), nil
}

func (w daemonStdin) Close() error {
	return w.d.conn.Write(w.d.ctx, websocket.MessageText, []byte(`{"type":"eof"}`))
}

func (d *daemonExec) copyOutput(stdout, stderr io.Writer) {
	d.status, d.err = 125, errors.New("the daemon closed the session without an exit")
	for {
		typ, data, err := d.conn.Read(d.ctx)
		if err != nil {
			return
		}
		if typ == websocket.MessageBinary && len(data) > 0 {
			switch data[0] {
			case 1:
				_, _ = stdout.Write(data[1:])
			case 2:
				_, _ = stderr.Write(data[1:])
			}
			continue
		}
		var m struct {
			Type    string  `json:"type"`
			Code    *int    `json:"code"`
			Signal  *string `json:"signal"`
			Kind    string  `json:"kind"`
			Message string  `json:"message"`
		}
		if json.Unmarshal(data, &m) != nil {
			continue
		}
		switch m.Type {
		case "exit":
			e := sandbox.Exit{Code: m.Code}
			if m.Signal != nil {
				e.Signal = *m.Signal
			}
			d.status, d.err = statusOf(e), nil
		case "error":
			d.err = fmt.Errorf("%s: %s", m.Kind, m.Message)
		}
	}
}

func (d *daemonExec) resize(rows, cols uint16) {
	b, _ := json.Marshal(map[string]any{"type": "resize", "rows": rows, "cols": cols})
	_ = d.conn.Write(d.ctx, websocket.MessageText, b)
}

func (d *daemonExec) wait() (int, error) { return d.status, d.err }

func (d *daemonExec) close() { _ = d.conn.CloseNow() }
