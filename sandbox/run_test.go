package sandbox_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/corral-sandbox/corral/internal/pdeath"

	"go.uber.org/goleak"

	"github.com/corral-sandbox/corral/sandbox"
	"github.com/corral-sandbox/corral/sandbox/sandboxtest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m, goleak.IgnoreTopFunction(pdeath.SpawnerFunc)) }

var actor = sandbox.Actor{AccountUserID: 7}

func input(kind sandbox.ProjectKind, argv ...string) sandbox.ExecInput {
	return sandbox.ExecInput{
		Command:   sandbox.Command{Type: "argv", File: argv[0], Args: argv[1:]},
		LeaseKind: sandbox.LeaseTerminal,
		Project:   sandbox.ProjectRef{Kind: kind, ProjectID: 1},
	}
}

func TestConformanceFake(t *testing.T) {
	for _, kind := range []sandbox.ProjectKind{sandbox.ProjectHost, sandbox.ProjectManaged} {
		t.Run(string(kind), func(t *testing.T) {
			dir := t.TempDir()
			p := &sandboxtest.Provider{Kind: kind, Dir: dir, Sanitize: func(s string) string { return strings.ReplaceAll(s, dir, "/display") },
				SanitizeHold: func(s string) int {
					for k := min(len(dir), len(s)); k > 0; k-- {
						if strings.HasSuffix(s, dir[:k]) {
							return k
						}
					}
					return 0
				}}
			ctl := sandbox.NewControl(p, sandbox.ControlOptions{DrainTimeout: 300 * time.Millisecond})
			sandboxtest.Run(t, sandboxtest.Target{
				Control: ctl, Actor: actor, Project: sandbox.ProjectRef{Kind: kind, ProjectID: 1},
				HostCwd: dir, HostPath: dir, DisplayPath: "/display",
				// The fake's managed sessions have no terminal.
				Terminal: kind == sandbox.ProjectHost,
				LiveLeases: func(t *testing.T) int {
					n := 0
					for _, l := range p.Leases() {
						if !l.Released() {
							n++
						}
					}
					return n
				},
			})
		})
	}
}

