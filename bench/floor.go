package main

import (
	"bytes"
	_ "embed"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"

	"golang.org/x/sys/unix"
)

// The floors: the least a command in a machine can cost in corral's
// architecture. An agent already running inside a machine's namespaces
// (user, mount, pid, net, ipc, uts) does what corral's init does per
// command and nothing more; the bench reaches it over SOCK_SEQPACKET with
// the command's stdio passed as SCM_RIGHTS, directly or through one relay
// process in the worker's place. The agent is built twice: in C (compiled
// by the bench from floors/agent.c, which documents the wire format) and
// in Go (this binary, re-executed as __agent). The relay is this binary
// re-executed as __relay.

//go:embed floors/agent.c
var agentSource []byte

// Floor row names.
const (
	subjBareCapture = "bare exec, stdio on socketpairs read to EOF (corral's capture)"
	subjAgentC      = "floor: C agent in a machine's namespaces (SEQPACKET, SCM_RIGHTS)"
	subjAgentCRelay = "floor: C agent behind a Go relay (the worker's place)"
	subjAgentCStore = "floor: C agent behind a Go relay + the contract's two store writes (lease and journal entry; release and journal end)"
	subjAgentGo     = "floor: Go agent in a machine's namespaces"
	subjAgentGoRly  = "floor: Go agent behind a Go relay"
)

// Reply operations of the agents (floors/agent.c).
const (
	agentStarted    = 1
	agentExit       = 2
	agentNotStarted = 3
)

// floorGuestUID is the uid (and gid) the agents run commands as, inside
// their user namespace; floorHostBase is the host id the namespace's ids
// from 1 map to (0 maps to host root, so that the agent can execute a
// binary in a root-only directory; commands never run as it).
const (
	floorGuestUID = 1000
	floorHostBase = 1 << 30
)

// buildAgentC compiles the C agent into dir, or says why it cannot.
func buildAgentC(dir string) (string, error) {
	gcc, err := exec.LookPath("gcc")
	if err != nil {
		return "", errors.New("gcc not installed: the C agent is compiled at bench start")
	}
	src := filepath.Join(dir, "agent.c")
	bin := filepath.Join(dir, "agent")
	if err := os.WriteFile(src, agentSource, 0o644); err != nil {
		return "", err
	}
	if out, err := exec.Command(gcc, "-O2", "-o", bin, src).CombinedOutput(); err != nil {
		return "", fmt.Errorf("gcc agent.c: %w: %s", err, bytesTrim(out))
	}
	return bin, nil
}

// floorClient runs commands through an agent, possibly behind a relay.
// Its methods are safe for concurrent use: replies are matched to
// requests by id.
type floorClient struct {
	fd    int // the bench's end of the SEQPACKET socket
	procs []*exec.Cmd
	next  atomic.Uint32

	mu      sync.Mutex
	waiting map[uint32]chan floorReply
	err     error // set when the reader stopped
	done    chan struct{}
}

type floorReply struct {
	op     byte
	status int32
}

