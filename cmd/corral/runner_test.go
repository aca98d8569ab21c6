package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"github.com/corral-sandbox/corral/internal/pgtest"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/corral-sandbox/corral/runner"
	"github.com/corral-sandbox/corral/sandbox"
	"github.com/corral-sandbox/corral/store"
)

// TestRunnerFlags: flag errors are refused before anything is opened.
func TestRunnerFlags(t *testing.T) {
	for _, args := range [][]string{{"--lease-ttl", "-1s"}, {"extra"}, {"--nope"}} {
		cmd := newRunnerCmd()
		cmd.SetArgs(append([]string{"--state", t.TempDir()}, args...))
		cmd.SetOut(&bytes.Buffer{})
		cmd.SetErr(&bytes.Buffer{})
		cmd.SilenceUsage, cmd.SilenceErrors = true, true
		if err := cmd.Execute(); err == nil {
			t.Errorf("corral runner %q succeeded", args)
		}
	}
}

// TestRunnerCLI runs the real `corral runner` (this test binary as corral)
// on a host-project job and reads its raw stdout: one pinned JSON line per
// command, exit status 0.
func TestRunnerCLI(t *testing.T) {
	if c, _, err := newRoot().Find([]string{"runner"}); err != nil || c.Name() != "runner" {
		t.Skip("`corral runner` is not added to the root command yet (addCommands in reexec.go)")
	}
	for _, backend := range []string{store.SchemeSQLite, store.SchemePostgres} {
		t.Run(backend, func(t *testing.T) {
			ctx := context.Background()
			state, root := t.TempDir(), t.TempDir()
			url := store.DefaultURL(state)
			if backend == store.SchemePostgres {
				url = pgtest.NewDatabase(t)
			}
			st, err := store.Open(ctx, url, store.Options{Migrate: true})
			if err != nil {
				t.Fatal(err)
			}
			acct, err := st.CreateAccount(ctx, "alice")
			if err != nil {
				t.Fatal(err)
			}
			proj, err := st.CreateProject(ctx, store.NewProject{Kind: store.ProjectHost, Name: "h", Root: root})
			if err != nil {
				t.Fatal(err)
			}
			if _, err := st.AddMember(ctx, store.Member{Project: proj.ID, Account: acct.ID, Role: store.RoleOwner}); err != nil {
				t.Fatal(err)
			}
			st.Close()

			argv := func(file string, args ...string) runner.JobCommand {
				return runner.JobCommand{Command: sandbox.Command{Type: "argv", File: file, Args: args}, Cwd: root}
			}
			timeout := argv("sleep", "30")
			timeout.TimeoutMs = 200
			job := runner.Job{
				Actor:    sandbox.Actor{AccountUserID: acct.ID},
				Project:  sandbox.ProjectRef{Kind: sandbox.ProjectHost, ProjectID: proj.ID},
				Commands: []runner.JobCommand{argv("echo", "hi"), argv("sh", "-c", "echo no >&2; exit 3"), timeout},
			}

			cmd := exec.Command(os.Args[0], "runner", "--state", state, "--store", url, "--lease-ttl", "3s")
			cmd.Env = append(os.Environ(), "CORRAL_TEST_AS_MAIN=1")
			var stderr bytes.Buffer
			cmd.Stderr = &stderr
			stdin, err := cmd.StdinPipe()
			if err != nil {
				t.Fatal(err)
			}
			stdout, err := cmd.StdoutPipe()
			if err != nil {
				t.Fatal(err)
			}
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			defer cmd.Process.Kill()
			if err := json.NewEncoder(stdin).Encode(job); err != nil {
				t.Fatal(err)
			}
			// stdin stays open: EOF would mean the parent is gone.
			var lines []string
			sc := bufio.NewScanner(stdout)
			for sc.Scan() {
				lines = append(lines, sc.Text())
			}
			err = cmd.Wait()
			stdin.Close()
			if err != nil {
				t.Fatalf("corral runner: %v; stderr:\n%s", err, stderr.String())
			}
			if len(lines) != 3 {
				t.Fatalf("%d lines, want 3: %q", len(lines), lines)
			}
			if lines[0] != `{"stdout":"hi\n","stderr":"","code":0,"signal":null}` {
				t.Errorf("line 1 = %s", lines[0])
			}
			if lines[1] != `{"stdout":"","stderr":"no\n","code":3,"signal":null}` {
				t.Errorf("line 2 = %s", lines[1])
			}
			if !strings.HasPrefix(lines[2], `{"error":{"kind":"timeout","message":`) {
				t.Errorf("line 3 = %s", lines[2])
			}

			// A descriptor that holds no worker connection is refused: exit 1.
			bad := exec.Command(os.Args[0], "runner", "--state", state, "--worker-fd", "200")
			bad.Env = cmd.Env
			bad.Stdin = strings.NewReader("")
			out, err := bad.CombinedOutput()
			if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != runner.ExitFailure || !strings.Contains(string(out), "descriptor 200") {
				t.Errorf("--worker-fd 200: %v %s", err, out)
			}
		})
	}
}
