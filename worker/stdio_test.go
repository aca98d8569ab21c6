package worker

import (
	"io"
	"net"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/corral-sandbox/corral/wire"
)

// TestStdioMustBeStreams: a session's descriptors (exec-run's, or
// exec-attach's) that are not a socket, a pipe or the null device are
// refused, and the command never runs: otherwise a host directory given as
// stdin (even O_PATH) lets the command read the host's files through
// /proc/self/fd/0 from inside its machine (which this test observed), an
// O_PATH socket file lets it connect to a host socket, a memfd or host file
// is a host file, a TCP socket the host's network. exec-run is answered exec-rejected bad-field; exec-attach
// ends the pending session not started. The descriptors are closed.
func TestStdioMustBeStreams(t *testing.T) {
	h := newHarness(t, nil)
	c := h.dial(t)
	proj := h.project(t, 1)
	secretDir := t.TempDir()
	if err := os.WriteFile(filepath.Join(secretDir, "hostsecret"), []byte("HOST-SECRET\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	sockPath := filepath.Join(t.TempDir(), "host.sock")
	ln, err := net.Listen("unix", sockPath)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	open := func(path string, flags int) func(t *testing.T) *os.File {
		return func(t *testing.T) *os.File {
			fd, err := unix.Open(path, flags|unix.O_CLOEXEC, 0)
			if err != nil {
				t.Fatal(err)
			}
			return os.NewFile(uintptr(fd), path)
		}
	}
	bad := []struct {
		name string
		file func(t *testing.T) *os.File
	}{
		{"directory", open(secretDir, unix.O_RDONLY|unix.O_DIRECTORY)},
		{"o-path-directory", open(secretDir, unix.O_PATH|unix.O_DIRECTORY)},
		{"o-path-socket-file", open(sockPath, unix.O_PATH)},
		{"host-file", open(filepath.Join(secretDir, "hostsecret"), unix.O_RDWR)},
		{"device", open("/dev/zero", unix.O_RDONLY)},
		{"memfd", func(t *testing.T) *os.File {
			fd, err := unix.MemfdCreate("payload", unix.MFD_CLOEXEC)
			if err != nil {
				t.Fatal(err)
			}
			return os.NewFile(uintptr(fd), "memfd")
		}},
		{"tcp-socket", func(t *testing.T) *os.File {
			fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
			if err != nil {
				t.Fatal(err)
			}
			return os.NewFile(uintptr(fd), "tcp")
		}},
		{"pidfd", func(t *testing.T) *os.File {
			fd, err := unix.PidfdOpen(os.Getpid(), 0)
			if err != nil {
				t.Skipf("pidfd_open: %v", err)
			}
			return os.NewFile(uintptr(fd), "pidfd")
		}},
	}
	// The command would show the secret (stdin a directory), or mark that
	// it ran.
	argv := []string{"sh", "-c", "touch /workspace/ran; cat /proc/self/fd/0/hostsecret; cat <&0"}
	for _, tc := range bad {
		for _, how := range []string{"exec-run", "exec-attach"} {
			t.Run(tc.name+"/"+how, func(t *testing.T) {
				stdin := tc.file(t)
				outR, outW, _ := os.Pipe()
				errR, errW, _ := os.Pipe()
				defer outR.Close()
				defer errR.Close()
				id := newID()
				if how == "exec-run" {
					if err := c.Send(&wire.ExecRun{ID: id, Project: proj, Cwd: "/workspace", Argv: argv}, stdin, outW, errW); err != nil {
						t.Fatal(err)
					}
				} else {
					if err := c.Send(&wire.ExecStart{ID: id, Project: proj, Cwd: "/workspace", Argv: argv}); err != nil {
						t.Fatal(err)
					}
					if m, ok := recv(t, c).(*wire.ExecAccepted); !ok {
						t.Fatalf("exec-start: got %#v", m)
					}
					if err := c.Send(&wire.ExecAttach{ID: id}, stdin, outW, errW); err != nil {
						t.Fatal(err)
					}
				}
				stdin.Close()
				outW.Close()
				errW.Close()
				m := recv(t, c)
				switch m := m.(type) {
				case *wire.ExecRejected:
					if how != "exec-run" || m.ID != id || m.Code != wire.CodeBadField {
						t.Fatalf("got %#v", m)
					}
				case *wire.ExecExit:
					if how != "exec-attach" || m.ID != id || !m.NotStarted {
						t.Fatalf("got %#v", m)
					}
				default:
					out, _ := io.ReadAll(outR)
					t.Fatalf("got %#v, want the session refused (stdout %q)", m, out)
				}
				if !readsEOF(t, outR) || !readsEOF(t, errR) {
					t.Error("the refused session's descriptors are still open in the worker")
				}
				if _, err := os.Stat(filepath.Join(h.root, "p1", "ran")); err == nil {
					t.Fatal("the command ran")
				}
			})
		}
	}
	// Sockets, pipes and the null device still work.
	null, err := os.Open(os.DevNull)
	if err != nil {
		t.Fatal(err)
	}
	defer null.Close()
	sp, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	near, far := os.NewFile(uintptr(sp[0]), "near"), os.NewFile(uintptr(sp[1]), "far")
	defer near.Close()
	errR, errW, _ := os.Pipe()
	defer errR.Close()
	if err := c.Send(&wire.ExecRun{ID: "good", Project: proj, Cwd: "/workspace", Argv: []string{"sh", "-c", "echo ok; echo e >&2"}}, null, far, errW); err != nil {
		t.Fatal(err)
	}
	far.Close()
	errW.Close()
	if m, ok := recv(t, c).(*wire.ExecStarted); !ok {
		t.Fatalf("null, socket, pipe: got %#v", m)
	}
	out, _ := io.ReadAll(near)
	e, _ := io.ReadAll(errR)
	if m, ok := recv(t, c).(*wire.ExecExit); !ok || m.Code == nil || *m.Code != 0 || string(out) != "ok\n" || string(e) != "e\n" {
		t.Fatalf("got %#v, stdout %q, stderr %q", m, out, e)
	}
}