// TestCancelThenReleaseExactlyOnce checks every failure kind cancels once
// and releases once, and a completed command releases without cancel.
func TestCancelThenReleaseExactlyOnce(t *testing.T) {
	boom := errors.New("boom")
	cases := []struct {
		name   string
		argv   []string
		opts   *sandbox.RunOptions
		ctx    func() (context.Context, context.CancelFunc)
		hbErr  bool
		kind   sandbox.ErrorKind
		cancel int64
	}{
		{name: "completed", argv: []string{"sh", "-c", "exit 4"}, cancel: 0},
		{name: "timeout", argv: []string{"sleep", "100"}, opts: &sandbox.RunOptions{Timeout: 100 * time.Millisecond}, kind: sandbox.KindTimeout, cancel: 1},
		{name: "abortBefore", argv: []string{"true"}, ctx: func() (context.Context, context.CancelFunc) {
			ctx, c := context.WithCancel(context.Background())
			c()
			return ctx, c
		}, kind: sandbox.KindAbort, cancel: 1},
		{name: "abortAfter", argv: []string{"sleep", "100"}, ctx: func() (context.Context, context.CancelFunc) {
			return context.WithTimeout(context.Background(), 150*time.Millisecond)
		}, kind: sandbox.KindAbort, cancel: 1},
		{name: "overflow", argv: []string{"sh", "-c", "yes"}, opts: &sandbox.RunOptions{OutputLimit: sandbox.OutputLimit{Stdout: 10}}, kind: sandbox.KindOverflow, cancel: 1},
		{name: "combinedOverflow", argv: []string{"sh", "-c", "yes >&2"}, opts: &sandbox.RunOptions{OutputLimit: sandbox.OutputLimit{Combined: 10}}, kind: sandbox.KindOverflow, cancel: 1},
		{name: "onStart", argv: []string{"true"}, opts: &sandbox.RunOptions{OnStart: func(sandbox.StartInfo) error { return boom }}, kind: sandbox.KindStart, cancel: 1},
		{name: "onStartPanic", argv: []string{"true"}, opts: &sandbox.RunOptions{OnStart: func(sandbox.StartInfo) error { panic("kaboom") }}, kind: sandbox.KindStart, cancel: 1},
		{name: "heartbeat", argv: []string{"sleep", "100"}, hbErr: true, kind: sandbox.KindTransport, cancel: 1},
		{name: "notStarted", argv: []string{"/no/such/program"}, kind: sandbox.KindStart, cancel: 1},
	}
	for _, kind := range []sandbox.ProjectKind{sandbox.ProjectHost, sandbox.ProjectManaged} {
		for _, tc := range cases {
			t.Run(string(kind)+"/"+tc.name, func(t *testing.T) {
				p := &sandboxtest.Provider{}
				if tc.hbErr {
					p.OnLease = func(l *sandboxtest.Lease) { e := errors.New("store gone"); l.HeartbeatErr.Store(&e) }
				}
				ctl := sandbox.NewControl(p, sandbox.ControlOptions{HeartbeatInterval: 20 * time.Millisecond})
				ctx, cancel := context.Background(), context.CancelFunc(func() {})
				if tc.ctx != nil {
					ctx, cancel = tc.ctx()
				}
				defer cancel()
				res, err := ctl.RunCommand(ctx, input(kind, tc.argv...), &actor, tc.opts)
				if tc.kind == "" {
					if err != nil {
						t.Fatal(err)
					}
					if *res.Code != 4 {
						t.Fatalf("code = %d", *res.Code)
					}
				} else {
					if got := sandbox.KindOf(err); got != tc.kind {
						t.Fatalf("kind = %q (%v), want %q", got, err, tc.kind)
					}
					var ce *sandbox.CommandError
					errors.As(err, &ce)
					if ce.Cleanup != nil {
						t.Errorf("unexpected cleanup error: %v", ce.Cleanup)
					}
				}
				if got := p.Cancels(); got != tc.cancel {
					t.Errorf("cancels = %d, want %d", got, tc.cancel)
				}
				l := p.LastLease()
				if got := l.Releases.Load(); got != 1 {
					t.Errorf("releases = %d, want 1", got)
				}
			})
		}
	}
}

func TestHeartbeatsAtInterval(t *testing.T) {
	p := &sandboxtest.Provider{}
	ctl := sandbox.NewControl(p, sandbox.ControlOptions{HeartbeatInterval: 10 * time.Millisecond})
	if _, err := ctl.RunCommand(context.Background(), input(sandbox.ProjectHost, "sleep", "0.3"), &actor, nil); err != nil {
		t.Fatal(err)
	}
	n := p.LastLease().Heartbeats.Load()
	if n < 10 || n > 40 {
		t.Fatalf("heartbeats over 300ms at 10ms = %d, want about 30", n)
	}
	// The default interval is five seconds: a short command is not heartbeated.
	ctl = sandbox.NewControl(p, sandbox.ControlOptions{})
	if _, err := ctl.RunCommand(context.Background(), input(sandbox.ProjectHost, "sleep", "0.1"), &actor, nil); err != nil {
		t.Fatal(err)
	}
	if n := p.LastLease().Heartbeats.Load(); n != 0 {
		t.Fatalf("heartbeats with default interval after 100ms = %d", n)
	}
}

