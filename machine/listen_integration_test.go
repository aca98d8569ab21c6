package machine_test

import (
	"errors"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/corral-sandbox/corral/machine"
)

// TestRealWorkerListen: net-listen gives core a listener inside the
// machine's network namespace, which the machine's programs reach on their
// loopback; the worker keeps no copy (closing ours frees the port for a
// new listener) and starts no machine for it.
func TestRealWorkerListen(t *testing.T) {
	in, _ := newIntegration(t)
	ctx := ctxT(t)

	// No machine yet: refused, nothing started.
	_, err := in.g.Listen(ctx, in.project, 3128)
	var rej *machine.RejectedError
	if !errors.As(err, &rej) || !errors.Is(err, machine.ErrDialFailed) {
		t.Fatalf("Listen without a machine = %v, want dial-failed", err)
	}

	hold, err := in.g.Exec(ctx, in.req("sleep", "60"))
	if err != nil {
		t.Fatal(err)
	}
	defer hold.Close()
	defer hold.Cancel(ctx)
	if _, err := in.g.Listen(ctx, in.project, 0); !errors.As(err, &rej) || !errors.Is(err, machine.ErrDialFailed) {
		t.Errorf("Listen port 0 = %v, want dial-failed", err)
	}
	l, err := listenWhenStarted(t, in, 3128)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := in.g.Listen(ctx, in.project, 3128); !errors.As(err, &rej) || !errors.Is(err, machine.ErrDialFailed) ||
		!strings.Contains(rej.Message, "address already in use") {
		t.Errorf("second Listen on a taken port = %v, want dial-failed (in use)", err)
	}

	client, err := in.g.Exec(ctx, in.req("python3", "-c", `
import socket
s = socket.create_connection(("127.0.0.1", 3128))
s.sendall(b"ping")
print(s.recv(4).decode())`))
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	go io.Copy(io.Discard, client.Stderr)
	nc, err := l.Accept()
	if err != nil {
		t.Fatal(err)
	}
	nc.SetDeadline(time.Now().Add(10 * time.Second))
	buf := make([]byte, 4)
	if _, err := io.ReadFull(nc, buf); err != nil || string(buf) != "ping" {
		t.Fatalf("read %q, %v", buf, err)
	}
	io.WriteString(nc, "pong")
	nc.Close()
	out, _ := io.ReadAll(client.Stdout)
	if exit, err := client.Wait(); err != nil || exit.Code == nil || *exit.Code != 0 || string(out) != "pong\n" {
		t.Errorf("client: %+v, %v, stdout %q", exit, err, out)
	}

	// The worker kept no copy: once ours is closed the port is free.
	l.Close()
	l2, err := in.g.Listen(ctx, in.project, 3128)
	if err != nil {
		t.Fatalf("Listen after closing the first listener: %v", err)
	}
	l2.Close()
}

// listenWhenStarted asks for a listener on port, waiting for the machine
// that a just-started session brings up.
func listenWhenStarted(t *testing.T, in *integration, port int) (net.Listener, error) {
	t.Helper()
	ctx := ctxT(t)
	deadline := time.Now().Add(15 * time.Second)
	for {
		l, err := in.g.Listen(ctx, in.project, port)
		var rej *machine.RejectedError
		if err == nil || !errors.As(err, &rej) || !errors.Is(err, machine.ErrDialFailed) || !strings.Contains(rej.Message, "no running machine") || time.Now().After(deadline) {
			return l, err
		}
		time.Sleep(20 * time.Millisecond)
	}
}
