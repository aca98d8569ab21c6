// Package ctl is the private control protocol between the worker and the
// init of one machine. It is internal: nothing outside the worker speaks it,
// and it may change in any release.
//
// The channel is a SOCK_SEQPACKET socketpair created by the worker; the init
// receives its end as descriptor 3. One packet is one Msg in a compact
// binary encoding (see encode: both ends are the same binary, and a start
// is on every command's path, where JSON cost a few microseconds at each
// end); descriptors ride as SCM_RIGHTS on the packet whose Op says so and
// are received with MSG_CMSG_CLOEXEC.
//
//	worker                                  init (PID 1 of the machine)
//	  |                                        |
//	  |-- config {Config} + mount fds -------->|  set up mounts, pivot_root,
//	  |                                        |  hostname, loopback, rlimits
//	  |<------------------- ready | fail {msg} |  (fail: init exits nonzero)
//	  |                                        |
//	  |-- lookup {sid, user} ----------------->|  resolve a named user in the
//	  |<-- lookedUp {sid, cred | msg}          |  machine's /etc/passwd, group
//	  |                                        |
//	  |-- start {sid, argv, env, cwd,          |  fork the session (as cred,
//	  |   [cred | user]} + 3 fds ------------>|  or user, or the default)
//	  |<---- started {sid} | notStarted {sid, msg}
//	  |-- kill {sid} ------------------------->|  SIGKILL the session's holder
//	  |-- signal {sid, signal} --------------->|  signal every process of the
//	  |                                        |  session's namespace but the holder
//	  |<--- exit {sid, code | signal}          |  after wait4 observed it and
//	  |                                        |  the session's namespace is empty
//	  |                                        |
//	  |  (EOF on the socket)  ---------------->|  init exits: the kernel kills
//	                                              every process of the machine
//
// The worker waits on its end through Go's network poller (Conn); the init
// polls its end together with its sessions' pidfds on one thread
// (Endpoint).
//
// A start carries exactly three descriptors (stdin, stdout, stderr), none
// with TTY; config carries the detached mounts of the machine's filesystem
// (see Config.Mounts); a started with TTY one (the pty's master); nothing
// else carries any.
package ctl

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/corral-sandbox/corral/wire"
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
	OpLookup     = "lookup"
	OpLookedUp   = "lookedUp"
	// OpSignal {sid, signal}: send the signal (a name such as "SIGTERM")
	// to every process of the session's pid namespace but its holder.
	OpSignal = "signal"
)

// MaxPacket bounds one control packet. A start carries at most one wire
// frame's worth of argv and env (64 KiB), at most three times larger once
// invalid UTF-8 became U+FFFD (strings travel as their bytes, with a length
// in front); the socket buffers are sized for it.
const MaxPacket = 200 << 10

// opCodes number the ops on the wire of the channel (0 is invalid).
var opCodes = map[string]byte{
	OpConfig: 1, OpReady: 2, OpFail: 3, OpStart: 4,
	OpStarted: 5, OpNotStarted: 6, OpKill: 7, OpExit: 8,
	OpLookup: 9, OpLookedUp: 10, OpSignal: 11,
}

// opNames is opCodes reversed.
var opNames = [...]string{1: OpConfig, 2: OpReady, 3: OpFail, 4: OpStart,
	5: OpStarted, 6: OpNotStarted, 7: OpKill, 8: OpExit,
	9: OpLookup, 10: OpLookedUp, 11: OpSignal}

