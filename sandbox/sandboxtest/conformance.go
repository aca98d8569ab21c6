package sandboxtest

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"testing/iotest"
	"time"

	"github.com/corral-sandbox/corral/sandbox"
)

// Target describes a provider under conformance test.
type Target struct {
	// Control runs commands through the provider under test.
	Control *sandbox.Control
	// Actor is a member of Project allowed to run commands in it.
	Actor sandbox.Actor
	// Project is the project commands run in.
	Project sandbox.ProjectRef
	// Cwd is the working directory commands are given ("" for the
	// provider's default); it must be writable by the command.
	Cwd string
	// HostCwd is Cwd as this test process sees it on the host, to check
	// files the command created or did not create.
	HostCwd string
	// HostPath is a string that the provider's Sanitize must hide, and
	// DisplayPath what it must become. Empty skips the sanitizer checks.
	HostPath, DisplayPath string
	// LiveLeases reports the project's live leases. Nil skips lease checks.
	LiveLeases func(t *testing.T) int
	// Terminal says the provider runs sessions on a terminal
	// (SessionOptions.TTY); false skips the terminal checks.
	Terminal bool
}

func (tg Target) input(argv ...string) sandbox.ExecInput {
	return sandbox.ExecInput{
		Command:   sandbox.Command{Type: sandbox.CommandTypeArgv, File: argv[0], Args: argv[1:]},
		Cwd:       tg.Cwd,
		LeaseKind: sandbox.LeaseTerminal,
		Project:   tg.Project,
	}
}

func (tg Target) run(ctx context.Context, opts *sandbox.RunOptions, argv ...string) (*sandbox.CommandResult, error) {
	a := tg.Actor
	return tg.Control.RunCommand(ctx, tg.input(argv...), &a, opts)
}

func (tg Target) noLiveLeases(t *testing.T) {
	t.Helper()
	if tg.LiveLeases == nil {
		return
	}
	if n := tg.LiveLeases(t); n != 0 {
		t.Errorf("%d live leases remain after the command settled", n)
	}
}

// marker returns a token unique to this test, to find leftover processes.
func marker(t *testing.T) string {
	return fmt.Sprintf("corral-conf-%d-%d", os.Getpid(), time.Now().UnixNano())
}

// SleepToken returns a sleep duration unique to this call ("100.NNN"), so
// that `sleep TOKEN` shows in the command line of its process and can be
// told apart from every other test's sleeps.
func SleepToken() string {
	return fmt.Sprintf("100.%d", time.Now().UnixNano()%1e9)
}

// processesWith lists host processes whose command line contains token.
func processesWith(token string) []string {
	var found []string
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		if e.Name()[0] < '0' || e.Name()[0] > '9' {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil {
			continue
		}
		if strings.Contains(string(b), token) {
			// Ignore zombies: they hold nothing and are being reaped.
			st, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
			if i := strings.LastIndexByte(string(st), ')'); i > 0 && i+2 < len(st) && st[i+2] == 'Z' {
				continue
			}
			found = append(found, e.Name()+": "+strings.ReplaceAll(string(b), "\x00", " "))
		}
	}
	return found
}