func TestReleaseFailureIsCleanupError(t *testing.T) {
	relErr := errors.New("release failed")
	p := &sandboxtest.Provider{OnLease: func(l *sandboxtest.Lease) { l.ReleaseErr.Store(&relErr) }}
	ctl := sandbox.NewControl(p, sandbox.ControlOptions{})

	_, err := ctl.RunCommand(context.Background(), input(sandbox.ProjectHost, "echo", "hi"), &actor, nil)
	var ce *sandbox.CommandError
	if !errors.As(err, &ce) || ce.Kind != sandbox.KindCleanup {
		t.Fatalf("err = %v, want cleanup", err)
	}
	if ce.Stdout != "hi\n" || !errors.Is(err, relErr) {
		t.Fatalf("cleanup error = %+v", ce)
	}

	_, err = ctl.RunCommand(context.Background(), input(sandbox.ProjectHost, "sleep", "10"), &actor, &sandbox.RunOptions{Timeout: 50 * time.Millisecond})
	if !errors.As(err, &ce) || ce.Kind != sandbox.KindTimeout {
		t.Fatalf("err = %v, want timeout", err)
	}
	if !errors.Is(ce.Cleanup, relErr) || !errors.Is(err, relErr) {
		t.Fatalf("release failure not joined into the primary error: %+v", ce)
	}
}

func TestTargetMismatchRefusedAndReleased(t *testing.T) {
	cases := map[string]func(sandbox.Prepared){
		"projectID":    func(p sandbox.Prepared) { p.Common().Project.ProjectID = 99 },
		"leaseAccount": func(p sandbox.Prepared) { p.Common().Lease = sandboxtest.NewLease("x", 8, sandbox.LeaseTerminal) },
		"leaseKind":    func(p sandbox.Prepared) { p.Common().Lease = sandboxtest.NewLease("x", 7, sandbox.LeaseEditor) },
		"noStart": func(p sandbox.Prepared) {
			if m, ok := p.(*sandbox.ManagedPrepared); ok {
				m.Start = nil
			}
		},
	}
	for name, mut := range cases {
		t.Run(name, func(t *testing.T) {
			var leases []*sandboxtest.Lease
			p := &sandboxtest.Provider{OnLease: func(l *sandboxtest.Lease) { leases = append(leases, l) }}
			p.Mutate = func(prep sandbox.Prepared) {
				mut(prep)
				if l, ok := prep.Common().Lease.(*sandboxtest.Lease); ok && l.ID() == "x" {
					leases = append(leases, l)
				}
			}
			ctl := sandbox.NewControl(p, sandbox.ControlOptions{})
			started := false
			_, err := ctl.RunCommand(context.Background(), input(sandbox.ProjectManaged, "true"), &actor,
				&sandbox.RunOptions{OnStart: func(sandbox.StartInfo) error { started = true; return nil }})
			if sandbox.KindOf(err) != sandbox.KindPrepare {
				t.Fatalf("err = %v, want prepare", err)
			}
			if started {
				t.Fatal("a mismatched target was started")
			}
			last := leases[len(leases)-1]
			if last.Releases.Load() != 1 {
				t.Fatalf("the returned lease was released %d times, want 1", last.Releases.Load())
			}
		})
	}
}

func TestInvalidInputNeverReachesProvider(t *testing.T) {
	p := &sandboxtest.Provider{}
	ctl := sandbox.NewControl(p, sandbox.ControlOptions{})
	bad := map[string]struct {
		in   sandbox.ExecInput
		opts *sandbox.RunOptions
	}{
		"type":      {in: sandbox.ExecInput{Command: sandbox.Command{Type: "shell", File: "ls"}, LeaseKind: "terminal", Project: sandbox.ProjectRef{Kind: "host", ProjectID: 1}}},
		"leaseKind": {in: sandbox.ExecInput{Command: sandbox.Command{Type: "argv", File: "ls"}, LeaseKind: "root", Project: sandbox.ProjectRef{Kind: "host", ProjectID: 1}}},
		"nul":       {in: input(sandbox.ProjectHost, "ls", "a\x00b")},
		"empty":     {in: sandbox.ExecInput{Command: sandbox.Command{Type: "argv"}, LeaseKind: "terminal", Project: sandbox.ProjectRef{Kind: "host", ProjectID: 1}}},
		"project":   {in: sandbox.ExecInput{Command: sandbox.Command{Type: "argv", File: "ls"}, LeaseKind: "terminal", Project: sandbox.ProjectRef{Kind: "cloud", ProjectID: 1}}},
		"limits":    {in: input(sandbox.ProjectHost, "ls"), opts: &sandbox.RunOptions{OutputLimit: sandbox.OutputLimit{Stdout: 1, Combined: 2}}},
		"timeout":   {in: input(sandbox.ProjectHost, "ls"), opts: &sandbox.RunOptions{Timeout: -1}},
	}
	for name, tc := range bad {
		_, err := ctl.RunCommand(context.Background(), tc.in, &actor, tc.opts)
		if sandbox.KindOf(err) != sandbox.KindPrepare {
			t.Errorf("%s: err = %v, want prepare", name, err)
		}
	}
	if p.Calls() != 0 {
		t.Fatalf("provider called %d times for invalid input", p.Calls())
	}
}

