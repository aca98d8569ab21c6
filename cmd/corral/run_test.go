package main

import (
	"bytes"
	"encoding/json"
	"github.com/corral-sandbox/corral/internal/pgtest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/corral-sandbox/corral/sandbox/sandboxtest"
)

func TestMain(m *testing.M) {
	reexec()
	if os.Getenv("CORRAL_TEST_AS_MAIN") == "1" {
		main()
	}
	os.Exit(pgtest.Main(m))
}

// corral runs the CLI in-process with a private state directory.
func corral(t *testing.T, state string, args ...string) (stdout, stderr string, status int) {
	t.Helper()
	t.Cleanup(func() { stopSharedWorker(t, state) })
	var out, errb bytes.Buffer
	status = execute(append([]string{"run", "--state", state}, args...), &out, &errb)
	return out.String(), errb.String(), status
}

func TestRunHostContract(t *testing.T) {
	state, dir := t.TempDir(), t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "data.txt"), []byte("not a program"), 0o644); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name       string
		args       []string
		status     int
		stdout     string
		stderrHas  string
		jsonKind   string
		jsonCode   *int
		jsonSignal string
		reason     string
	}{
		{name: "success", args: []string{"--", "sh", "-c", "printf out; printf err >&2"}, status: 0, stdout: "out", stderrHas: "err"},
		{name: "nonzero", args: []string{"--", "sh", "-c", "exit 7"}, status: 7},
		{name: "signal", args: []string{"--", "sh", "-c", "kill -TERM $$"}, status: 128 + 15},
		{name: "timeout", args: []string{"--timeout", "300ms", "--", "sh", "-c", "echo partial; sleep 10"}, status: 124, stdout: "partial\n", stderrHas: "corral: timeout: "},
		{name: "start", args: []string{"--", "/no/such/program"}, status: 127, stderrHas: "corral: start: fork/exec /no/such/program: no such file or directory\n", jsonKind: "start", reason: "notFound"},
		{name: "startNotInPath", args: []string{"--", "no-such-program"}, status: 127, stderrHas: "corral: start: ", jsonKind: "start", reason: "notFound"},
		{name: "startNotExecutable", args: []string{"--", "./data.txt"}, status: 126, stderrHas: "corral: start: ", jsonKind: "start", reason: "notExecutable"},
		{name: "overflow", args: []string{"--stdout-limit", "4B", "--", "sh", "-c", "echo 123456789"}, status: 125, stdout: "1234", stderrHas: "corral: overflow: "},
		{name: "combinedOverflow", args: []string{"--combined-limit", "1KiB", "--", "yes"}, status: 125, stderrHas: "corral: overflow: "},
		{name: "exclusiveLimits", args: []string{"--combined-limit", "1KiB", "--stdout-limit", "1KiB", "--", "true"}, status: 125, stderrHas: "corral: prepare: "},
		{name: "badLeaseKind", args: []string{"--lease-kind", "root", "--", "true"}, status: 125, stderrHas: "corral: prepare: "},
		{name: "badSize", args: []string{"--stdout-limit", "lots", "--", "true"}, status: 2, stderrHas: "invalid size"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			args := append([]string{"--host", dir}, tc.args...)
			out, errs, status := corral(t, state, args...)
			if status != tc.status {
				t.Fatalf("status = %d, want %d (stderr %q)", status, tc.status, errs)
			}
			if tc.stdout != "" && out != tc.stdout {
				t.Errorf("stdout = %q, want %q", out, tc.stdout)
			}
			if !strings.Contains(errs, tc.stderrHas) {
				t.Errorf("stderr = %q, want it to contain %q", errs, tc.stderrHas)
			}
			if tc.status == 2 {
				return
			}
			// The same run with --json: one object, same status.
			out, _, jstatus := corral(t, state, append([]string{"--json"}, args...)...)
			if jstatus != tc.status {
				t.Errorf("--json status = %d, want %d", jstatus, tc.status)
			}
			dec := json.NewDecoder(strings.NewReader(out))
			var obj map[string]json.RawMessage
			if err := dec.Decode(&obj); err != nil {
				t.Fatalf("--json stdout %q: %v", out, err)
			}
			if dec.More() {
				t.Fatalf("--json wrote more than one object: %q", out)
			}
			if e, ok := obj["error"]; ok {
				var body struct {
					Kind, Message, Stdout, Stderr, Reason string
				}
				if err := json.Unmarshal(e, &body); err != nil || body.Kind == "" || body.Message == "" || body.Reason != tc.reason {
					t.Fatalf("error object %s", e)
				}
				if strings.Contains(body.Message, "\n") || strings.Count(body.Message, "could not be started") > 0 {
					t.Errorf("message stacks its layers: %q", body.Message)
				}
				if tc.status == 0 || (tc.status < 124 && tc.status != 2) || tc.status > 127 {
					t.Fatalf("unexpected error object %s", e)
				}
				if tc.stdout != "" && body.Stdout != tc.stdout {
					t.Errorf("error stdout = %q", body.Stdout)
				}
				for _, k := range []string{"code", "signal"} {
					if _, has := obj[k]; has {
						t.Errorf("error object carries %q", k)
					}
				}
				return
			}
			for _, k := range []string{"stdout", "stderr", "code", "signal"} {
				if _, ok := obj[k]; !ok {
					t.Errorf("result lacks %q: %s", k, out)
				}
			}
			if tc.name == "signal" && (string(obj["code"]) != "null" || string(obj["signal"]) != `"SIGTERM"`) {
				t.Errorf("signal result: %s", out)
			}
			if tc.name == "nonzero" && (string(obj["code"]) != "7" || string(obj["signal"]) != "null") {
				t.Errorf("nonzero result: %s", out)
			}
		})
	}
}