// AssertNoProcesses fails t if a host process whose command line contains
// token is still alive a short while after the call.
func AssertNoProcesses(t *testing.T, token string) {
	t.Helper()
	deadline := time.Now().Add(3 * time.Second)
	for {
		left := processesWith(token)
		if len(left) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Errorf("processes left running: %v", left)
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func wantKind(t *testing.T, err error, kind sandbox.ErrorKind) *sandbox.CommandError {
	t.Helper()
	var ce *sandbox.CommandError
	if !errors.As(err, &ce) {
		t.Fatalf("error = %v (%T), want a *CommandError of kind %s", err, err, kind)
	}
	if ce.Kind != kind {
		t.Fatalf("error kind = %s (%v), want %s", ce.Kind, ce, kind)
	}
	return ce
}

// Run runs the conformance suite against tg. Every provider must pass it.
func Run(t *testing.T, tg Target) {
	ctx := context.Background()

	t.Run("Success", func(t *testing.T) {
		res, err := tg.run(ctx, nil, "sh", "-c", "printf out; printf err >&2")
		if err != nil {
			t.Fatal(err)
		}
		if res.Stdout != "out" || res.Stderr != "err" || res.Code == nil || *res.Code != 0 || res.Signal != "" {
			t.Fatalf("result = %+v", res)
		}
		tg.noLiveLeases(t)
	})

	t.Run("NonzeroExitIsAResult", func(t *testing.T) {
		res, err := tg.run(ctx, nil, "sh", "-c", "echo partial; exit 3")
		if err != nil {
			t.Fatal(err)
		}
		if res.Code == nil || *res.Code != 3 || res.Signal != "" || res.Stdout != "partial\n" {
			t.Fatalf("result = %+v, want code 3", res)
		}
		tg.noLiveLeases(t)
	})

	t.Run("SignalDeathHasNoCode", func(t *testing.T) {
		res, err := tg.run(ctx, nil, "sh", "-c", "kill -TERM $$")
		if err != nil {
			t.Fatal(err)
		}
		if res.Code != nil || res.Signal != "SIGTERM" {
			t.Fatalf("result = code %v signal %q, want signal SIGTERM and no code", res.Code, res.Signal)
		}
	})

	t.Run("MissingProgramIsStartError", func(t *testing.T) {
		_, err := tg.run(ctx, nil, "/nonexistent/corral-no-such-program")
		wantKind(t, err, sandbox.KindStart)
		tg.noLiveLeases(t)
	})

	t.Run("Timeout", func(t *testing.T) {
		tok := SleepToken()
		_, err := tg.run(ctx, &sandbox.RunOptions{Timeout: 500 * time.Millisecond},
			"sh", "-c", "echo before; sleep "+tok+" & sleep "+tok+"; echo done")
		ce := wantKind(t, err, sandbox.KindTimeout)
		if ce.Stdout != "before\n" {
			t.Errorf("partial stdout = %q, want %q", ce.Stdout, "before\n")
		}
		AssertNoProcesses(t, "sleep "+tok)
		tg.noLiveLeases(t)
	})

	t.Run("AbortAfterStart", func(t *testing.T) {
		// Cancelled once the command has written (not after a fixed delay:
		// on a loaded host the start alone can outlast any delay).
		actx, cancel := context.WithCancel(ctx)
		defer cancel()
		var seen strings.Builder
		opts := &sandbox.RunOptions{OnOutput: func(s sandbox.Stream, p []byte) {
			if s != sandbox.Stdout {
				return
			}
			seen.Write(p) // one stream: calls are never concurrent
			if strings.Contains(seen.String(), "started\n") {
				cancel()
			}
		}}
		_, err := tg.run(actx, opts, "sh", "-c", "echo started; exec sleep 100")
		ce := wantKind(t, err, sandbox.KindAbort)
		if ce.Stdout != "started\n" {
			t.Errorf("partial stdout = %q (%v)", ce.Stdout, ce)
		}
		tg.noLiveLeases(t)
	})

	t.Run("AbortBeforeStartNeverStarts", func(t *testing.T) {
		if tg.HostCwd == "" {
			t.Skip("no host view of the working directory")
		}
		actx, cancel := context.WithCancel(ctx)
		cancel()
		name := "never-" + marker(t)
		called := false
		_, err := tg.run(actx, &sandbox.RunOptions{OnStart: func(sandbox.StartInfo) error { called = true; return nil }},
			"touch", name)
		wantKind(t, err, sandbox.KindAbort)
		if called {
			t.Error("OnStart was called for a pre-cancelled context")
		}
		if _, err := os.Stat(filepath.Join(tg.HostCwd, name)); err == nil {
			t.Error("the command ran despite a pre-cancelled context")
		}
		tg.noLiveLeases(t)
	})

	t.Run("StdoutOverflow", func(t *testing.T) {
		_, err := tg.run(ctx, &sandbox.RunOptions{OutputLimit: sandbox.OutputLimit{Stdout: 1000}},
			"sh", "-c", "head -c 100000 /dev/zero | tr '\\0' a; sleep 100")
		ce := wantKind(t, err, sandbox.KindOverflow)
		if len(ce.Stdout) != 1000 || strings.Trim(ce.Stdout, "a") != "" {
			t.Errorf("partial stdout has %d bytes, want exactly the 1000-byte limit", len(ce.Stdout))
		}
		tg.noLiveLeases(t)
	})

	t.Run("CombinedOverflow", func(t *testing.T) {
		_, err := tg.run(ctx, &sandbox.RunOptions{OutputLimit: sandbox.OutputLimit{Combined: 100}},
			"sh", "-c", "printf '%060d' 0; printf '%060d' 0 >&2; sleep 100")
		ce := wantKind(t, err, sandbox.KindOverflow)
		if n := len(ce.Stdout) + len(ce.Stderr); n != 100 {
			t.Errorf("partial output has %d bytes, want the combined limit 100", n)
		}
		tg.noLiveLeases(t)
	})

	t.Run("OnStartFailure", func(t *testing.T) {
		boom := errors.New("boom")
		var info sandbox.StartInfo
		tok := marker(t)
		_, err := tg.run(ctx, &sandbox.RunOptions{OnStart: func(si sandbox.StartInfo) error { info = si; return boom }},
			"sh", "-c", "echo "+tok)
		ce := wantKind(t, err, sandbox.KindStart)
		if !errors.Is(err, boom) {
			t.Errorf("error %v does not wrap the OnStart error", err)
		}
		if ce.Stdout != "" {
			t.Errorf("command ran: stdout %q", ce.Stdout)
		}
		if info.LeaseID == "" || info.Project != tg.Project {
			t.Errorf("StartInfo = %+v", info)
		}
		tg.noLiveLeases(t)
	})

	t.Run("DecodeKeepsNULAndReplacesInvalidUTF8", func(t *testing.T) {
		res, err := tg.run(ctx, nil, "printf", "a\\377b\\000c\\n")
		if err != nil {
			t.Fatal(err)
		}
		if want := "a\uFFFDb\x00c\n"; res.Stdout != want {
			t.Fatalf("stdout = %q, want %q", res.Stdout, want)
		}
	})

	t.Run("GrandchildHoldingStdoutDoesNotHang", func(t *testing.T) {
		start := time.Now()
		res, err := tg.run(ctx, &sandbox.RunOptions{Timeout: 20 * time.Second},
			"sh", "-c", "setsid sleep 77 & echo done")
		if err != nil {
			t.Fatal(err)
		}
		if res.Stdout != "done\n" || res.Code == nil || *res.Code != 0 {
			t.Fatalf("result = %+v", res)
		}
		if d := time.Since(start); d > 15*time.Second {
			t.Fatalf("call took %v: the drain is not bounded", d)
		}
		tg.noLiveLeases(t)
	})

	t.Run("StdinIsEmpty", func(t *testing.T) {
		res, err := tg.run(ctx, &sandbox.RunOptions{Timeout: 5 * time.Second}, "cat")
		if err != nil {
			t.Fatal(err)
		}
		if res.Stdout != "" || *res.Code != 0 {
			t.Fatalf("result = %+v", res)
		}
	})

	t.Run("SanitizerAppliesToResultsAndPartialOutput", func(t *testing.T) {
		if tg.HostPath == "" {
			t.Skip("target declares no host path to hide")
		}
		res, err := tg.run(ctx, nil, "echo", "at "+tg.HostPath+"/x")
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(res.Stdout, tg.HostPath) || !strings.Contains(res.Stdout, tg.DisplayPath+"/x") {
			t.Errorf("stdout = %q: host path not sanitized to %q", res.Stdout, tg.DisplayPath)
		}
		_, err = tg.run(ctx, &sandbox.RunOptions{Timeout: 300 * time.Millisecond},
			"sh", "-c", "echo at "+tg.HostPath+" >&2; exec sleep 100")
		ce := wantKind(t, err, sandbox.KindTimeout)
		if strings.Contains(ce.Stderr, tg.HostPath) || !strings.Contains(ce.Stderr, tg.DisplayPath) {
			t.Errorf("partial stderr = %q: host path not sanitized", ce.Stderr)
		}
	})

	t.Run("EnvReachesCommandOverDefaults", func(t *testing.T) {
		in := tg.input("sh", "-c", `printf '%s|%s' "$CORRAL_CONF_VAR" "$LANG"`)
		in.Env = map[string]string{"CORRAL_CONF_VAR": "a b=c\n'\"", "LANG": "C"}
		a := tg.Actor
		res, err := tg.Control.RunCommand(ctx, in, &a, nil)
		if err != nil {
			t.Fatal(err)
		}
		if want := "a b=c\n'\"|C"; res.Stdout != want {
			t.Fatalf("stdout = %q, want %q", res.Stdout, want)
		}
	})

	t.Run("BadEnvRefusedBeforePreparation", func(t *testing.T) {
		for _, env := range []map[string]string{
			{"1X": "v"}, {"A=B": "v"}, {"": "v"}, {"A-B": "v"}, {"A\x00": "v"}, {"A": "v\x00"},
			{"BIG": strings.Repeat("x", sandbox.MaxEnvBytes)},
		} {
			in := tg.input("true")
			in.Env = env
			a := tg.Actor
			_, err := tg.Control.RunCommand(ctx, in, &a, nil)
			wantKind(t, err, sandbox.KindPrepare)
		}
		tg.noLiveLeases(t)
	})

	t.Run("StdinStreamsLarge", func(t *testing.T) {
		const size = 10 << 20
		h := sha256.New()
		src := io.TeeReader(io.LimitReader(newPattern(), size), h)
		res, err := tg.run(ctx, &sandbox.RunOptions{Timeout: 30 * time.Second, Stdin: src}, "sha256sum")
		if err != nil {
			t.Fatal(err)
		}
		want := hex.EncodeToString(h.Sum(nil))
		if got, _, _ := strings.Cut(res.Stdout, " "); got != want {
			t.Fatalf("sha256 inside = %q, want %s", res.Stdout, want)
		}
	})

	t.Run("StdinAndLiveOutputInteract", func(t *testing.T) {
		// The command answers a line of input before it gets the next:
		// stdin is streamed, and output reaches OnOutput while the
		// command runs (a buffered input or output would deadlock here
		// until the timeout).
		inR, inW := io.Pipe()
		var mu sync.Mutex
		var live strings.Builder
		sent := false
		opts := &sandbox.RunOptions{Timeout: 10 * time.Second, Stdin: inR, OnOutput: func(s sandbox.Stream, p []byte) {
			if s != sandbox.Stdout {
				return
			}
			mu.Lock()
			defer mu.Unlock()
			live.Write(p)
			if !sent && strings.Contains(live.String(), "got 1\n") {
				sent = true
				go func() {
					_, _ = io.WriteString(inW, "2\n")
					inW.Close()
				}()
			}
		}}
		go func() { _, _ = io.WriteString(inW, "1\n") }()
		res, err := tg.run(ctx, opts, "sh", "-c", `read x; echo "got $x"; read y; echo "got $y"; cat`)
		inW.Close()
		if err != nil {
			t.Fatal(err)
		}
		mu.Lock()
		defer mu.Unlock()
		if res.Stdout != "got 1\ngot 2\n" || live.String() != res.Stdout {
			t.Fatalf("stdout = %q, live %q", res.Stdout, live.String())
		}
	})

	t.Run("StdinReadErrorIsTransport", func(t *testing.T) {
		boom := errors.New("boom")
		src := io.MultiReader(strings.NewReader("x\n"), iotest.ErrReader(boom))
		_, err := tg.run(ctx, &sandbox.RunOptions{Timeout: 10 * time.Second, Stdin: src}, "sh", "-c", "cat; sleep 100")
		wantKind(t, err, sandbox.KindTransport)
		if !errors.Is(err, boom) {
			t.Errorf("error %v does not wrap the read error", err)
		}
		tg.noLiveLeases(t)
	})

	t.Run("StdinCommandIgnoringInputDoesNotBlock", func(t *testing.T) {
		// An endless input the command never reads ends with the command.
		res, err := tg.run(ctx, &sandbox.RunOptions{Timeout: 10 * time.Second, Stdin: newPattern()}, "echo", "ok")
		if err != nil || res.Stdout != "ok\n" {
			t.Fatalf("res %+v err %v", res, err)
		}
	})

	t.Run("LiveOutputRespectsLimits", func(t *testing.T) {
		var live strings.Builder
		_, err := tg.run(ctx, &sandbox.RunOptions{OutputLimit: sandbox.OutputLimit{Stdout: 4},
			OnOutput: func(_ sandbox.Stream, p []byte) { live.Write(p) }}, "sh", "-c", "echo 123456789")
		ce := wantKind(t, err, sandbox.KindOverflow)
		if live.String() != "1234" || ce.Stdout != "1234" {
			t.Fatalf("live %q, partial %q", live.String(), ce.Stdout)
		}
	})

	t.Run("RawOutputIsBinarySafe", func(t *testing.T) {
		res, err := tg.run(ctx, &sandbox.RunOptions{RawOutput: true}, "printf", "\\377\\376\\000x")
		if err != nil {
			t.Fatal(err)
		}
		if res.Stdout != "\xff\xfe\x00x" {
			t.Fatalf("stdout = %q", res.Stdout)
		}
	})

	t.Run("LiveOutputIsSanitized", func(t *testing.T) {
		if tg.HostPath == "" {
			t.Skip("target declares no host path to hide")
		}
		// The path arrives in two writes; neither piece may leak.
		first := tg.HostPath[:len(tg.HostPath)-2]
		rest := tg.HostPath[len(tg.HostPath)-2:]
		var mu sync.Mutex
		var chunks []string
		res, err := tg.run(ctx, &sandbox.RunOptions{OnOutput: func(s sandbox.Stream, p []byte) {
			mu.Lock()
			chunks = append(chunks, string(p))
			mu.Unlock()
		}}, "sh", "-c", `printf 'at %s' "$0"; sleep 0.3; printf '%s/x\n' "$1"`, first, rest)
		if err != nil {
			t.Fatal(err)
		}
		mu.Lock()
		defer mu.Unlock()
		joined := strings.Join(chunks, "")
		if strings.Contains(joined, first) || joined != res.Stdout || !strings.Contains(joined, tg.DisplayPath+"/x") {
			t.Fatalf("live chunks %q (result %q): host path not hidden as %q", chunks, res.Stdout, tg.DisplayPath)
		}
	})

	t.Run("NoActorRefused", func(t *testing.T) {
		_, err := tg.Control.RunCommand(ctx, tg.input("true"), nil, nil)
		wantKind(t, err, sandbox.KindPrepare)
		if !errors.Is(err, sandbox.ErrNoActor) {
			t.Errorf("error %v is not ErrNoActor", err)
		}
	})

	t.Run("TurnScopeActor", func(t *testing.T) {
		res, err := tg.Control.RunCommand(sandbox.WithTurn(ctx, tg.Actor), tg.input("true"), nil, nil)
		if err != nil || *res.Code != 0 {
			t.Fatalf("res %+v err %v", res, err)
		}
	})

	t.Run("SessionStreamsAndExit", func(t *testing.T) {
		a := tg.Actor
		s, err := tg.Control.Open(ctx, tg.input("sh", "-c", "cat; echo err >&2; exit 3"), &a, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close(ctx)
		out, errOut := readAsync(s.Stdout), readAsync(s.Stderr)
		if _, err := io.WriteString(s.Stdin, "ping\n"); err != nil {
			t.Fatal(err)
		}
		s.Stdin.Close()
		exit, err := s.Wait()
		if err != nil || exit.Code == nil || *exit.Code != 3 {
			t.Fatalf("Wait = %+v, %v; want code 3", exit, err)
		}
		if o, e := <-out, <-errOut; o != "ping\n" || e != "err\n" {
			t.Errorf("stdout %q stderr %q", o, e)
		}
		tg.noLiveLeases(t)
	})

	t.Run("SessionCallerGoesAway", func(t *testing.T) {
		// The caller stops reading a flood and closes: nothing of the
		// tree survives, no lease either.
		a := tg.Actor
		token := SleepToken()
		s, err := tg.Control.Open(ctx, tg.input("sh", "-c", "sleep "+token+" & while :; do echo flood; done"), &a, nil)
		if err != nil {
			t.Fatal(err)
		}
		buf := make([]byte, 64)
		if _, err := io.ReadFull(s.Stdout, buf); err != nil {
			t.Fatal(err)
		}
		if err := s.Close(ctx); err != nil {
			t.Fatalf("Close: %v", err)
		}
		wantKind(t, second(s.Wait()), sandbox.KindAbort)
		AssertNoProcesses(t, token)
		tg.noLiveLeases(t)
	})

	t.Run("SessionTerminal", func(t *testing.T) {
		if !tg.Terminal {
			t.Skip("the target has no terminals")
		}
		a := tg.Actor
		s, err := tg.Control.Open(ctx, tg.input("sh", "-c", "test -t 0 && test -t 1 && test -t 2 && echo is-tty; stty size; read x; stty size; exit 4"), &a,
			&sandbox.SessionOptions{TTY: &sandbox.TTYSize{Rows: 30, Cols: 100}})
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close(ctx)
		errOut := readAsync(s.Stderr)
		var got strings.Builder
		buf := make([]byte, 4096)
		await := func(want string) {
			t.Helper()
			for !strings.Contains(got.String(), want) {
				n, err := s.Stdout.Read(buf)
				got.Write(buf[:n])
				if err != nil {
					t.Fatalf("waiting for %q in %q: %v", want, got.String(), err)
				}
			}
		}
		await("30 100")
		if !strings.Contains(got.String(), "is-tty") {
			t.Fatalf("terminal output %q", got.String())
		}
		if err := s.Resize(40, 120); err != nil {
			t.Fatal(err)
		}
		io.WriteString(s.Stdin, "go\r")
		await("40 120")
		go io.Copy(io.Discard, s.Stdout)
		exit, err := s.Wait()
		if err != nil || exit.Code == nil || *exit.Code != 4 {
			t.Fatalf("Wait = %+v, %v; want code 4", exit, err)
		}
		if e := <-errOut; e != "" {
			t.Errorf("a terminal session's stderr: %q", e)
		}
		tg.noLiveLeases(t)
	})

	t.Run("WrongProjectKindRefused", func(t *testing.T) {
		in := tg.input("true")
		if in.Project.Kind == sandbox.ProjectHost {
			in.Project.Kind = sandbox.ProjectManaged
		} else {
			in.Project.Kind = sandbox.ProjectHost
		}
		a := tg.Actor
		_, err := tg.Control.RunCommand(ctx, in, &a, nil)
		wantKind(t, err, sandbox.KindPrepare)
		tg.noLiveLeases(t)
	})
}

// pattern is an endless, cheap, non-repeating-looking byte stream.
type pattern struct{ x uint64 }

func newPattern() *pattern { return &pattern{x: 0x9e3779b97f4a7c15} }

func (p *pattern) Read(b []byte) (int, error) {
	for i := range b {
		p.x ^= p.x << 13
		p.x ^= p.x >> 7
		p.x ^= p.x << 17
		b[i] = byte(p.x)
	}
	return len(b), nil
}

// readAsync reads r to its end on a goroutine of its own.
func readAsync(r io.Reader) <-chan string {
	c := make(chan string, 1)
	go func() {
		var b strings.Builder
		_, _ = io.Copy(&b, r)
		c <- b.String()
	}()
	return c
}

func second[T any](_ T, err error) error { return err }