func TestPreparationRefusal(t *testing.T) {
	p := &sandboxtest.Provider{Refuse: sandbox.ErrDenied}
	ctl := sandbox.NewControl(p, sandbox.ControlOptions{})
	_, err := ctl.RunCommand(context.Background(), input(sandbox.ProjectHost, "true"), &actor, nil)
	if sandbox.KindOf(err) != sandbox.KindPrepare || !errors.Is(err, sandbox.ErrDenied) {
		t.Fatalf("err = %v", err)
	}
}

func TestNoDescriptorLeak(t *testing.T) {
	p := &sandboxtest.Provider{}
	ctl := sandbox.NewControl(p, sandbox.ControlOptions{})
	count := func() int { e, _ := os.ReadDir("/proc/self/fd"); return len(e) }
	run := func() {
		for _, kind := range []sandbox.ProjectKind{sandbox.ProjectHost, sandbox.ProjectManaged} {
			_, _ = ctl.RunCommand(context.Background(), input(kind, "echo", "x"), &actor, nil)
			_, _ = ctl.RunCommand(context.Background(), input(kind, "sleep", "5"), &actor, &sandbox.RunOptions{Timeout: 20 * time.Millisecond})
			_, _ = ctl.RunCommand(context.Background(), input(kind, "/no/such"), &actor, nil)
			_, _ = ctl.RunCommand(context.Background(), input(kind, "yes"), &actor, &sandbox.RunOptions{OutputLimit: sandbox.OutputLimit{Combined: 5}})
		}
	}
	run()
	before := count()
	for i := 0; i < 5; i++ {
		run()
	}
	if after := count(); after > before {
		t.Fatalf("descriptors: %d before, %d after", before, after)
	}
}

func TestResultJSON(t *testing.T) {
	code := 0
	b, _ := (sandbox.CommandResult{Stdout: "a", Code: &code}).MarshalJSON()
	if string(b) != `{"stdout":"a","stderr":"","code":0,"signal":null}` {
		t.Fatalf("json = %s", b)
	}
	// oomKilled appears only when true, and only with a signal.
	killed := sandbox.CommandResult{Signal: "SIGKILL", OOMKilled: true}
	b, _ = killed.MarshalJSON()
	if string(b) != `{"stdout":"","stderr":"","code":null,"signal":"SIGKILL","oomKilled":true}` {
		t.Fatalf("json = %s", b)
	}
	var back sandbox.CommandResult
	if err := back.UnmarshalJSON(b); err != nil || back != killed {
		t.Fatalf("decoded %+v, %v", back, err)
	}
	b, _ = (sandbox.CommandResult{Signal: "SIGKILL"}).MarshalJSON()
	if string(b) != `{"stdout":"","stderr":"","code":null,"signal":"SIGKILL"}` {
		t.Fatalf("json = %s", b)
	}
}