// Config is what the init needs to build the machine.
type Config struct {
	Hostname string `json:"hostname"`
	// DefaultUser is who sessions run as unless their start names a user:
	// a user name or a numeric uid of the machine's /etc/passwd, optionally
	// followed by ":" and a group name or gid (as an image's config says).
	// Empty means UID and GID. An unknown name fails the machine's start.
	DefaultUser string `json:"defaultUser,omitempty"`
	// UID and GID are the guest ids of the default user when DefaultUser
	// is empty.
	UID int `json:"uid"`
	GID int `json:"gid"`
	// NProc, when positive, is RLIMIT_NPROC for the session user.
	NProc int `json:"nproc,omitempty"`
	// Layers is how many image layers the config carries (see Mounts), at
	// most MaxLayers.
	Layers int `json:"layers,omitempty"`
	// HostBinds are the guest paths (clean, absolute, not "/") of the
	// read-only host binds the config carries, in order, at most
	// MaxHostBinds.
	HostBinds []string `json:"hostBinds,omitempty"`
	// GuestWorkspace and GuestHome are the guest mount points.
	GuestWorkspace string `json:"guestWorkspace"`
	GuestHome      string `json:"guestHome"`
	// GoHolder makes session namespace holders corral's own binary rather
	// than env and sleep from the host.
	GoHolder bool `json:"goHolder,omitempty"`
	// SessionCgroup, on cgroup v2, is the host path of the machine's
	// cgroup, delegated to guest root: each session gets a child group of
	// it. Empty: no session groups (v1).
	SessionCgroup string `json:"sessionCgroup,omitempty"`
	// MaxSessions is how many sessions the worker admits at once; the init
	// keeps as many unused namespace holders (and a few). Zero: unknown.
	MaxSessions int `json:"maxSessions,omitempty"`
	// TmpSize, when positive, is the size limit in bytes of the machine's
	// /tmp and of its /dev/shm (each). Zero: unsized.
	TmpSize int64 `json:"tmpSize,omitempty"`
}

// Limits on what one config carries, so that its descriptors fit one
// SCM_RIGHTS message (the kernel's limit is 253).
const (
	MaxLayers    = 128
	MaxHostBinds = 16
)

// Mounts reports how many detached mounts a config with c carries, in this
// order: the workspace, the home, the directory holding the overlay's upper
// and work directories ("upper" and "work"), the image's layers (lowest
// first, Layers of them), then one per HostBinds entry.
func (c *Config) Mounts() int {
	if c == nil {
		return 0
	}
	return 3 + c.Layers + len(c.HostBinds)
}

// valid reports whether c's descriptor counts are within bounds.
func (c *Config) valid() bool {
	return c.Layers >= 0 && c.Layers <= MaxLayers && len(c.HostBinds) <= MaxHostBinds
}

// Cred is whom a session runs as: resolved by the init (lookedUp) and
// given back to it with the session's start.
type Cred struct {
	UID, GID uint32
	// Groups are the supplementary groups.
	Groups []uint32
	// Home is the session's HOME unless its environment sets one.
	Home string
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
	// User is the user a lookup asks for (Config.DefaultUser's syntax),
	// or, in a start without Cred, the user to resolve and run the session
	// as (one every machine knows: root or a uid).
	User string `json:"user,omitempty"`
	// Cred is a lookup's answer (absent: the user is unknown, Message says
	// why) and, in a start, whom to run the session as (absent: the
	// default user).
	Cred *Cred `json:"cred,omitempty"`
	// TTY, in a start, asks for a terminal session of this size: the
	// init allocates a pseudo-terminal of the machine's devpts, whose
	// slave becomes the session's controlling terminal and stdio; such a
	// start carries no descriptors. In a started it marks the answer to
	// such a start, which carries the master.
	TTY *Winsize `json:"tty,omitempty"`
}

// Winsize is a terminal's size in character cells.
type Winsize struct {
	Rows, Cols uint16
}

// FDCount reports how many descriptors m carries.
func FDCount(m *Msg) int {
	switch m.Op {
	case OpStart:
		if m.TTY != nil {
			return 0
		}
		return 3
	case OpStarted:
		if m.TTY != nil {
			return 1 // the terminal's master
		}
		return 0
	case OpConfig:
		return m.Config.Mounts()
	}
	return 0
}

// oobSize holds the descriptors of the largest config (and then some).
var oobSize = unix.CmsgSpace(4 * (3 + MaxLayers + MaxHostBinds + 1))

// ErrFDMismatch reports a packet whose descriptors do not match its Op.
var ErrFDMismatch = errors.New("ctl: descriptor count mismatch")