// startFloor starts an agent (exe with args) in new namespaces, placed in
// the accounting's agent group, and a relay in front of it when relay is
// set (in the relay group).
func startFloor(exe string, args []string, relay bool, acct *cpuAcct) (*floorClient, error) {
	agentPair, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	fc := &floorClient{fd: agentPair[0], waiting: map[uint32]chan floorReply{}, done: make(chan struct{})}
	fail := func(err error) (*floorClient, error) {
		fc.stop()
		return nil, err
	}
	agentEnd := os.NewFile(uintptr(agentPair[1]), "agent")
	agent := exec.Command(exe, args...)
	agent.ExtraFiles = []*os.File{agentEnd}
	agent.Stderr = os.Stderr
	agent.SysProcAttr = &syscall.SysProcAttr{
		Cloneflags: syscall.CLONE_NEWUSER | syscall.CLONE_NEWNS | syscall.CLONE_NEWPID |
			syscall.CLONE_NEWNET | syscall.CLONE_NEWIPC | syscall.CLONE_NEWUTS,
		UidMappings: []syscall.SysProcIDMap{{ContainerID: 0, HostID: 0, Size: 1}, {ContainerID: 1, HostID: floorHostBase + 1, Size: 65535}},
		GidMappings: []syscall.SysProcIDMap{{ContainerID: 0, HostID: 0, Size: 1}, {ContainerID: 1, HostID: floorHostBase + 1, Size: 65535}},
		// setgroups(0, NULL) before the uid switch, as a session does.
		GidMappingsEnableSetgroups: true,
		// No Pdeathsig: it fires when the forking thread exits, and the
		// core's confined starts end threads. The agent and the relay
		// exit on EOF of their socket, which the kernel closes with the
		// bench.
	}
	err = acct.in(groupAgent, agent.Start)
	agentEnd.Close()
	if err != nil {
		return fail(fmt.Errorf("start agent: %w", err))
	}
	fc.procs = append(fc.procs, agent)
	if relay {
		relayPair, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return fail(err)
		}
		self, err := os.Executable()
		if err != nil {
			unix.Close(relayPair[0])
			unix.Close(relayPair[1])
			return fail(err)
		}
		toClient := os.NewFile(uintptr(relayPair[1]), "relay-client")
		toAgent := os.NewFile(uintptr(fc.fd), "relay-agent")
		r := exec.Command(self, "__relay")
		r.ExtraFiles = []*os.File{toClient, toAgent}
		r.Stderr = os.Stderr
		err = acct.in(groupRelay, r.Start)
		toClient.Close()
		toAgent.Close() // the relay holds the agent's socket now
		fc.fd = relayPair[0]
		if err != nil {
			return fail(fmt.Errorf("start relay: %w", err))
		}
		fc.procs = append(fc.procs, r)
	}
	go fc.read()
	if err := fc.run([]string{"true"}); err != nil {
		return fail(fmt.Errorf("first command: %w", err))
	}
	return fc, nil
}

// read dispatches replies until the socket fails or closes.
func (fc *floorClient) read() {
	buf := make([]byte, 64)
	var err error
	for {
		var n int
		n, _, _, _, err = unix.Recvmsg(fc.fd, buf, nil, 0)
		if err == unix.EINTR {
			continue
		}
		if err != nil || n == 0 {
			break
		}
		if n < 9 {
			err = fmt.Errorf("short reply (%d bytes)", n)
			break
		}
		id := binary.LittleEndian.Uint32(buf)
		r := floorReply{op: buf[4], status: int32(binary.LittleEndian.Uint32(buf[5:]))}
		fc.mu.Lock()
		ch := fc.waiting[id]
		if r.op != agentStarted {
			delete(fc.waiting, id)
		}
		fc.mu.Unlock()
		if ch != nil {
			ch <- r
		}
	}
	if err == nil {
		err = errors.New("agent closed its socket")
	}
	fc.mu.Lock()
	fc.err = err
	for id, ch := range fc.waiting {
		delete(fc.waiting, id)
		close(ch)
	}
	fc.mu.Unlock()
	close(fc.done)
}

// floorEnv is the environment of every floor command.
var floorEnv = []string{"PATH=/usr/bin:/bin", "HOME=/"}

// run runs argv in the agent's machine with stdio on three new
// socketpairs, stdout and stderr captured to EOF, and waits for its exit:
// what corral's gateway does for a command, without the frames' JSON.
func (fc *floorClient) run(argv []string) error {
	var near, far [3]int
	for i := range 3 {
		p, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			for j := range i {
				unix.Close(near[j])
				unix.Close(far[j])
			}
			return err
		}
		near[i], far[i] = p[0], p[1]
	}
	unix.Close(near[0]) // no input: the command reads EOF
	id := fc.next.Add(1)
	var body bytes.Buffer
	body.Write(binary.LittleEndian.AppendUint32(nil, id))
	body.WriteString("/\x00")
	for _, a := range argv {
		body.WriteString(a)
		body.WriteByte(0)
	}
	body.WriteByte(0)
	for _, e := range floorEnv {
		body.WriteString(e)
		body.WriteByte(0)
	}
	ch := make(chan floorReply, 2)
	fc.mu.Lock()
	if fc.err != nil {
		fc.mu.Unlock()
		closeInts(near[1:], far[:])
		return fc.err
	}
	fc.waiting[id] = ch
	fc.mu.Unlock()
	err := unix.Sendmsg(fc.fd, body.Bytes(), unix.UnixRights(far[:]...), nil, 0)
	closeInts(far[:])
	if err != nil {
		closeInts(near[1:])
		fc.mu.Lock()
		delete(fc.waiting, id)
		fc.mu.Unlock()
		return fmt.Errorf("send: %w", err)
	}
	stdout, stderr, err := captureInts(near[1], near[2])
	if err != nil {
		return err
	}
	for r := range ch {
		switch r.op {
		case agentStarted:
			continue
		case agentNotStarted:
			return fmt.Errorf("not started: %v", syscall.Errno(r.status))
		}
		ws := syscall.WaitStatus(r.status)
		if !ws.Exited() || ws.ExitStatus() != 0 {
			return fmt.Errorf("%s: wait status %#x, stdout %q, stderr %q", argv[0], r.status, bytesTrim(stdout), bytesTrim(stderr))
		}
		return nil
	}
	<-fc.done
	return fc.err
}