// TestSlowStart: a start that outlives the timeout is a timeout, one the
// caller aborts is an abort — never a start error — and both cancel and
// release.
func TestSlowStart(t *testing.T) {
	blockingStart := func(p sandbox.Prepared) {
		m := p.(*sandbox.ManagedPrepared)
		m.Start = func(ctx context.Context) (*sandbox.ManagedExecutionSession, error) {
			<-ctx.Done()
			return nil, ctx.Err()
		}
	}
	for _, tc := range []struct {
		name string
		kind sandbox.ErrorKind
	}{{"timeout", sandbox.KindTimeout}, {"abort", sandbox.KindAbort}} {
		t.Run(tc.name, func(t *testing.T) {
			p := &sandboxtest.Provider{Mutate: blockingStart}
			ctl := sandbox.NewControl(p, sandbox.ControlOptions{})
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			opts := &sandbox.RunOptions{Timeout: 100 * time.Millisecond}
			if tc.kind == sandbox.KindAbort {
				opts.Timeout = time.Minute
				time.AfterFunc(100*time.Millisecond, cancel)
			}
			_, err := ctl.RunCommand(ctx, input(sandbox.ProjectManaged, "true"), &actor, opts)
			if sandbox.KindOf(err) != tc.kind {
				t.Fatalf("err = %v, want %s", err, tc.kind)
			}
			if p.Cancels() != 1 || p.LastLease().Releases.Load() != 1 {
				t.Fatalf("cancels %d releases %d", p.Cancels(), p.LastLease().Releases.Load())
			}
		})
	}
}

// TestLargeOutputIsExact: a multi-chunk capture returns every byte, in
// order, and counts it.
func TestLargeOutputIsExact(t *testing.T) {
	var rec sandbox.Record
	p := &sandboxtest.Provider{}
	ctl := sandbox.NewControl(p, sandbox.ControlOptions{Observe: func(r sandbox.Record) { rec = r }})
	res, err := ctl.RunCommand(context.Background(), input(sandbox.ProjectHost, "seq", "1", "300000"), &actor,
		&sandbox.RunOptions{OutputLimit: sandbox.OutputLimit{Stdout: 8 << 20}})
	if err != nil {
		t.Fatal(err)
	}
	var want strings.Builder
	for i := 1; i <= 300000; i++ {
		want.WriteString(strconv.Itoa(i))
		want.WriteByte('\n')
	}
	if res.Stdout != want.String() {
		t.Fatalf("stdout differs: %d bytes, want %d", len(res.Stdout), want.Len())
	}
	if rec.StdoutBytes != int64(want.Len()) {
		t.Fatalf("record counts %d bytes, want %d", rec.StdoutBytes, want.Len())
	}
}

// TestConfinementChecked: a local preparation whose confinement does not
// fit its mode is refused before anything starts, and its lease released.
func TestConfinementChecked(t *testing.T) {
	cases := map[string]func(*sandbox.LocalPrepared){
		"directWithConfinement": func(p *sandbox.LocalPrepared) {
			p.Launch.Confine = &sandbox.Confinement{Path: p.Launch.Path, Args: p.Launch.Args, Writable: []string{"/tmp"}}
		},
		"noWritable": func(p *sandbox.LocalPrepared) {
			p.Mode = sandbox.LocalConfined
			p.Launch.Confine = &sandbox.Confinement{Path: p.Launch.Path, Args: p.Launch.Args}
		},
		"noPath": func(p *sandbox.LocalPrepared) {
			p.Mode = sandbox.LocalConfined
			p.Launch.Confine = &sandbox.Confinement{Args: p.Launch.Args, Writable: []string{"/tmp"}}
		},
	}
	for name, mut := range cases {
		t.Run(name, func(t *testing.T) {
			p := &sandboxtest.Provider{Mutate: func(prep sandbox.Prepared) { mut(prep.(*sandbox.LocalPrepared)) }}
			ctl := sandbox.NewControl(p, sandbox.ControlOptions{})
			started := false
			_, err := ctl.RunCommand(context.Background(), input(sandbox.ProjectHost, "true"), &actor,
				&sandbox.RunOptions{OnStart: func(sandbox.StartInfo) error { started = true; return nil }})
			if sandbox.KindOf(err) != sandbox.KindPrepare || !strings.Contains(err.Error(), "confinement") {
				t.Fatalf("err = %v, want a prepare error about the confinement", err)
			}
			if started {
				t.Fatal("a launch with a mismatched confinement was started")
			}
			if l := p.LastLease(); l == nil || l.Releases.Load() != 1 {
				t.Fatalf("lease %v not released exactly once", l)
			}
		})
	}
}