// ErrClosed is returned by every call after Close, and by Recv when the
// peer has closed its end.
var ErrClosed = errors.New("ctl: channel closed")

// ErrWouldBlock is returned by Endpoint.TryRecv when no packet is waiting.
var ErrWouldBlock = errors.New("ctl: no packet waiting")

// Conn is the worker's end of the control channel. It waits through Go's
// network poller, so a worker with many machines ties up no thread per
// machine. Send is safe for concurrent use, also with Recv; Recv must be
// called from one goroutine at a time. Close unblocks a pending Recv.
type Conn struct {
	closed atomic.Bool
	f      *os.File
	rc     syscall.RawConn
	sendMu sync.Mutex
	buf    []byte
	oob    []byte
}

// Pair returns a connected pair: the worker's Conn and the init's end as a
// file, to be passed to the init as descriptor 3 (and then closed).
func Pair() (*Conn, *os.File, error) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, nil, fmt.Errorf("ctl: socketpair: %w", err)
	}
	for _, fd := range fds {
		_ = unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_SNDBUFFORCE, 2*MaxPacket)
		_ = unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, 2*MaxPacket)
	}
	if err := unix.SetNonblock(fds[0], true); err != nil {
		unix.Close(fds[0])
		unix.Close(fds[1])
		return nil, nil, fmt.Errorf("ctl: %w", err)
	}
	f := os.NewFile(uintptr(fds[0]), "ctl")
	rc, err := f.SyscallConn()
	if err != nil {
		f.Close()
		unix.Close(fds[1])
		return nil, nil, fmt.Errorf("ctl: %w", err)
	}
	c := &Conn{f: f, rc: rc, buf: make([]byte, MaxPacket), oob: make([]byte, oobSize)}
	return c, os.NewFile(uintptr(fds[1]), "ctl-init"), nil
}

// Close closes the channel, unblocking a pending Recv. Idempotent.
func (c *Conn) Close() error {
	c.closed.Store(true)
	err := c.f.Close()
	if errors.Is(err, os.ErrClosed) {
		return nil
	}
	return err
}

// Send writes m with files as SCM_RIGHTS. It does not close files.
func (c *Conn) Send(m *Msg, files ...*os.File) error {
	return c.SendFDs(m, fileFDs(files)...)
}

// SendFDs is Send with descriptor numbers. It does not close them.
func (c *Conn) SendFDs(m *Msg, fds ...int) error {
	b, oob, err := encode(m, fds)
	if err != nil {
		return err
	}
	c.sendMu.Lock()
	defer c.sendMu.Unlock()
	var serr error
	err = c.rc.Write(func(fd uintptr) bool {
		serr = unix.Sendmsg(int(fd), b, oob, nil, unix.MSG_NOSIGNAL|unix.MSG_DONTWAIT)
		return serr != unix.EAGAIN
	})
	if err == nil {
		err = serr
	}
	if err != nil {
		if c.closed.Load() {
			return ErrClosed
		}
		return fmt.Errorf("ctl: send %s: %w", m.Op, err)
	}
	return nil
}

// Recv reads one packet, waiting for it. Received descriptors are
// close-on-exec; on any error every one of them is closed. It returns
// ErrClosed after Close or once the peer has closed its end.
func (c *Conn) Recv() (*Msg, []*os.File, error) {
	var (
		n, oobn, flags int
		rerr           error
	)
	err := c.rc.Read(func(fd uintptr) bool {
		n, oobn, flags, _, rerr = unix.Recvmsg(int(fd), c.buf, c.oob, unix.MSG_CMSG_CLOEXEC|unix.MSG_DONTWAIT)
		return rerr != unix.EAGAIN
	})
	if err != nil {
		if c.closed.Load() {
			return nil, nil, ErrClosed
		}
		return nil, nil, fmt.Errorf("ctl: recv: %w", err)
	}
	m, fds, err := decode(c.buf, c.oob, n, oobn, flags, rerr)
	return m, files(fds), err
}