func closeInts(sets ...[]int) {
	for _, s := range sets {
		for _, fd := range s {
			unix.Close(fd)
		}
	}
}

// captureInts reads two stream sockets to EOF into buffers, as corral's
// capture and exec.Cmd do (stderr on a goroutine), and closes them.
func captureInts(stdout, stderr int) ([]byte, []byte, error) {
	for _, fd := range []int{stdout, stderr} {
		if err := unix.SetNonblock(fd, true); err != nil {
			closeInts([]int{stdout, stderr})
			return nil, nil, err
		}
	}
	return captureFiles(os.NewFile(uintptr(stdout), "stdout"), os.NewFile(uintptr(stderr), "stderr"))
}

func captureFiles(stdout, stderr *os.File) ([]byte, []byte, error) {
	defer stdout.Close()
	defer stderr.Close()
	errc := make(chan error, 1)
	var eb bytes.Buffer
	go func() { _, err := eb.ReadFrom(stderr); errc <- err }()
	var ob bytes.Buffer
	_, oerr := ob.ReadFrom(stdout)
	eerr := <-errc // before eb is read: the goroutine writes it until then
	return ob.Bytes(), eb.Bytes(), errors.Join(oerr, eerr)
}

// bareCaptureTrue is bare exec with corral's capture: stdin, stdout and
// stderr on socketpairs, stdout and stderr read to EOF into buffers.
func bareCaptureTrue() error {
	var near, far [3]int
	for i := range 3 {
		p, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			for j := range i {
				unix.Close(near[j])
				unix.Close(far[j])
			}
			return err
		}
		near[i], far[i] = p[0], p[1]
	}
	unix.Close(near[0])
	files := make([]*os.File, 3)
	for i, fd := range far {
		files[i] = os.NewFile(uintptr(fd), "stdio")
	}
	cmd := exec.Command("true")
	cmd.Stdin, cmd.Stdout, cmd.Stderr = files[0], files[1], files[2]
	err := cmd.Start()
	for _, f := range files {
		f.Close()
	}
	if err != nil {
		closeInts(near[1:])
		return err
	}
	_, _, cerr := captureInts(near[1], near[2])
	return errors.Join(cerr, cmd.Wait())
}

// stop closes the socket (the relay and the agent exit on EOF) and
// reaps the processes.
func (fc *floorClient) stop() {
	if fc == nil {
		return
	}
	unix.Shutdown(fc.fd, unix.SHUT_RDWR)
	for _, p := range fc.procs {
		_ = p.Process.Kill()
		_ = p.Wait()
	}
	unix.Close(fc.fd)
}

// relayChild forwards packets and their descriptors between fd 3 (the
// bench) and fd 4 (the agent) until either closes: the worker's place,
// with nothing of its work.
func relayChild([]string) error {
	for _, fd := range []int{3, 4} {
		syscall.CloseOnExec(fd)
	}
	errc := make(chan error, 2)
	fwd := func(from, to int) {
		buf := make([]byte, 65536)
		oob := make([]byte, unix.CmsgSpace(3*4))
		for {
			n, oobn, _, _, err := unix.Recvmsg(from, buf, oob, unix.MSG_CMSG_CLOEXEC)
			if err == unix.EINTR {
				continue
			}
			if err != nil || n == 0 {
				errc <- err
				return
			}
			var fds []int
			if oobn > 0 {
				msgs, err := unix.ParseSocketControlMessage(oob[:oobn])
				if err == nil {
					for _, m := range msgs {
						if r, err := unix.ParseUnixRights(&m); err == nil {
							fds = append(fds, r...)
						}
					}
				}
			}
			var rights []byte
			if len(fds) > 0 {
				rights = unix.UnixRights(fds...)
			}
			err = unix.Sendmsg(to, buf[:n], rights, nil, 0)
			closeInts(fds)
			if err != nil {
				errc <- err
				return
			}
		}
	}
	go fwd(3, 4)
	go fwd(4, 3)
	<-errc
	return nil
}

