// Package pgtest runs a real PostgreSQL server for tests: the installed
// PostgreSQL 15's initdb and postgres, in a temporary directory, as an
// unprivileged user, listening on a Unix socket only.
//
// A test binary shares one server (started by the first NewDatabase,
// stopped by Main or WithServer) and gives each test a database of its own:
//
//	func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }
//
//	func TestSomething(t *testing.T) {
//		url := pgtest.NewDatabase(t) // skips the test if PostgreSQL is absent
//		st, err := store.Open(ctx, url, store.Options{Migrate: true})
//		...
//	}
//
// Tests that need a server of their own (to stop or restart it under
// load) call Start and Stop themselves.
//
// The server runs as the user "postgres" when the test runs as root
// (initdb refuses root), else as the test's user; it is the test
// binary's child and dies with it (its parent-death signal is SIGQUIT,
// PostgreSQL's immediate shutdown), so a killed test run leaves no server
// behind. Superuser connects without a password; any other role with its
// password (SCRAM). The server does not fsync (nor write full pages): a commit is
// durable against the server's crash or restart (the kernel keeps what it
// wrote), not against the host's.
package pgtest

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/corral-sandbox/corral/internal/pdeath"
	"github.com/jackc/pgx/v5"
)

// BinDir is where the PostgreSQL server's programs are looked for, unless
// $CORRAL_PG_BIN names another directory.
const BinDir = "/usr/lib/postgresql/15/bin"

// Superuser is the server's superuser role, with which URL connects.
const Superuser = "postgres"

// startTimeout bounds a server's start (initdb, then accepting connections).
const startTimeout = 60 * time.Second

// ErrUnavailable is wrapped by Start's error when this host cannot run a
// server (no PostgreSQL binaries, no unprivileged user to run them as).
// NewDatabase skips the test with its message.
var ErrUnavailable = errors.New("pgtest: PostgreSQL unavailable")

// Server is a running PostgreSQL server of this process.
type Server struct {
	dir     string // the temporary directory: data/, sock/, log
	data    string
	sock    string
	cred    *syscall.Credential // nil: the test's own user
	cmd     *exec.Cmd
	exited  chan struct{}
	exitErr error
}

// Start creates a database cluster in a new temporary directory and runs
// its server. The error wraps ErrUnavailable when the host cannot run one;
// otherwise it says what failed, with the server's log.
func Start() (*Server, error) {
	bin := binDir()
	if _, err := os.Stat(filepath.Join(bin, "postgres")); err != nil {
		return nil, fmt.Errorf("%w: no server binaries in %s (apt-get install postgresql-15)", ErrUnavailable, bin)
	}
	s := &Server{}
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			return nil, fmt.Errorf("%w: running as root and no user \"postgres\" to run the server as: %v", ErrUnavailable, err)
		}
		uid, _ := strconv.ParseUint(u.Uid, 10, 32)
		gid, _ := strconv.ParseUint(u.Gid, 10, 32)
		s.cred = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
	}
	dir, err := os.MkdirTemp("", "corral-pgtest-")
	if err != nil {
		return nil, fmt.Errorf("pgtest: %w", err)
	}
	s.dir, s.data, s.sock = dir, filepath.Join(dir, "data"), filepath.Join(dir, "sock")
	ok := false
	defer func() {
		if !ok {
			os.RemoveAll(dir)
		}
	}()
	if err := os.Mkdir(s.sock, 0o700); err != nil {
		return nil, fmt.Errorf("pgtest: %w", err)
	}
	if s.cred != nil {
		for _, p := range []string{dir, s.sock} {
			if err := os.Chown(p, int(s.cred.Uid), int(s.cred.Gid)); err != nil {
				return nil, fmt.Errorf("pgtest: %w", err)
			}
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	initdb := exec.CommandContext(ctx, filepath.Join(bin, "initdb"), "-D", s.data, "-U", Superuser,
		"--auth=trust", "--encoding=UTF8", "--locale=C", "--no-sync")
	initdb.SysProcAttr = &syscall.SysProcAttr{Credential: s.cred}
	initdb.Dir = dir
	if out, err := initdb.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("pgtest: initdb: %w\n%s", err, out)
	}
	// Superuser connects without a password; every other role must give
	// its own (tests of passwords and passfiles make such roles).
	hba := "local all " + Superuser + " trust\nlocal all all scram-sha-256\n"
	if err := os.WriteFile(filepath.Join(s.data, "pg_hba.conf"), []byte(hba), 0o600); err != nil {
		return nil, fmt.Errorf("pgtest: %w", err)
	}
	if err := s.run(ctx); err != nil {
		return nil, err
	}
	ok = true
	return s, nil
}

