// Package ctl is the private control protocol between the worker and the
// init of one machine. It is internal: nothing outside the worker speaks it,
// and it may change in any release.
//
// The channel is a SOCK_SEQPACKET socketpair created by the worker; the init
// receives its end as descriptor 3. One packet is one JSON-encoded Msg;
// descriptors ride as SCM_RIGHTS on the packet whose Op says so and are
// received with MSG_CMSG_CLOEXEC.
//
//	worker                                  init (PID 1 of the machine)
//	  |                                        |
//	  |-- config {Config} [+ mount fds] ------>|  set up mounts, pivot_root,
//	  |                                        |  hostname, loopback, rlimits
//	  |<------------------- ready | fail {msg} |  (fail: init exits nonzero)
//	  |                                        |
//	  |-- start {sid, argv, env, cwd} + 3 fds ->|  fork the session
//	  |<---- started {sid} | notStarted {sid, msg}
//	  |-- kill {sid} ------------------------->|  SIGKILL the session's pid 1
//	  |<--- exit {sid, code | signal}          |  after wait4 observed it
//	  |                                        |
//	  |  (EOF on the socket)  ---------------->|  init exits: the kernel kills
//	                                              every process of the machine
//
// A start carries exactly three descriptors (stdin, stdout, stderr); config
// carries the descriptors its Config.MountFDs says; nothing else carries any.
package ctl

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// Ops.
const (
	OpConfig     = "config"
	OpReady      = "ready"
	OpFail       = "fail"
	OpStart      = "start"
	OpStarted    = "started"
	OpNotStarted = "notStarted"
	OpKill       = "kill"
	OpExit       = "exit"
)

// MaxPacket bounds one control packet. A start carries at most one wire
// frame's worth of argv and env (64 KiB), so twice that is ample.
const MaxPacket = 128 << 10

// Config is what the init needs to build the machine.
type Config struct {
	Hostname string `json:"hostname"`
	// Workspace and Home are host paths bind-mounted (through the old root)
	// when no idmapped mount descriptor is supplied for them.
	Workspace string `json:"workspace"`
	Home      string `json:"home"`
	// WorkspaceFD and HomeFD say that the config packet carries a detached
	// (idmapped) mount for the workspace, resp. home, in that order.
	WorkspaceFD bool `json:"workspaceFD,omitempty"`
	HomeFD      bool `json:"homeFD,omitempty"`
	// UID and GID are the guest ids sessions run as.
	UID int `json:"uid"`
	GID int `json:"gid"`
	// NProc, when positive, is RLIMIT_NPROC for the session user.
	NProc int `json:"nproc,omitempty"`
	// GuestWorkspace and GuestHome are the guest mount points.
	GuestWorkspace string `json:"guestWorkspace"`
	GuestHome      string `json:"guestHome"`
}

// Msg is one control packet.
type Msg struct {
	Op      string   `json:"op"`
	SID     uint64   `json:"sid,omitempty"`
	Argv    []string `json:"argv,omitempty"`
	Env     []string `json:"env,omitempty"`
	Cwd     string   `json:"cwd,omitempty"`
	Code    *int     `json:"code,omitempty"`
	Signal  string   `json:"signal,omitempty"`
	Message string   `json:"message,omitempty"`
	Config  *Config  `json:"config,omitempty"`
}

// FDCount reports how many descriptors m carries.
func FDCount(m *Msg) int {
	switch m.Op {
	case OpStart:
		return 3
	case OpConfig:
		n := 0
		if m.Config != nil && m.Config.WorkspaceFD {
			n++
		}
		if m.Config != nil && m.Config.HomeFD {
			n++
		}
		return n
	}
	return 0
}

// ErrFDMismatch reports a packet whose descriptors do not match its Op.
var ErrFDMismatch = errors.New("ctl: descriptor count mismatch")

// ErrClosed is returned by every call after Close, and by Recv when the
// peer has closed its end.
var ErrClosed = errors.New("ctl: channel closed")

// Conn is one end of the control channel, over a blocking socket used with
// plain system calls: a Recv blocks its thread in recvmsg and wakes as soon
// as a packet arrives, with no poller in between (the exec path crosses
// this channel three times). Send is safe for concurrent use and with
// Recv; Recv must be called from one goroutine at a time. Close unblocks a
// pending Recv.
type Conn struct {
	life   sync.RWMutex // held shared while fd is in use, exclusively to close it
	fd     int          // -1 once closed
	sendMu sync.Mutex
	buf    []byte
	oob    []byte
}

// New returns a Conn owning the blocking SOCK_SEQPACKET descriptor fd.
func New(fd int) *Conn {
	return &Conn{fd: fd, buf: make([]byte, MaxPacket), oob: make([]byte, unix.CmsgSpace(4*4))}
}