func TestRunHostConfined(t *testing.T) {
	state, dir := t.TempDir(), t.TempDir()
	outside := filepath.Join(t.TempDir(), "escape")
	_, errs, status := corral(t, state, "--host", dir, "--", "sh", "-c", "echo x > inside && echo y > "+outside)
	if status == 0 {
		t.Fatalf("write outside the project succeeded (stderr %q)", errs)
	}
	if _, err := os.Stat(filepath.Join(dir, "inside")); err != nil {
		t.Errorf("write inside the project failed: %v", err)
	}
	if _, err := os.Stat(outside); err == nil {
		t.Errorf("file outside the project was written")
	}
	// cwd escaping the project is refused before anything runs.
	_, errs, status = corral(t, state, "--host", dir, "--cwd", dir+"/..", "--", "true")
	if status != 125 || !strings.Contains(errs, "corral: prepare:") {
		t.Errorf("cwd escape: status %d stderr %q", status, errs)
	}
}

// TestRunInterruptAborts sends SIGINT to a real corral process: the command
// is aborted, its process group is killed, and corral exits 130 as a shell's
// command interrupted by Ctrl-C would.
func TestRunInterruptAborts(t *testing.T) {
	state, dir := t.TempDir(), t.TempDir()
	tok := sandboxtest.SleepToken()
	cmd := exec.Command(os.Args[0], "run", "--state", state, "--json", "--host", dir, "--",
		"sh", "-c", "echo ready; sleep "+tok+" & sleep "+tok)
	cmd.Env = append(os.Environ(), "CORRAL_TEST_AS_MAIN=1")
	var out bytes.Buffer
	cmd.Stdout = &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	// Wait for a sleep itself (corral's own argv carries the token too):
	// the shell has written "ready" by then.
	for !strings.Contains(readCmdlines(), "\nsleep\x00"+tok) {
		if time.Now().After(deadline) {
			t.Fatal("command never started")
		}
		time.Sleep(20 * time.Millisecond)
	}
	_ = cmd.Process.Signal(syscall.SIGINT)
	err := cmd.Wait()
	ee, ok := err.(*exec.ExitError)
	if !ok || ee.ExitCode() != 130 {
		t.Fatalf("corral exit = %v, want 130", err)
	}
	var body struct {
		Error struct{ Kind, Message, Stdout string }
	}
	if err := json.Unmarshal(out.Bytes(), &body); err != nil || body.Error.Kind != "abort" || body.Error.Stdout != "ready\n" || body.Error.Message != "interrupted by SIGINT" {
		t.Fatalf("output %q (%v)", out.String(), err)
	}
	sandboxtest.AssertNoProcesses(t, "sleep "+tok)
}

// TestInheritedDescriptorsNotPassedOn: descriptors corral inherited
// without close-on-exec (from a shell, a service manager) do not reach the
// commands it runs.
func TestInheritedDescriptorsNotPassedOn(t *testing.T) {
	state, dir := t.TempDir(), t.TempDir()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	defer w.Close()
	cmd := exec.Command(os.Args[0], "run", "--state", state, "--json", "--host", dir, "--",
		"sh", "-c", `for f in 3 4; do [ -e /proc/$$/fd/$f ] && echo "fd $f open"; done; echo checked`)
	cmd.Env = append(os.Environ(), "CORRAL_TEST_AS_MAIN=1")
	cmd.ExtraFiles = []*os.File{r, w} // fds 3 and 4 of corral, without close-on-exec
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("corral: %v (%s)", err, out)
	}
	var body struct{ Stdout string }
	if err := json.Unmarshal(out, &body); err != nil || body.Stdout != "checked\n" {
		t.Fatalf("the command saw corral's inherited descriptors: %q (%v)", out, err)
	}
}

func readCmdlines() string {
	var sb strings.Builder
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		b, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		sb.Write(b)
		sb.WriteByte('\n')
	}
	return sb.String()
}

func TestParseSize(t *testing.T) {
	good := map[string]int64{"1": 1, "10B": 10, "2KiB": 2048, "1MiB": 1 << 20, "3 MiB": 3 << 20, "1GiB": 1 << 30}
	for in, want := range good {
		if got, err := parseSize(in); err != nil || got != want {
			t.Errorf("parseSize(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, in := range []string{"", "0", "-1", "1XB", "KiB", "1.5MiB", "99999999999GiB"} {
		if _, err := parseSize(in); err == nil {
			t.Errorf("parseSize(%q) accepted", in)
		}
	}
}
