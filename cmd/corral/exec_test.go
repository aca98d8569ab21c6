package main

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// tmux runs tmux on a server of the test's own.
func tmux(t *testing.T, sock string, args ...string) string {
	t.Helper()
	out, err := exec.Command("tmux", append([]string{"-S", sock}, args...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("tmux %v: %v: %s", args, err, out)
	}
	return string(out)
}

// awaitPane waits until the pane shows want; it returns the pane.
func awaitPane(t *testing.T, sock, want string) string {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		pane := tmux(t, sock, "capture-pane", "-p", "-t", "x")
		if strings.Contains(pane, want) {
			return pane
		}
		if time.Now().After(deadline) {
			t.Fatalf("the pane never showed %q:\n%s", want, pane)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestExecTTYUnderTmux drives `corral exec -it --project DIR -- sh` on a
// real terminal (a tmux pane of 80 × 24): the shell in the machine shows a
// prompt, runs on the machine's /dev/pts at the pane's size, follows a
// resize of the pane, and its `exit 3` is corral's exit status.
func TestExecTTYUnderTmux(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("managed projects need root (CI runs as root)")
	}
	if _, err := exec.LookPath("tmux"); err != nil {
		t.Skip("no tmux (apt-get install tmux)")
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	ws := filepath.Join(dir, "proj")
	if err := os.Mkdir(ws, 0o755); err != nil {
		t.Fatal(err)
	}
	sock, status := filepath.Join(dir, "tmux.sock"), filepath.Join(dir, "status")
	script := filepath.Join(dir, "run.sh")
	if err := os.WriteFile(script, []byte("#!/bin/sh\nCORRAL_TEST_AS_MAIN=1 \"$1\" exec -i -t --state \"$2\" --project \"$3\" -- sh\necho $? > \"$4\"\nsleep 60\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	tmux(t, sock, "new-session", "-d", "-s", "x", "-x", "80", "-y", "24", script, self, filepath.Join(dir, "state"), ws, status)
	t.Cleanup(func() { _ = exec.Command("tmux", "-S", sock, "kill-server").Run() })
	t.Cleanup(func() { stopSharedWorker(t, filepath.Join(dir, "state")) })

	awaitPane(t, sock, "$") // the prompt (capture-pane trims its space)
	tmux(t, sock, "send-keys", "-t", "x", "tty; stty size; echo mark-$((40+2))", "Enter")
	pane := awaitPane(t, sock, "mark-42")
	if !strings.Contains(pane, "/dev/pts/") || !strings.Contains(pane, "24 80") {
		t.Fatalf("pane:\n%s", pane)
	}
	tmux(t, sock, "resize-window", "-t", "x", "-x", "100", "-y", "30")
	// The resize travels (tmux → SIGWINCH → corral exec → the machine's
	// terminal) while the keys are typed: ask again until it arrived.
	for i := 0; ; i++ {
		tmux(t, sock, "send-keys", "-t", "x", fmt.Sprintf("stty size; echo mark-$((%d+1))", 100+i), "Enter")
		pane := awaitPane(t, sock, fmt.Sprintf("mark-%d", 101+i))
		if strings.Contains(pane, "30 100") {
			break
		}
		if i == 50 {
			t.Fatalf("after the resize:\n%s", pane)
		}
		time.Sleep(100 * time.Millisecond)
	}
	tmux(t, sock, "send-keys", "-t", "x", "exit 3", "Enter")
	deadline := time.Now().Add(30 * time.Second)
	for {
		b, err := os.ReadFile(status)
		if err == nil && strings.HasSuffix(string(b), "\n") {
			if got := strings.TrimSpace(string(b)); got != "3" {
				t.Fatalf("corral exec exited %s, want 3", got)
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("corral exec did not exit:\n%s", tmux(t, sock, "capture-pane", "-p", "-t", "x"))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestExecViaDaemon: `corral exec --daemon` over the WebSocket session API,
// in a host project: the exit status passes through, and -t gives the
// command a terminal (a host pty) of the default size when corral's own
// output is not one.
func TestExecViaDaemon(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: host commands are confined by corral's Landlock helper")
	}
	state, err := os.MkdirTemp("", "cx")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(state)
	mustCLI(t, "account", "create", "alice", "--state", state)
	tok := mustCLI(t, "token", "create", "alice", "--state", state)
	root := t.TempDir()
	id := mustCLI(t, "project", "create", "web", "--host", root, "--owner", "alice", "--state", state)
	sock := startDaemon(t, state)

	out, errs, status := cli("exec", "--daemon", sock, "--project-id", id, "--token", tok, "-e", "GREETING=hi=there", "--",
		"sh", "-c", "echo $GREETING; echo err >&2; exit 4")
	if status != 4 || out != "hi=there\n" || errs != "err\n" {
		t.Fatalf("exec: %d %q %q", status, out, errs)
	}
	// -e is the session's environment (&env=), not an env(1) wrapper: a
	// program whose name holds '=' runs as itself.
	if err := os.WriteFile(filepath.Join(root, "say=hi"), []byte("#!/bin/sh\necho \"$WHO\"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	out, errs, status = cli("exec", "--daemon", sock, "--project-id", id, "--token", tok, "-e", "WHO=alice", "--", "./say=hi")
	if status != 0 || out != "alice\n" {
		t.Fatalf("exec ./say=hi: %d %q %q", status, out, errs)
	}
	out, errs, status = cli("exec", "-t", "--daemon", sock, "--project-id", id, "--token", tok, "--",
		"sh", "-c", "tty; stty size; test -t 2 && echo tty-err >&2; exit 3")
	if status != 3 || !strings.HasPrefix(out, "/dev/pts/") || !strings.Contains(out, "24 80") || !strings.Contains(out, "tty-err") || errs != "" {
		t.Fatalf("exec -t: %d %q %q", status, out, errs)
	}
	_, errs, status = cli("exec", "--daemon", sock, "--project-id", id, "--token", tok, "--", "sh", "-c", "kill -TERM $$")
	if status != 128+15 {
		t.Fatalf("a command killed by SIGTERM: %d %q", status, errs)
	}
}

// -e reaches a --project session as its environment (ExecInput.Env: values
// may hold '=', and the program is not wrapped); a bad name is refused
// before anything starts.
func TestExecProjectEnv(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("managed projects need root (CI runs as root)")
	}
	// The shared worker is this test binary run as corral.
	t.Setenv("CORRAL_TEST_AS_MAIN", "1")
	state := t.TempDir()
	ws := filepath.Join(t.TempDir(), "proj")
	if err := os.Mkdir(ws, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { stopSharedWorker(t, state) })
	out, errs, status := cli("exec", "--state", state, "--project", ws, "-e", "FOO=a=b", "-e", "X_1=2", "--",
		"sh", "-c", `printf '%s %s' "$FOO" "$X_1"; exit 4`)
	if status != 4 || out != "a=b 2" {
		t.Fatalf("exec -e: %d %q %q", status, out, errs)
	}
	if _, errs, status := cli("exec", "--state", state, "--project", ws, "-e", "1BAD=x", "--", "true"); status != 125 || !strings.Contains(errs, "valid name") {
		t.Fatalf("exec -e 1BAD=x: %d %q", status, errs)
	}
}

// TestExecTTYWithoutTerminal: `corral exec -it` whose stdin is not a
// terminal refuses at once with Docker's message, before it starts
// anything (before: a prompt, then a wait forever).
func TestExecTTYWithoutTerminal(t *testing.T) {
	state, ws := t.TempDir(), t.TempDir()
	cmd := exec.Command(os.Args[0], "exec", "-it", "--state", state, "--project", ws, "--", "sh")
	cmd.Env = append(os.Environ(), "CORRAL_TEST_AS_MAIN=1")
	cmd.Stdin = strings.NewReader("echo hi\n")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	err := cmd.Run()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 125 || stderr.String() != "corral: the input device is not a TTY\n" {
		t.Fatalf("exec -it with a pipe: %v %q", err, stderr.String())
	}
	if _, err := os.Stat(filepath.Join(state, sharedSocket)); err == nil {
		t.Error("a worker was started")
	}
}