// agentChild is the Go agent: floors/agent.c's loop, written as a Go
// program would (one locked thread with its own filesystem context that
// enters the holder's namespaces to fork; a goroutine reaps on SIGCHLD).
func agentChild([]string) error {
	const ctl = 3
	syscall.CloseOnExec(ctl)
	runtime.LockOSThread()
	if err := unix.Unshare(unix.CLONE_FS); err != nil {
		return fmt.Errorf("unshare fs: %w", err)
	}
	ownMnt, err := unix.Open("/proc/thread-self/ns/mnt", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	ownPid, err := unix.Open("/proc/thread-self/ns/pid", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGCHLD)
	holderFD := -1
	holder := exec.Command("sleep", "infinity")
	holder.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWPID | syscall.CLONE_NEWNS, PidFD: &holderFD}
	if err := holder.Start(); err != nil {
		return fmt.Errorf("holder: %w", err)
	}
	defer holder.Process.Kill()

	var mu sync.Mutex
	ids := map[int]uint32{}               // pid → request id
	early := map[int]syscall.WaitStatus{} // reaped before registered
	reply := func(id uint32, op byte, status int32) {
		b := binary.LittleEndian.AppendUint32(nil, id)
		b = append(b, op)
		b = binary.LittleEndian.AppendUint32(b, uint32(status))
		_ = unix.Sendmsg(ctl, b, nil, nil, 0)
	}
	go func() {
		for range sigs {
			for {
				var ws syscall.WaitStatus
				pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil)
				if err != nil || pid <= 0 {
					break
				}
				mu.Lock()
				id, ok := ids[pid]
				if ok {
					delete(ids, pid)
				} else {
					early[pid] = ws
				}
				mu.Unlock()
				if ok {
					reply(id, agentExit, int32(ws))
				}
			}
		}
	}()

	buf := make([]byte, 65536)
	oob := make([]byte, unix.CmsgSpace(3*4))
	for {
		n, oobn, _, _, err := unix.Recvmsg(ctl, buf, oob, unix.MSG_CMSG_CLOEXEC)
		if err == unix.EINTR {
			continue
		}
		if err != nil || n == 0 {
			return nil
		}
		var fds []int
		if msgs, err := unix.ParseSocketControlMessage(oob[:oobn]); err == nil {
			for _, m := range msgs {
				if r, err := unix.ParseUnixRights(&m); err == nil {
					fds = append(fds, r...)
				}
			}
		}
		if n < 5 {
			closeInts(fds)
			continue
		}
		id := binary.LittleEndian.Uint32(buf)
		if len(fds) != 3 {
			closeInts(fds)
			reply(id, agentNotStarted, int32(unix.EINVAL))
			continue
		}
		cwd, argv, env := parseAgentRequest(buf[4:n])
		path, perr := agentLookPath(argv, env)
		if perr != nil {
			closeInts(fds)
			reply(id, agentNotStarted, int32(unix.ENOENT))
			continue
		}
		for _, fd := range fds {
			_ = unix.SetNonblock(fd, false)
		}
		if err := unix.Setns(holderFD, unix.CLONE_NEWPID|unix.CLONE_NEWNS); err != nil {
			closeInts(fds)
			reply(id, agentNotStarted, int32(errnoOf(err)))
			continue
		}
		pid, ferr := syscall.ForkExec(path, argv, &syscall.ProcAttr{
			Dir:   cwd,
			Env:   env,
			Files: []uintptr{uintptr(fds[0]), uintptr(fds[1]), uintptr(fds[2])},
			Sys: &syscall.SysProcAttr{
				Setsid:     true,
				Credential: &syscall.Credential{Uid: floorGuestUID, Gid: floorGuestUID, Groups: []uint32{}},
			},
		})
		if err := errors.Join(unix.Setns(ownMnt, unix.CLONE_NEWNS), unix.Setns(ownPid, unix.CLONE_NEWPID)); err != nil {
			return fmt.Errorf("return to own namespaces: %w", err)
		}
		closeInts(fds)
		if ferr != nil {
			reply(id, agentNotStarted, int32(errnoOf(ferr)))
			continue
		}
		mu.Lock()
		ws, gone := early[pid]
		if gone {
			delete(early, pid)
		} else {
			ids[pid] = id
		}
		mu.Unlock()
		reply(id, agentStarted, 0)
		if gone {
			reply(id, agentExit, int32(ws))
		}
	}
}

