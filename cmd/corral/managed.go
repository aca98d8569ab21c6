package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/corral-sandbox/corral/internal/pdeath"

	"github.com/corral-sandbox/corral/machine"
	"github.com/corral-sandbox/corral/wire"
)

// startManagedTransport returns the transport for a --project run: the
// given --worker-socket, or a private worker started as a child of this
// process on a private socket, which stop ends.
func startManagedTransport(ctx context.Context, f *runFlags, state string) (machine.PrivilegedTransport, func(), error) {
	if f.workerSocket != "" {
		return machine.SocketTransport{Path: f.workerSocket}, func() {}, nil
	}
	if os.Geteuid() != 0 {
		return nil, nil, errors.New("managed projects need the privileged worker: run as root, or pass --worker-socket")
	}
	ws, err := filepath.Abs(f.project)
	if err != nil {
		return nil, nil, err
	}
	if ws, err = filepath.EvalSymlinks(ws); err != nil {
		return nil, nil, fmt.Errorf("project directory: %w", err)
	}
	self, err := os.Executable()
	if err != nil {
		return nil, nil, err
	}
	dir, err := os.MkdirTemp("", "corral-worker-")
	if err != nil {
		return nil, nil, err
	}
	sock := filepath.Join(dir, "worker.sock")
	// Images beside the worker's state (STATE/images, where `corral image
	// import --state STATE` puts them). Not --own-workspaces: the
	// workspace is the user's own checkout.
	cmd := exec.Command(self, "worker", "--socket", sock, "--projects-root", filepath.Dir(ws),
		"--state", filepath.Join(state, "worker"), "--images", filepath.Join(state, "images"))
	// The worker logs JSON; a private worker's logs are kept only to explain
	// a failed start.
	logs := &tailBuffer{max: 4096}
	cmd.Stderr = logs
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGTERM}
	if err := pdeath.Start(cmd); err != nil { // Pdeathsig: this process, not this thread
		os.RemoveAll(dir)
		return nil, nil, fmt.Errorf("start worker: %w", err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	stop := func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(30 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
		}
		os.RemoveAll(dir)
	}
	// Wait until the worker answers.
	deadline := time.Now().Add(10 * time.Second)
	for {
		c, err := wire.Dial(ctx, sock)
		if err == nil {
			c.Close()
			break
		}
		select {
		case err := <-exited:
			os.RemoveAll(dir)
			return nil, nil, fmt.Errorf("worker exited at start: %v: %s", err, strings.TrimSpace(logs.String()))
		default:
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			stop()
			return nil, nil, fmt.Errorf("worker did not start listening: %w: %s", err, strings.TrimSpace(logs.String()))
		}
		time.Sleep(5 * time.Millisecond)
	}
	return machine.SocketTransport{Path: sock}, stop, nil
}

// tailBuffer keeps the last max bytes written to it.
type tailBuffer struct {
	mu  sync.Mutex
	max int
	b   []byte
}

func (t *tailBuffer) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.b = append(t.b, p...)
	if len(t.b) > t.max {
		t.b = append([]byte(nil), t.b[len(t.b)-t.max:]...)
	}
	return len(p), nil
}

func (t *tailBuffer) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return string(t.b)
}
