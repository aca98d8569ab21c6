package worker

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/corral-sandbox/corral/wire"
)

// dialAndHello is run by a re-executed test binary: it connects to sock,
// performs the client hello and prints "ok" or the error; its exit status
// is 0 when the handshake succeeded.
func dialAndHello(sock string) int {
	c, err := wire.Dial(context.Background(), sock)
	if err != nil {
		fmt.Println("dial:", err)
		return 2
	}
	defer c.Close()
	if _, err := wire.ClientHello(c); err != nil {
		var pe *wire.ProtocolError
		if errors.As(err, &pe) {
			fmt.Printf("refused %s: %s\n", pe.Code, pe.Message)
		} else {
			fmt.Println("hello:", err)
		}
		return 1
	}
	fmt.Println("ok")
	return 0
}

// TestPeerCredentialsChecked connects to the worker as another uid: the
// socket file and its directory are opened to everyone so that only the
// worker's SO_PEERCRED check stands in the way.
func TestPeerCredentialsChecked(t *testing.T) {
	for _, tc := range []struct {
		name    string
		allow   uint32
		peer    uint32
		allowed bool
	}{
		{"other uid refused", 0, 65534, false},
		{"allowed uid served", 65534, 65534, true},
		{"root always served", 65534, 0, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, func(c *Config) { c.AllowUID = tc.allow })
			// A directory everyone may traverse, holding a copy of this test
			// binary (the build directory is private) and a link to the socket.
			dir, err := os.MkdirTemp("", "corral-peer-")
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { os.RemoveAll(dir) })
			if err := os.Chmod(dir, 0o755); err != nil {
				t.Fatal(err)
			}
			exe := filepath.Join(dir, "worker.test")
			copyFile(t, exe)
			// t.TempDir's parent and the socket's directory.
			for _, d := range []string{filepath.Dir(filepath.Dir(h.sock)), filepath.Dir(h.sock)} {
				if err := os.Chmod(d, 0o755); err != nil {
					t.Fatal(err)
				}
			}
			if err := os.Chmod(h.sock, 0o666); err != nil {
				t.Fatal(err)
			}
			cmd := exec.Command(exe, "-test.run=^$")
			cmd.Env = []string{"CORRAL_TEST_DIAL_AS_OTHER=" + h.sock}
			cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: tc.peer, Gid: tc.peer}}
			out, err := cmd.CombinedOutput()
			got := strings.TrimSpace(string(out))
			if tc.allowed {
				if err != nil || got != "ok" {
					t.Fatalf("uid %d with AllowUID %d: %v: %s", tc.peer, tc.allow, err, got)
				}
				return
			}
			if err == nil || !strings.HasPrefix(got, "refused "+wire.CodeForbidden+":") || !strings.Contains(got, "uid 65534") {
				t.Fatalf("uid %d with AllowUID %d: want refused %s, got %v: %s", tc.peer, tc.allow, wire.CodeForbidden, err, got)
			}
		})
	}
}

func copyFile(t *testing.T, dst string) {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	in, err := os.Open(self)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_WRONLY|os.O_EXCL, 0o755)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(out, in); err != nil {
		t.Fatal(err)
	}
	if err := out.Close(); err != nil {
		t.Fatal(err)
	}
}