func errnoOf(err error) syscall.Errno {
	var e syscall.Errno
	if errors.As(err, &e) {
		return e
	}
	return syscall.EIO
}

// parseAgentRequest splits a request body (after the id): cwd NUL,
// argv NUL-terminated, an empty string, env NUL-terminated.
func parseAgentRequest(b []byte) (cwd string, argv, env []string) {
	parts := strings.Split(string(b), "\x00")
	if len(parts) == 0 {
		return "/", nil, nil
	}
	cwd, parts = parts[0], parts[1:]
	for i, p := range parts {
		if p == "" {
			argv = parts[:i]
			for _, e := range parts[i+1:] {
				if e != "" {
					env = append(env, e)
				}
			}
			return cwd, argv, env
		}
	}
	return cwd, parts, nil
}

// agentLookPath finds argv[0] on the request's PATH, as the init does.
func agentLookPath(argv, env []string) (string, error) {
	if len(argv) == 0 {
		return "", errors.New("empty argv")
	}
	if strings.Contains(argv[0], "/") {
		return argv[0], nil
	}
	path := "/usr/bin:/bin"
	for _, e := range env {
		if v, ok := strings.CutPrefix(e, "PATH="); ok {
			path = v
		}
	}
	for _, dir := range filepath.SplitList(path) {
		if dir == "" {
			dir = "."
		}
		p := filepath.Join(dir, argv[0])
		if st, err := os.Stat(p); err == nil && st.Mode().IsRegular() && st.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	return "", os.ErrNotExist
}

// floors are the four floor agents of a run, each with its own socket.
type floors struct {
	c, cRelay, goAgent, goRelay *floorClient
	cSkip, goSkip               string
}

// startFloors builds the C agent in dir and starts the four floors; a
// floor that cannot run here has its skip set.
func startFloors(dir string, acct *cpuAcct) *floors {
	fl := &floors{}
	if os.Geteuid() != 0 {
		fl.cSkip, fl.goSkip = "needs root (user namespace mapped to host ids)", "needs root (user namespace mapped to host ids)"
		return fl
	}
	start := func(exe string, args []string, relay bool, skip *string) *floorClient {
		if *skip != "" {
			return nil
		}
		fc, err := startFloor(exe, args, relay, acct)
		if err != nil {
			*skip = err.Error()
		}
		return fc
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		fl.cSkip, fl.goSkip = err.Error(), err.Error()
		return fl
	}
	bin, err := buildAgentC(dir)
	if err != nil {
		fl.cSkip = err.Error()
	}
	fl.c = start(bin, nil, false, &fl.cSkip)
	fl.cRelay = start(bin, nil, true, &fl.cSkip)
	self, err := os.Executable()
	if err != nil {
		fl.goSkip = err.Error()
	}
	fl.goAgent = start(self, []string{"__agent"}, false, &fl.goSkip)
	fl.goRelay = start(self, []string{"__agent"}, true, &fl.goSkip)
	return fl
}

func (fl *floors) stop() {
	for _, fc := range []*floorClient{fl.c, fl.cRelay, fl.goAgent, fl.goRelay} {
		fc.stop()
	}
}

func (fl *floors) subject(name string, fc *floorClient, skip string) subject {
	s := subject{name: name, skip: skip}
	if fc != nil {
		s.run = func() error { return fc.run([]string{"true"}) }
	} else if s.skip == "" {
		s.skip = "not started"
	}
	return s
}

func (fl *floors) concSubject(name string, fc *floorClient, skip string) concSubject {
	s := fl.subject(name, fc, skip)
	return concSubject{name: s.name, run: s.run, skip: s.skip}
}
