package main

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// corralProcess returns a real corral process running `corral run` args.
func corralProcess(state string, args ...string) *exec.Cmd {
	cmd := exec.Command(os.Args[0], append([]string{"run", "--state", state}, args...)...)
	cmd.Env = append(os.Environ(), "CORRAL_TEST_AS_MAIN=1")
	return cmd
}

func TestRunEnvFlags(t *testing.T) {
	state, dir := t.TempDir(), t.TempDir()
	file := filepath.Join(t.TempDir(), "env")
	if err := os.WriteFile(file, []byte("# a comment\n\nFROM_FILE=f=1\nBOTH=file\n  # indented comment\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("CORRAL_TEST_PASSED", "passed on")
	out, errs, status := corral(t, state, "--host", dir, "-e", "A=1", "--env", "BOTH=flag", "-e", "CORRAL_TEST_PASSED",
		"-e", "CORRAL_TEST_UNSET_XYZ", "--env-file", file, "--",
		"sh", "-c", `printf '%s|%s|%s|%s|%s' "$A" "$FROM_FILE" "$BOTH" "$CORRAL_TEST_PASSED" "${CORRAL_TEST_UNSET_XYZ-unset}"`)
	if want := "1|f=1|flag|passed on|unset"; status != 0 || out != want {
		t.Fatalf("status %d stdout %q (want %q) stderr %q", status, out, want, errs)
	}
	for _, args := range [][]string{{"-e", "1X=y"}, {"-e", "A-B=y"}} {
		_, errs, status = corral(t, state, append(append([]string{"--host", dir}, args...), "--", "true")...)
		if status != 125 || !strings.Contains(errs, "corral: prepare: environment variable name") {
			t.Errorf("%v: status %d stderr %q", args, status, errs)
		}
	}
	bad := filepath.Join(t.TempDir(), "bad")
	_ = os.WriteFile(bad, []byte("JUSTANAME\n"), 0o600)
	_, errs, status = corral(t, state, "--host", dir, "--env-file", bad, "--", "true")
	if status != 125 || !strings.Contains(errs, "corral: prepare: --env-file") {
		t.Errorf("bad env file: status %d stderr %q", status, errs)
	}
}

// TestRunStdin: without -i corral's stdin is not the command's; with -i
// 10 MiB of it reach the command intact.
func TestRunStdin(t *testing.T) {
	state, dir := t.TempDir(), t.TempDir()
	cmd := corralProcess(state, "--host", dir, "--", "cat")
	cmd.Stdin = strings.NewReader("piped\n")
	out, err := cmd.Output()
	if err != nil || len(out) != 0 {
		t.Fatalf("without -i: %q %v", out, err)
	}

	data := make([]byte, 10<<20)
	for i := range data {
		data[i] = byte(i ^ i>>9)
	}
	sum := sha256.Sum256(data)
	cmd = corralProcess(state, "--host", dir, "-i", "--timeout", "60s", "--", "sha256sum")
	cmd.Stdin = bytes.NewReader(data)
	out, err = cmd.Output()
	if err != nil {
		t.Fatalf("-i: %v", err)
	}
	if got, _, _ := strings.Cut(string(out), " "); got != hex.EncodeToString(sum[:]) {
		t.Fatalf("sha256 inside %q, want %x", out, sum)
	}
}

// TestRunLiveOutput reads a real corral's stdout as it comes: the command
// writes b only once the test saw a.
func TestRunLiveOutput(t *testing.T) {
	state, dir := t.TempDir(), t.TempDir()
	flag := filepath.Join(dir, "saw-a")
	cmd := corralProcess(state, "--host", dir, "--timeout", "20s", "--",
		"sh", "-c", `echo a; echo e >&2; while [ ! -e saw-a ]; do sleep 0.02; done; echo b`)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(stdout)
	line, err := br.ReadString('\n')
	if err != nil || line != "a\n" {
		t.Fatalf("first line %q: %v", line, err)
	}
	if _, err := os.Stat(flag); err == nil {
		t.Fatal("b's condition exists already")
	}
	if err := os.WriteFile(flag, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	rest, _ := io.ReadAll(br)
	if err := cmd.Wait(); err != nil {
		t.Fatalf("corral: %v (%s)", err, stderr.String())
	}
	if string(rest) != "b\n" || stderr.String() != "e\n" {
		t.Fatalf("rest %q stderr %q", rest, stderr.String())
	}
}

// TestRunBinaryOutput: without --json the bytes pass unchanged; --json
// keeps its pinned UTF-8 decoding.
func TestRunBinaryOutput(t *testing.T) {
	state, dir := t.TempDir(), t.TempDir()
	out, _, status := corral(t, state, "--host", dir, "--", "printf", `\377\376`)
	if status != 0 || out != "\xff\xfe" {
		t.Fatalf("status %d stdout %q", status, out)
	}
	out, _, status = corral(t, state, "--host", dir, "--json", "--", "printf", `\377\376`)
	if want := `{"stdout":"\ufffd\ufffd","stderr":"","code":0,"signal":null}` + "\n"; status != 0 || out != strings.ReplaceAll(want, `\ufffd`, "\uFFFD") {
		t.Fatalf("--json: status %d stdout %q", status, out)
	}
}