// RecvTimeout is Recv giving up after d with an error wrapping
// os.ErrDeadlineExceeded.
func (c *Conn) RecvTimeout(d time.Duration) (*Msg, []*os.File, error) {
	if err := c.f.SetReadDeadline(time.Now().Add(d)); err != nil {
		return nil, nil, fmt.Errorf("ctl: %w", err)
	}
	defer c.f.SetReadDeadline(time.Time{})
	return c.Recv()
}

// Endpoint is the init's end of the control channel: plain system calls on
// a descriptor, for an event loop that polls it together with other
// descriptors on one thread. Send blocks; TryRecv never does.
type Endpoint struct {
	fd  int
	buf []byte
	oob []byte
}

// NewEndpoint returns an Endpoint owning fd.
func NewEndpoint(fd int) *Endpoint {
	return &Endpoint{fd: fd, buf: make([]byte, MaxPacket), oob: make([]byte, oobSize)}
}

// FD returns the descriptor, for polling.
func (e *Endpoint) FD() int { return e.fd }

// Send writes m with files as SCM_RIGHTS. It does not close files.
func (e *Endpoint) Send(m *Msg, files ...*os.File) error {
	b, oob, err := encode(m, fileFDs(files))
	if err != nil {
		return err
	}
	for {
		err = unix.Sendmsg(e.fd, b, oob, nil, unix.MSG_NOSIGNAL)
		if err != unix.EINTR {
			break
		}
	}
	if err != nil {
		return fmt.Errorf("ctl: send %s: %w", m.Op, err)
	}
	return nil
}

// Recv reads one packet, blocking. The descriptors it carried are
// returned as such (close-on-exec), for the caller to close: the init hands
// them to a child or closes them, and wrapping each in an *os.File would
// cost a system call.
func (e *Endpoint) Recv() (*Msg, []int, error) { return e.recv(0) }

// TryRecv reads one packet if one is waiting, else returns ErrWouldBlock.
// Descriptors are as for Recv.
func (e *Endpoint) TryRecv() (*Msg, []int, error) { return e.recv(unix.MSG_DONTWAIT) }

func (e *Endpoint) recv(flag int) (*Msg, []int, error) {
	var (
		n, oobn, flags int
		err            error
	)
	for {
		n, oobn, flags, _, err = unix.Recvmsg(e.fd, e.buf, e.oob, unix.MSG_CMSG_CLOEXEC|flag)
		if err != unix.EINTR {
			break
		}
	}
	if err == unix.EAGAIN {
		return nil, nil, ErrWouldBlock
	}
	return decode(e.buf, e.oob, n, oobn, flags, err)
}

// Field presence bits of an encoded Msg.
const (
	hasCode = 1 << iota
	hasConfig
	hasUser
	hasCred
	hasTTY
)