// Pair returns a connected pair: the worker's Conn and the init's end as a
// file, to be passed to the init as descriptor 3 (and then closed).
func Pair() (*Conn, *os.File, error) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, nil, fmt.Errorf("ctl: socketpair: %w", err)
	}
	return New(fds[0]), os.NewFile(uintptr(fds[1]), "ctl-init"), nil
}

// Close shuts the channel down, waking a blocked Recv, and closes the
// descriptor. Idempotent.
func (c *Conn) Close() error {
	c.life.RLock()
	if c.fd >= 0 {
		_ = unix.Shutdown(c.fd, unix.SHUT_RDWR)
	}
	c.life.RUnlock()
	c.life.Lock()
	defer c.life.Unlock()
	if c.fd < 0 {
		return nil
	}
	err := unix.Close(c.fd)
	c.fd = -1
	return err
}

// Send writes m with files as SCM_RIGHTS. It does not close files.
func (c *Conn) Send(m *Msg, files ...*os.File) error {
	if len(files) != FDCount(m) {
		return ErrFDMismatch
	}
	b, err := json.Marshal(m)
	if err != nil {
		return fmt.Errorf("ctl: %w", err)
	}
	if len(b) > MaxPacket {
		return fmt.Errorf("ctl: packet of %d bytes exceeds %d", len(b), MaxPacket)
	}
	var oob []byte
	if len(files) > 0 {
		fds := make([]int, len(files))
		for i, f := range files {
			fds[i] = int(f.Fd())
		}
		oob = unix.UnixRights(fds...)
	}
	c.life.RLock()
	defer c.life.RUnlock()
	if c.fd < 0 {
		return ErrClosed
	}
	c.sendMu.Lock()
	defer c.sendMu.Unlock()
	for {
		err = unix.Sendmsg(c.fd, b, oob, nil, unix.MSG_NOSIGNAL)
		if err != unix.EINTR {
			break
		}
	}
	if err != nil {
		return fmt.Errorf("ctl: send %s: %w", m.Op, err)
	}
	return nil
}

// Recv reads one packet, blocking. Received descriptors are close-on-exec;
// on any error every one of them is closed. It returns ErrClosed after
// Close or once the peer has closed its end.
func (c *Conn) Recv() (*Msg, []*os.File, error) {
	return c.recv(-1)
}

// RecvTimeout is Recv giving up after d with os.ErrDeadlineExceeded.
func (c *Conn) RecvTimeout(d time.Duration) (*Msg, []*os.File, error) {
	return c.recv(int(d.Milliseconds()))
}

func (c *Conn) recv(timeoutMS int) (*Msg, []*os.File, error) {
	c.life.RLock()
	defer c.life.RUnlock()
	if c.fd < 0 {
		return nil, nil, ErrClosed
	}
	if timeoutMS >= 0 {
		for {
			n, err := unix.Poll([]unix.PollFd{{Fd: int32(c.fd), Events: unix.POLLIN}}, timeoutMS)
			if err == unix.EINTR {
				continue
			}
			if err != nil {
				return nil, nil, fmt.Errorf("ctl: poll: %w", err)
			}
			if n == 0 {
				return nil, nil, fmt.Errorf("ctl: recv: %w", os.ErrDeadlineExceeded)
			}
			break
		}
	}
	var (
		n, oobn, flags int
		err            error
	)
	for {
		n, oobn, flags, _, err = unix.Recvmsg(c.fd, c.buf, c.oob, unix.MSG_CMSG_CLOEXEC)
		if err != unix.EINTR {
			break
		}
	}
	var fds []int
	if err == nil && oobn > 0 {
		fds = parseRights(c.oob[:oobn])
	}
	fail := func(err error) (*Msg, []*os.File, error) {
		for _, fd := range fds {
			unix.Close(fd)
		}
		return nil, nil, err
	}
	if err != nil {
		return fail(fmt.Errorf("ctl: recv: %w", err))
	}
	if n == 0 && oobn == 0 {
		return fail(ErrClosed)
	}
	if flags&(unix.MSG_TRUNC|unix.MSG_CTRUNC) != 0 {
		return fail(errors.New("ctl: truncated packet"))
	}
	m := new(Msg)
	if err := json.Unmarshal(c.buf[:n], m); err != nil {
		return fail(fmt.Errorf("ctl: decode: %w", err))
	}
	if len(fds) != FDCount(m) {
		return fail(ErrFDMismatch)
	}
	files := make([]*os.File, len(fds))
	for i, fd := range fds {
		files[i] = os.NewFile(uintptr(fd), "ctl-fd")
	}
	return m, files, nil
}

func parseRights(oob []byte) []int {
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return nil
	}
	var fds []int
	for i := range msgs {
		r, err := unix.ParseUnixRights(&msgs[i])
		if err == nil {
			fds = append(fds, r...)
		}
	}
	return fds
}