// TestLostSessionSettlesPromptly: a managed session that settles with a
// lost transport while its streams stay open (its machine not torn down
// yet) fails as transport with the output read so far, after the short
// failure drain, not after ControlOptions.DrainTimeout.
func TestLostSessionSettlesPromptly(t *testing.T) {
	var keep []*os.File
	defer func() {
		for _, f := range keep {
			f.Close()
		}
	}()
	p := &sandboxtest.Provider{Mutate: func(prep sandbox.Prepared) {
		m := prep.(*sandbox.ManagedPrepared)
		m.Start = func(context.Context) (*sandbox.ManagedExecutionSession, error) {
			inR, inW, _ := os.Pipe()
			outR, outW, _ := os.Pipe()
			errR, errW, _ := os.Pipe()
			keep = append(keep, inR, outW, errW)
			s, settle := sandbox.NewManagedSession(inW, outR, errR)
			outW.WriteString("partial")
			go func() {
				time.Sleep(20 * time.Millisecond)
				settle(sandbox.Exit{}, fmt.Errorf("%w: connection to the worker lost", sandbox.ErrTransport))
			}()
			return s, nil
		}
		m.Cancel = func(context.Context) error { return nil }
	}}
	ctl := sandbox.NewControl(p, sandbox.ControlOptions{DrainTimeout: 10 * time.Second})
	begin := time.Now()
	_, err := ctl.RunCommand(context.Background(), input(sandbox.ProjectManaged, "true"), &actor, nil)
	var ce *sandbox.CommandError
	if !errors.As(err, &ce) || ce.Kind != sandbox.KindTransport || ce.Stdout != "partial" {
		t.Fatalf("err = %#v, want a transport error with the partial output", err)
	}
	if d := time.Since(begin); d > 2*time.Second {
		t.Fatalf("settled after %v: drained as if the command had exited", d)
	}
}

// TestWaitDelay: a success whose output a left-behind process kept open
// past the drain bound says so (ErrWaitDelay), and is still a result; one
// whose output closed with its main process does not.
func TestWaitDelay(t *testing.T) {
	dir := t.TempDir()
	p := &sandboxtest.Provider{Kind: sandbox.ProjectHost, Dir: dir}
	ctl := sandbox.NewControl(p, sandbox.ControlOptions{DrainTimeout: 200 * time.Millisecond})
	token := sandboxtest.SleepToken()
	// The grandchild leaves the process group, so nothing kills it, and
	// keeps stdout open; the main process exits once it has left.
	fifo := dir + "/left"
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	script := "echo before; setsid sh -c 'echo > " + fifo + "; exec sleep " + token + "' & read x < " + fifo + "; exit 3"
	res, err := ctl.RunCommand(context.Background(), input(sandbox.ProjectHost, "sh", "-c", script), &actor, nil)
	if err != nil {
		t.Fatalf("RunCommand: %v, want a result", err)
	}
	defer killSleeps(token)
	if !errors.Is(res.OutputErr, sandbox.ErrWaitDelay) {
		t.Errorf("OutputErr = %v, want ErrWaitDelay", res.OutputErr)
	}
	if res.Code == nil || *res.Code != 3 || res.Stdout != "before\n" {
		t.Errorf("result = %+v, want exit 3 and the output written before the cut", res)
	}

	res, err = ctl.RunCommand(context.Background(), input(sandbox.ProjectHost, "sh", "-c", "echo complete; sleep 0.05 & exit 0"), &actor, nil)
	if err != nil || res.OutputErr != nil || res.Stdout != "complete\n" {
		t.Fatalf("complete output: %+v, %v; want no OutputErr", res, err)
	}
}

// killSleeps kills the test's leftover sleeps (found by their token).
func killSleeps(token string) {
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, _ := os.ReadFile("/proc/" + e.Name() + "/cmdline")
		if strings.Contains(string(b), token) {
			if p, err := os.FindProcess(pid); err == nil {
				p.Kill()
			}
		}
	}
}