// run starts the server on s.data and waits until it accepts connections.
func (s *Server) run(ctx context.Context) error {
	log, err := os.OpenFile(filepath.Join(s.dir, "log"), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("pgtest: %w", err)
	}
	defer log.Close()
	cmd := exec.Command(filepath.Join(binDir(), "postgres"), "-D", s.data,
		"-c", "listen_addresses=", "-c", "unix_socket_directories="+s.sock,
		"-c", "fsync=off", "-c", "full_page_writes=off",
		"-c", "max_connections=200", "-c", "shared_buffers=32MB")
	cmd.Dir = s.dir
	cmd.Stdout, cmd.Stderr = log, log
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: s.cred, Pdeathsig: syscall.SIGQUIT, Setpgid: true}
	if err := pdeath.Start(cmd); err != nil {
		return fmt.Errorf("pgtest: start postgres: %w", err)
	}
	s.cmd, s.exited = cmd, make(chan struct{})
	go func() {
		s.exitErr = cmd.Wait()
		close(s.exited)
	}()
	for {
		c, err := pgx.Connect(ctx, s.URL("postgres"))
		if err == nil {
			c.Close(ctx)
			return nil
		}
		select {
		case <-s.exited:
			return fmt.Errorf("pgtest: postgres exited: %v\n%s", s.exitErr, s.Log())
		case <-ctx.Done():
			s.kill()
			return fmt.Errorf("pgtest: postgres did not accept connections within %v: %v\n%s", startTimeout, err, s.Log())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

func binDir() string {
	if d := os.Getenv("CORRAL_PG_BIN"); d != "" {
		return d
	}
	return BinDir
}

// URL returns the URL of database db on s, as Superuser, over its socket.
func (s *Server) URL(db string) string {
	u := url.URL{Scheme: "postgres", Path: "/" + db, RawQuery: url.Values{"host": {s.sock}, "user": {Superuser}, "sslmode": {"disable"}}.Encode()}
	return u.String()
}

// SocketDir returns the directory of the server's Unix socket.
func (s *Server) SocketDir() string { return s.sock }

// Log returns what the server wrote to its log so far.
func (s *Server) Log() string {
	b, _ := os.ReadFile(filepath.Join(s.dir, "log"))
	return string(b)
}

// CreateDatabase creates an empty database named name (letters, digits and
// underscores) and returns its URL.
func (s *Server) CreateDatabase(ctx context.Context, name string) (string, error) {
	if err := s.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()); err != nil {
		return "", err
	}
	return s.URL(name), nil
}

// DropDatabase drops database name, ending its connections first.
func (s *Server) DropDatabase(ctx context.Context, name string) error {
	return s.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)")
}

// Exec runs sql (one statement, no parameters) as Superuser on the
// database "postgres".
func (s *Server) Exec(ctx context.Context, sql string) error {
	c, err := pgx.Connect(ctx, s.URL("postgres"))
	if err != nil {
		return fmt.Errorf("pgtest: %w", err)
	}
	defer c.Close(context.Background())
	if _, err := c.Exec(ctx, sql); err != nil {
		return fmt.Errorf("pgtest: %s: %w", sql, err)
	}
	return nil
}

// Stop ends the server at once (an immediate shutdown: connections are
// cut) and, with remove, deletes its directory. It waits for the server
// to exit. Stopping a stopped server does nothing but the removal; a
// stopped server runs again with Restart.
func (s *Server) Stop(remove bool) error {
	s.kill()
	if remove {
		return os.RemoveAll(s.dir)
	}
	return nil
}