// encode returns m's packet and the control message carrying files.
//
// The packet is: the op's code (one byte), the presence bits (one byte),
// the SID (uvarint), then Argv and Env (each a uvarint count of strings),
// Cwd, Signal and Message; each string is a uvarint length and its bytes.
// Then Code (varint), Config (a uvarint length and its JSON), User (a
// string) and Cred (UID, GID, a uvarint count of groups and each group as
// uvarints, then Home) and TTY (Rows, Cols as uvarints), each only when
// present.
func encode(m *Msg, fds []int) (b, oob []byte, err error) {
	if len(fds) != FDCount(m) {
		return nil, nil, ErrFDMismatch
	}
	op, ok := opCodes[m.Op]
	if !ok {
		return nil, nil, fmt.Errorf("ctl: unknown op %q", m.Op)
	}
	var bits byte
	var config []byte
	if m.Code != nil {
		bits |= hasCode
	}
	if m.User != "" {
		bits |= hasUser
	}
	if m.Cred != nil {
		bits |= hasCred
	}
	if m.TTY != nil {
		bits |= hasTTY
	}
	if m.Config != nil {
		bits |= hasConfig
		if !m.Config.valid() {
			return nil, nil, fmt.Errorf("ctl: config carries too many mounts")
		}
		if config, err = json.Marshal(m.Config); err != nil {
			return nil, nil, fmt.Errorf("ctl: %w", err)
		}
	}
	size := 2 + binary.MaxVarintLen64*(3+len(m.Argv)+len(m.Env)+10) + len(m.Cwd) + len(m.Signal) + len(m.Message) + len(config) + len(m.User)
	if m.Cred != nil {
		size += binary.MaxVarintLen32*len(m.Cred.Groups) + len(m.Cred.Home)
	}
	for _, a := range m.Argv {
		size += len(a)
	}
	for _, e := range m.Env {
		size += len(e)
	}
	b = make([]byte, 0, size)
	b = append(b, op, bits)
	b = binary.AppendUvarint(b, m.SID)
	b = appendStrings(b, m.Argv)
	b = appendStrings(b, m.Env)
	b = appendString(b, m.Cwd)
	b = appendString(b, m.Signal)
	b = appendString(b, m.Message)
	if m.Code != nil {
		b = binary.AppendVarint(b, int64(*m.Code))
	}
	if m.Config != nil {
		b = binary.AppendUvarint(b, uint64(len(config)))
		b = append(b, config...)
	}
	if m.User != "" {
		b = appendString(b, m.User)
	}
	if c := m.Cred; c != nil {
		b = binary.AppendUvarint(b, uint64(c.UID))
		b = binary.AppendUvarint(b, uint64(c.GID))
		b = binary.AppendUvarint(b, uint64(len(c.Groups)))
		for _, g := range c.Groups {
			b = binary.AppendUvarint(b, uint64(g))
		}
		b = appendString(b, c.Home)
	}
	if t := m.TTY; t != nil {
		b = binary.AppendUvarint(b, uint64(t.Rows))
		b = binary.AppendUvarint(b, uint64(t.Cols))
	}
	if len(b) > MaxPacket {
		return nil, nil, fmt.Errorf("ctl: packet of %d bytes exceeds %d", len(b), MaxPacket)
	}
	if len(fds) > 0 {
		oob = unix.UnixRights(fds...)
	}
	return b, oob, nil
}

// fileFDs returns the descriptors of files.
func fileFDs(files []*os.File) []int {
	if len(files) == 0 {
		return nil
	}
	fds := make([]int, len(files))
	for i, f := range files {
		fds[i] = int(f.Fd())
	}
	return fds
}

func appendString(b []byte, s string) []byte {
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}

func appendStrings(b []byte, ss []string) []byte {
	b = binary.AppendUvarint(b, uint64(len(ss)))
	for _, s := range ss {
		b = appendString(b, s)
	}
	return b
}

// errMalformed reports a packet that encode did not make.
var errMalformed = errors.New("ctl: decode: malformed packet")

// reader reads an encoded Msg; the first error sticks.
type reader struct {
	b   []byte
	err error
}

func (r *reader) uvarint() uint64 {
	v, n := binary.Uvarint(r.b)
	if n <= 0 {
		r.err, r.b = errMalformed, nil
		return 0
	}
	r.b = r.b[n:]
	return v
}

func (r *reader) varint() int64 {
	v, n := binary.Varint(r.b)
	if n <= 0 {
		r.err, r.b = errMalformed, nil
		return 0
	}
	r.b = r.b[n:]
	return v
}

func (r *reader) bytes() []byte {
	n := r.uvarint()
	if n > uint64(len(r.b)) {
		r.err, r.b = errMalformed, nil
		return nil
	}
	v := r.b[:n]
	r.b = r.b[n:]
	return v
}

func (r *reader) string() string { return string(r.bytes()) }

func (r *reader) uint32() uint32 {
	v := r.uvarint()
	if v > 1<<32-1 {
		r.err, r.b = errMalformed, nil
		return 0
	}
	return uint32(v)
}

func (r *reader) uint16() uint16 {
	v := r.uvarint()
	if v > 1<<16-1 {
		r.err, r.b = errMalformed, nil
		return 0
	}
	return uint16(v)
}

