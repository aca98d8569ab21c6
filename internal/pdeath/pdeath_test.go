package pdeath

import (
	"bytes"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// A child forked on a thread that later exits gets its parent-death signal
// with its parent alive; one started by Start does not. Both are started
// from one locked goroutine that then exits (taking its thread with it),
// and once the plain child has died of it, the other must still run.
func TestSurvivesThreadExit(t *testing.T) {
	sleep, err := exec.LookPath("sleep")
	if err != nil {
		t.Skip("no sleep(1)")
	}
	newCmd := func() *exec.Cmd {
		c := exec.Command(sleep, "60")
		c.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		return c
	}
	plain, viaStart := newCmd(), newCmd()
	// The goroutine must not run on the main thread, which Go parks instead
	// of ending when a locked goroutine exits on it.
	for {
		errs := make(chan error, 2)
		onMain := make(chan bool, 1)
		go func() {
			runtime.LockOSThread() // never unlocked: the thread exits with the goroutine
			if syscall.Gettid() == os.Getpid() {
				onMain <- true
				return
			}
			onMain <- false
			errs <- plain.Start()
			errs <- Start(viaStart)
		}()
		if <-onMain {
			continue
		}
		for range 2 {
			if err := <-errs; err != nil {
				t.Fatal(err)
			}
		}
		break
	}
	t.Cleanup(func() { _ = viaStart.Process.Kill(); _ = viaStart.Wait() })
	done := make(chan error, 1)
	go func() { done <- plain.Wait() }()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		_ = plain.Process.Kill()
		t.Fatal("the plain child outlived its forking thread: the hazard this package avoids did not show")
	}
	// Not reaped yet, a killed child is a zombie: its state says.
	b, err := os.ReadFile("/proc/" + strconv.Itoa(viaStart.Process.Pid) + "/stat")
	if err != nil {
		t.Fatal(err)
	}
	if f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:])); len(f) == 0 || f[0] == "Z" {
		t.Fatalf("the child started by Start died with an unrelated thread: %s", b)
	}
}