// Restart stops the server as Stop does (an immediate shutdown: every
// connection is cut, as when the server crashes), waits down, then runs it
// again on the same data and socket, and returns once it accepts
// connections. Clients see their connections fail, then succeed again.
func (s *Server) Restart(ctx context.Context, down time.Duration) error {
	s.kill()
	select {
	case <-time.After(down):
	case <-ctx.Done():
		return ctx.Err()
	}
	ctx, cancel := context.WithTimeout(ctx, startTimeout)
	defer cancel()
	return s.run(ctx)
}

// kill sends SIGQUIT (immediate shutdown) and waits for the server's
// exit; a server that exited already is left as it is.
func (s *Server) kill() {
	if s.cmd == nil {
		return
	}
	_ = s.cmd.Process.Signal(syscall.SIGQUIT)
	select {
	case <-s.exited:
	case <-time.After(10 * time.Second):
		_ = syscall.Kill(-s.cmd.Process.Pid, syscall.SIGKILL)
		<-s.exited
	}
}

// The test binary's shared server.
var (
	sharedMu  sync.Mutex
	shared    *Server
	sharedErr error
	dbSeq     atomic.Int64
)

// Shared returns the test binary's shared server, starting it on first
// use. Main stops it.
func Shared() (*Server, error) {
	sharedMu.Lock()
	defer sharedMu.Unlock()
	if shared == nil && sharedErr == nil {
		shared, sharedErr = Start()
	}
	return shared, sharedErr
}

// Main runs m's tests and stops the shared server if one was started; it
// returns m.Run's code, for os.Exit.
func Main(m *testing.M) int { return WithServer(m).Run() }

// WithServer wraps m for a TestMain that hands it to another runner (as
// goleak.VerifyTestMain(pgtest.WithServer(m)) does): its Run runs m's tests
// and then stops the shared server, before the runner looks for leaked
// goroutines.
func WithServer(m *testing.M) interface{ Run() int } { return serverM{m} }

type serverM struct{ m *testing.M }

func (s serverM) Run() int {
	code := s.m.Run()
	sharedMu.Lock()
	if shared != nil {
		shared.Stop(true)
	}
	sharedMu.Unlock()
	return code
}

var unsafeName = regexp.MustCompile(`[^a-z0-9_]+`)

// NewDatabase creates a fresh database on the shared server for t, drops
// it when t ends, and returns its URL. Where PostgreSQL is unavailable it
// skips t, saying why; another failure fails t.
func NewDatabase(t testing.TB) string {
	t.Helper()
	s, err := Shared()
	if errors.Is(err, ErrUnavailable) {
		t.Skip(err)
	}
	if err != nil {
		t.Fatal(err)
	}
	name := unsafeName.ReplaceAllString(strings.ToLower(t.Name()), "_")
	if len(name) > 40 {
		name = name[:40]
	}
	name = fmt.Sprintf("t%d_%s", dbSeq.Add(1), name)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	u, err := s.CreateDatabase(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := s.DropDatabase(ctx, name); err != nil {
			t.Errorf("drop test database: %v", err)
		}
	})
	return u
}

// CPUTime returns the CPU time (user and system) the server's processes
// have used so far: the postmaster's, its live children's (the backends
// serving connections, the writers) and its exited children's. It has the
// kernel's clock-tick resolution (10 ms): measure many operations.
func (s *Server) CPUTime() (time.Duration, error) {
	if s.cmd == nil || s.cmd.Process == nil {
		return 0, errors.New("pgtest: server not running")
	}
	pid := s.cmd.Process.Pid
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return 0, fmt.Errorf("pgtest: %w", err)
	}
	var ticks int64
	for _, e := range entries {
		n, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue // exited meanwhile
		}
		// The fields after the command's closing parenthesis: state (3),
		// ppid (4), ..., utime (14), stime (15), cutime (16), cstime (17).
		i := strings.LastIndexByte(string(b), ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(string(b[i+1:]))
		if len(f) < 15 {
			continue
		}
		ppid, _ := strconv.Atoi(f[1])
		if n != pid && ppid != pid {
			continue
		}
		for _, k := range f[11:15] {
			v, _ := strconv.ParseInt(k, 10, 64)
			ticks += v
		}
	}
	return time.Duration(ticks) * (time.Second / 100), nil
}