func (r *reader) cred() *Cred {
	c := &Cred{UID: r.uint32(), GID: r.uint32()}
	n := r.uvarint()
	if n > uint64(len(r.b)) { // each group takes at least a byte
		r.err, r.b = errMalformed, nil
		return nil
	}
	if n > 0 {
		c.Groups = make([]uint32, n)
		for i := range c.Groups {
			c.Groups[i] = r.uint32()
		}
	}
	c.Home = r.string()
	return c
}

func (r *reader) strings() []string {
	n := r.uvarint()
	if n == 0 {
		return nil
	}
	if n > uint64(len(r.b)) { // each string takes at least a byte
		r.err, r.b = errMalformed, nil
		return nil
	}
	ss := make([]string, n)
	for i := range ss {
		ss[i] = r.string()
	}
	return ss
}

// unmarshal decodes a packet made by encode.
func unmarshal(b []byte) (*Msg, error) {
	if len(b) < 2 || int(b[0]) >= len(opNames) || opNames[b[0]] == "" {
		return nil, errMalformed
	}
	m := &Msg{Op: opNames[b[0]]}
	bits := b[1]
	if bits&^(hasCode|hasConfig|hasUser|hasCred|hasTTY) != 0 {
		return nil, errMalformed
	}
	r := &reader{b: b[2:]}
	m.SID = r.uvarint()
	m.Argv = r.strings()
	m.Env = r.strings()
	m.Cwd = r.string()
	m.Signal = r.string()
	m.Message = r.string()
	if bits&hasCode != 0 {
		code := int(r.varint())
		m.Code = &code
	}
	if bits&hasConfig != 0 {
		raw := r.bytes()
		if r.err == nil {
			m.Config = new(Config)
			if err := json.Unmarshal(raw, m.Config); err != nil {
				return nil, fmt.Errorf("ctl: decode: %w", err)
			}
			if !m.Config.valid() {
				return nil, errMalformed
			}
		}
	}
	if bits&hasUser != 0 {
		if m.User = r.string(); m.User == "" && r.err == nil {
			return nil, errMalformed // encode never sends an empty one
		}
	}
	if bits&hasCred != 0 {
		m.Cred = r.cred()
	}
	if bits&hasTTY != 0 {
		m.TTY = &Winsize{Rows: r.uint16(), Cols: r.uint16()}
	}
	if r.err != nil {
		return nil, r.err
	}
	if len(r.b) != 0 {
		return nil, errMalformed
	}
	return m, nil
}

// decode turns the result of one recvmsg into a message and the
// descriptors it carried, closing every received descriptor on any error.
func decode(buf, oob []byte, n, oobn, flags int, err error) (*Msg, []int, error) {
	var fds []int
	var perr error
	if err == nil && oobn > 0 {
		fds, perr = wire.ParseRights(oob[:oobn])
	}
	fail := func(err error) (*Msg, []int, error) {
		for _, fd := range fds {
			unix.Close(fd)
		}
		return nil, nil, err
	}
	if err != nil {
		return fail(fmt.Errorf("ctl: recv: %w", err))
	}
	if perr != nil {
		return fail(fmt.Errorf("ctl: descriptors: %w", perr))
	}
	if n == 0 && oobn == 0 {
		return fail(ErrClosed)
	}
	if flags&(unix.MSG_TRUNC|unix.MSG_CTRUNC) != 0 {
		return fail(errors.New("ctl: truncated packet"))
	}
	m, err := unmarshal(buf[:n])
	if err != nil {
		return fail(err)
	}
	if len(fds) != FDCount(m) {
		return fail(ErrFDMismatch)
	}
	return m, fds, nil
}

// files wraps received descriptors.
func files(fds []int) []*os.File {
	if len(fds) == 0 {
		return nil
	}
	fs := make([]*os.File, len(fds))
	for i, fd := range fds {
		fs[i] = os.NewFile(uintptr(fd), "ctl-fd")
	}
	return fs
}
