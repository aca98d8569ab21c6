package wire

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
)

// Protocol is the protocol version this package speaks.
const Protocol = 2

// MaxFrame is the largest frame, in bytes of JSON, that one packet may hold.
const MaxFrame = 64 << 10

// MaxFDs is the largest number of descriptors any message carries.
const MaxFDs = 3

// Message types: the values of a frame's "type" member.
const (
	TypeHello        = "hello"
	TypeError        = "error"
	TypePing         = "ping"
	TypePong         = "pong"
	TypeExecStart    = "exec-start"
	TypeExecAccepted = "exec-accepted"
	TypeExecRejected = "exec-rejected"
	TypeExecAttach   = "exec-attach"
	TypeExecStarted  = "exec-started"
	TypeExecExit     = "exec-exit"
	TypeExecCancel   = "exec-cancel"
	TypeNetDial      = "net-dial"
	TypeNetDialed    = "net-dialed"
	// TypeNetListen and TypeNetListening belong to FeatureNetListen.
	TypeNetListen    = "net-listen"
	TypeNetListening = "net-listening"
	// TypeMachineReset and TypeMachineResetDone belong to
	// FeatureMachineReset.
	TypeMachineReset     = "machine-reset"
	TypeMachineResetDone = "machine-reset-done"
	// TypeExecTTY is FeatureTTY's: the worker passes a terminal
	// session's master.
	TypeExecTTY = "exec-tty"
	// TypeExecSignal is FeatureExecSignal's.
	TypeExecSignal = "exec-signal"
	// TypeExecRun is FeatureExecRun's: exec-start and exec-attach in one
	// frame.
	TypeExecRun = "exec-run"
)

// Error codes carried by error frames ([Error.Code]) and rejections
// ([ExecRejected.Code]). The first six are protocol violations, also used as
// [ProtocolError.Code].
const (
	CodeUnsupportedProtocol = "unsupported-protocol"
	CodeBadFrame            = "bad-frame"
	CodeUnknownType         = "unknown-type"
	CodeFDMismatch          = "fd-mismatch"
	CodeTooLarge            = "too-large"
	CodeBadField            = "bad-field"

	CodeBadWorkspace    = "bad-workspace"
	CodeBadCwd          = "bad-cwd"
	CodeBadArgv         = "bad-argv"
	CodeBadEnv          = "bad-env"
	CodeTooManySessions = "too-many-sessions"
	CodeDuplicateID     = "duplicate-id"
	CodeUnknownSession  = "unknown-session"
	CodeMachineFailed   = "machine-failed"
	CodeDialFailed      = "dial-failed"
	CodeBadUser         = "bad-user"
	CodeBadImage        = "bad-image"
	CodeBusy            = "busy"
	CodeInternal        = "internal"
	// CodeForbidden is the connection error a worker sends a peer it does
	// not serve (a uid other than root and the daemon's) before closing.
	CodeForbidden = "forbidden"
)

// Message is one decoded frame. Every message struct of this package
// implements it, as a value and as a pointer.
type Message interface {
	// Type returns the frame's "type" member, one of the Type constants.
	Type() string
}

// Features a worker may announce in its hello ([Hello.Features]). A client
// sends a feature's optional fields only to a worker that announced it; a
// worker ignores them otherwise (encoding/json skips unknown members), so
// every frame without them stays valid for every worker.
const (
	// FeatureUser: exec-start may carry "user" (a name or numeric uid in
	// the machine's image); an unknown user is exec-rejected "bad-user".
	FeatureUser = "user"
	// FeatureMachineSpec: the project of exec-start and net-dial may carry
	// "image" and "limits" (see [Project]): what the machine is built from
	// when this request starts it. The worker applies changed limits to a
	// running machine; a changed image takes effect at its next start.
	FeatureMachineSpec = "machine-spec"
	// FeatureOOMKilled: exec-exit may carry "oomKilled": true beside
	// "signal" when the kernel's OOM killer killed the session.
	FeatureOOMKilled = "oom-killed"
	// FeatureNetListen: the client may send net-listen {id, project, port};
	// the worker answers net-listening {id, fds:1} carrying a TCP socket
	// listening on 127.0.0.1:port inside the machine's network namespace,
	// or error {id, code, message} ("dial-failed" when the project has no
	// running machine or the port is taken). The worker keeps no copy of
	// the descriptor and relays no byte: what is accepted on it is the
	// client's.
	FeatureNetListen = "net-listen"
	// FeatureMachineReset: the client may send machine-reset (see
	// [MachineReset]), which discards a project's machine state.
	FeatureMachineReset = "machine-reset"
	// FeatureProjectForget: machine-reset may carry "forget": true (see
	// [MachineReset.Forget]), sent when the project was deleted.
	FeatureProjectForget = "project-forget"
	// FeatureTTY: exec-start may carry "tty": {rows, cols}. The worker
	// then runs the session on a pseudo-terminal allocated inside the
	// machine (its own devpts), the slave its controlling terminal and
	// descriptors 0, 1 and 2, and sends the master to the client in an
	// exec-tty frame before exec-started. The descriptors of exec-attach
	// are still required and are closed unused.
	FeatureTTY = "tty"
	// FeatureExecSignal: the client may send exec-signal {id, signal}
	// (see [ExecSignal]).
	FeatureExecSignal = "exec-signal"
	// FeatureExecRun: the client may send exec-run (see [ExecRun]), an
	// exec-start carrying its three descriptors, in place of exec-start
	// and exec-attach. The worker answers it without exec-accepted:
	// exec-started (or, for a terminal session, exec-tty then
	// exec-started) means accepted and started; exec-rejected means
	// refused (the descriptors were closed unused and nothing follows);
	// exec-exit {notStarted} means accepted but never run. A command is
	// then three frames instead of five.
	FeatureExecRun = "exec-run"
)

// TTY is a terminal's size in character cells (FeatureTTY). A zero field
// leaves the kernel's default (0) for it.
type TTY struct {
	Rows uint16 `json:"rows"`
	Cols uint16 `json:"cols"`
}

// Project identifies a project's machine.
type Project struct {
	ID int64 `json:"id"`
	// Workspace is the absolute host path of the project's workspace.
	Workspace string `json:"workspace"`
	// Image names the image the machine's root filesystem is made from
	// (FeatureMachineSpec). Empty means the worker's default, "base".
	Image string `json:"image,omitempty"`
	// Limits are the machine's resource limits (FeatureMachineSpec). Nil,
	// or a zero field, means the worker's default for that limit.
	Limits *Limits `json:"limits,omitempty"`
}

// Limits are a machine's resource limits (FeatureMachineSpec). A zero field
// means the worker's default; a negative one means no limit.
type Limits struct {
	// Memory is in bytes (swap included where the kernel accounts it).
	Memory int64 `json:"memory,omitempty"`
	// Pids bounds the machine's tasks (threads count).
	Pids int64 `json:"pids,omitempty"`
	// CPU is in thousandths of a CPU (1500 is one and a half CPUs).
	CPU int64 `json:"cpuMillis,omitempty"`
	// Disk bounds, in bytes, what the machine writes to its persistent
	// storage (workspace, home, upper layer).
	Disk int64 `json:"disk,omitempty"`
	// Tmp bounds /tmp and /dev/shm together, in bytes; charged to Memory.
	Tmp int64 `json:"tmp,omitempty"`
}

// Hello is the first frame in each direction.
type Hello struct {
	Protocol int `json:"protocol"`
	// Worker identifies the worker implementation, e.g. "corral/<version>";
	// empty in the client's hello.
	Worker string `json:"worker,omitempty"`
	// Features are the protocol extensions the worker supports (the
	// Feature constants); empty in the client's hello.
	Features []string `json:"features,omitempty"`
}

// Has reports whether h announces feature f.
func (h *Hello) Has(f string) bool {
	for _, x := range h.Features {
		if x == f {
			return true
		}
	}
	return false
}

// Error reports a failure. With an ID it answers that request (for example
// a net-dial); without one it is about the connection, which its sender
// closes after sending it.
type Error struct {
	ID      string `json:"id,omitempty"`
	Code    string `json:"code"`
	Message string `json:"message"`
}

// Ping asks the peer to answer with a Pong carrying the same ID.
type Ping struct {
	ID string `json:"id,omitempty"`
}

// Pong answers a Ping.
type Pong struct {
	ID string `json:"id,omitempty"`
}

// ExecStart asks the worker to prepare a session in the project's machine.
type ExecStart struct {
	ID      string            `json:"id"`
	Project Project           `json:"project"`
	Account int64             `json:"account"`
	Lease   string            `json:"lease"`
	Argv    []string          `json:"argv"`
	Cwd     string            `json:"cwd"`
	Env     map[string]string `json:"env,omitempty"`
	// User is who the session runs as (FeatureUser): a user name of the
	// machine's image or a numeric uid. Empty means the image's default.
	User string `json:"user,omitempty"`
	// TTY asks for a terminal session of this initial size (FeatureTTY).
	TTY *TTY `json:"tty,omitempty"`
}

// ExecRun is an ExecStart that carries exactly three descriptors, the
// session's stdin, stdout and stderr as exec-attach would
// (FeatureExecRun): its members are exec-start's, and the worker answers
// exec-started without an exec-accepted before it, or exec-rejected. A
// terminal session's three descriptors are closed unused, as its
// exec-attach's are.
type ExecRun ExecStart

// ExecTTY carries exactly one descriptor: the master of a terminal
// session's pseudo-terminal (FeatureTTY), which the client reads the
// terminal's output from, writes its input to and resizes (TIOCSWINSZ).
// It precedes the session's exec-started.
type ExecTTY struct {
	ID string `json:"id"`
}

// ExecAccepted answers an ExecStart the worker will run once attached.
type ExecAccepted struct {
	ID string `json:"id"`
}

// ExecRejected answers an ExecStart the worker refuses; nothing was started
// and no exec-exit follows.
type ExecRejected struct {
	ID      string `json:"id"`
	Code    string `json:"code"`
	Message string `json:"message"`
}

// ExecAttach carries exactly three descriptors: the session's stdin, stdout
// and stderr, in that order.
type ExecAttach struct {
	ID string `json:"id"`
}

// ExecStarted reports that the session's process is running.
type ExecStarted struct {
	ID string `json:"id"`
}

// ExecExit is the last frame of an accepted session. Exactly one of Code,
// Signal and NotStarted is set: Code is the observed exit status; Signal the
// name of the signal that killed the process ("SIGKILL"); NotStarted means
// the program never ran (Message says why). The worker never invents a code.
type ExecExit struct {
	ID         string `json:"id"`
	Code       *int   `json:"code,omitempty"`
	Signal     string `json:"signal,omitempty"`
	NotStarted bool   `json:"notStarted,omitempty"`
	Message    string `json:"message,omitempty"`
	// OOMKilled accompanies Signal when the kernel's OOM killer killed the
	// session (FeatureOOMKilled).
	OOMKilled bool `json:"oomKilled,omitempty"`
}

// ExecCancel asks the worker to kill the session's whole process tree. It is
// idempotent; an ExecExit follows (or has already been sent).
type ExecCancel struct {
	ID string `json:"id"`
}

// ExecSignal asks the worker to send Signal (a name such as "SIGTERM",
// "SIGINT", "SIGHUP") to every process of the session's tree: its main
// process and every process of its pid namespace, wherever they forked
// to (FeatureExecSignal). Nothing answers it; an unknown or ended session,
// or a signal name the worker does not know, is ignored. Processes forked
// while it is delivered may miss it (exec-cancel kills a tree without
// that race). An exec-exit follows if the signal ended the session.
type ExecSignal struct {
	ID     string `json:"id"`
	Signal string `json:"signal"`
}

// NetDial asks the worker for a connection to port on the loopback of the
// project's machine.
type NetDial struct {
	ID      string  `json:"id"`
	Project Project `json:"project"`
	Port    int     `json:"port"`
}

// NetDialed answers a NetDial and carries exactly one descriptor: the
// connected socket.
type NetDialed struct {
	ID string `json:"id"`
}

// NetListen asks the worker for a socket listening on 127.0.0.1:port in
// the network namespace of the project's running machine
// (FeatureNetListen).
type NetListen struct {
	ID      string  `json:"id"`
	Project Project `json:"project"`
	Port    int     `json:"port"`
}

// NetListening answers a NetListen and carries exactly one descriptor: the
// listening socket (FeatureNetListen).
type NetListening struct {
	ID string `json:"id"`
}

// MachineReset asks the worker to discard what the project's machine
// keeps between starts: the upper layer of its root filesystem (what guest
// root installed or changed outside the workspace and the home)
// (FeatureMachineReset). The worker stops the machine first; it refuses
// (error {id, "busy"}) while the machine has sessions. The answer is
// machine-reset-done {id} or error {id, code, message}. Resetting a project
// that has no machine or no state succeeds.
type MachineReset struct {
	ID      string  `json:"id"`
	Project Project `json:"project"`
	// Forget (FeatureProjectForget) also discards the project's home and
	// disk and frees its id range for another project: the project was
	// deleted.
	Forget bool `json:"forget,omitempty"`
}

// MachineResetDone answers a MachineReset that succeeded.
type MachineResetDone struct {
	ID string `json:"id"`
}

func (Hello) Type() string        { return TypeHello }
func (Error) Type() string        { return TypeError }
func (Ping) Type() string         { return TypePing }
func (Pong) Type() string         { return TypePong }
func (ExecStart) Type() string    { return TypeExecStart }
func (ExecAccepted) Type() string { return TypeExecAccepted }
func (ExecRejected) Type() string { return TypeExecRejected }
func (ExecAttach) Type() string   { return TypeExecAttach }
func (ExecStarted) Type() string  { return TypeExecStarted }
func (ExecExit) Type() string     { return TypeExecExit }
func (ExecCancel) Type() string   { return TypeExecCancel }
func (NetDial) Type() string      { return TypeNetDial }
func (NetDialed) Type() string    { return TypeNetDialed }
func (NetListen) Type() string    { return TypeNetListen }
func (NetListening) Type() string { return TypeNetListening }

func (MachineReset) Type() string     { return TypeMachineReset }
func (MachineResetDone) Type() string { return TypeMachineResetDone }
func (ExecTTY) Type() string          { return TypeExecTTY }
func (ExecSignal) Type() string       { return TypeExecSignal }
func (ExecRun) Type() string          { return TypeExecRun }

// Error implements the error interface, so that an error frame can be
// returned as an error.
func (e *Error) Error() string {
	if e.ID != "" {
		return fmt.Sprintf("wire: %s (%s): %s", e.Code, e.ID, e.Message)
	}
	return fmt.Sprintf("wire: %s: %s", e.Code, e.Message)
}

// newMessage returns a pointer to a zero message of type t, or nil for an
// unknown type.
func newMessage(t string) Message {
	switch t {
	case TypeHello:
		return &Hello{}
	case TypeError:
		return &Error{}
	case TypePing:
		return &Ping{}
	case TypePong:
		return &Pong{}
	case TypeExecStart:
		return &ExecStart{}
	case TypeExecAccepted:
		return &ExecAccepted{}
	case TypeExecRejected:
		return &ExecRejected{}
	case TypeExecAttach:
		return &ExecAttach{}
	case TypeExecStarted:
		return &ExecStarted{}
	case TypeExecExit:
		return &ExecExit{}
	case TypeExecCancel:
		return &ExecCancel{}
	case TypeNetDial:
		return &NetDial{}
	case TypeNetDialed:
		return &NetDialed{}
	case TypeNetListen:
		return &NetListen{}
	case TypeNetListening:
		return &NetListening{}
	case TypeMachineReset:
		return &MachineReset{}
	case TypeMachineResetDone:
		return &MachineResetDone{}
	case TypeExecTTY:
		return &ExecTTY{}
	case TypeExecSignal:
		return &ExecSignal{}
	case TypeExecRun:
		return &ExecRun{}
	}
	return newFileMessage(t)
}

// typeFDs reports the descriptor count of message type t.
func typeFDs(t string) int {
	switch t {
	case TypeExecAttach, TypeExecRun:
		return 3
	case TypeNetDialed, TypeNetListening, TypeExecTTY, TypeFileOpened, TypeFileWatch:
		return 1
	}
	return 0
}

// FDCount reports how many descriptors a message of m's type carries: 3 for
// exec-attach and exec-run, 1 for net-dialed, net-listening, exec-tty, file-opened and
// file-watch, 0 otherwise
// (and for nil).
func FDCount(m Message) int {
	if isNil(m) {
		return 0
	}
	return typeFDs(m.Type())
}

// ProtocolError is a violation of protocol 2: a frame that cannot be
// accepted. Code is one of CodeBadFrame, CodeUnknownType, CodeFDMismatch,
// CodeTooLarge, CodeBadField or CodeUnsupportedProtocol, and is what the
// detecting side puts in the error frame it sends before closing.
type ProtocolError struct {
	Code    string
	Message string
}

func (e *ProtocolError) Error() string {
	return "wire: protocol error: " + e.Code + ": " + e.Message
}

// Frame returns the connection-level error frame that reports e to the peer.
func (e *ProtocolError) Frame() *Error {
	return &Error{Code: e.Code, Message: e.Message}
}

func protoErr(code, format string, args ...any) *ProtocolError {
	return &ProtocolError{Code: code, Message: fmt.Sprintf(format, args...)}
}

func isNil(m Message) bool {
	if m == nil {
		return true
	}
	v := reflect.ValueOf(m)
	return v.Kind() == reflect.Pointer && v.IsNil()
}

// validate checks the fields of a message that the protocol constrains
// regardless of who sends it.
func validate(m Message) error {
	var id string
	switch m := m.(type) {
	case *Hello:
		return nil
	case *Ping, *Pong:
		return nil
	case *Error:
		if m.Code == "" {
			return protoErr(CodeBadField, "error: empty code")
		}
		return nil
	case *ExecStart:
		id = m.ID
	case *ExecRun:
		id = m.ID
	case *ExecAccepted:
		id = m.ID
	case *ExecRejected:
		if m.Code == "" {
			return protoErr(CodeBadField, "exec-rejected: empty code")
		}
		id = m.ID
	case *ExecAttach:
		id = m.ID
	case *ExecStarted:
		id = m.ID
	case *ExecExit:
		n := 0
		if m.Code != nil {
			n++
		}
		if m.Signal != "" {
			n++
		}
		if m.NotStarted {
			n++
		}
		if n != 1 {
			return protoErr(CodeBadField, "exec-exit: %d outcomes, want exactly one of code, signal, notStarted", n)
		}
		if m.OOMKilled && m.Signal == "" {
			return protoErr(CodeBadField, "exec-exit: oomKilled without signal")
		}
		id = m.ID
	case *ExecCancel:
		id = m.ID
	case *NetDial:
		id = m.ID
	case *NetDialed:
		id = m.ID
	case *NetListen:
		id = m.ID
	case *NetListening:
		id = m.ID
	case *MachineReset:
		id = m.ID
	case *MachineResetDone:
		id = m.ID
	case *ExecTTY:
		id = m.ID
	case *ExecSignal:
		if m.Signal == "" {
			return protoErr(CodeBadField, "exec-signal: empty signal")
		}
		id = m.ID
	default:
		fid, ok := fileID(m)
		if !ok {
			return protoErr(CodeUnknownType, "unknown message %T", m)
		}
		id = fid
	}
	if id == "" {
		return protoErr(CodeBadField, "%s: empty id", m.Type())
	}
	return nil
}

// pointerTo returns m as a pointer to its struct, so that validate's type
// switch sees one spelling.
func pointerTo(m Message) Message {
	v := reflect.ValueOf(m)
	if v.Kind() == reflect.Pointer {
		return m
	}
	p := reflect.New(v.Type())
	p.Elem().Set(v)
	return p.Interface().(Message)
}

// Encode returns the frame for m: its JSON with the "type" member and, when
// FDCount(m) > 0, "fds": FDCount(m). It fails with a *ProtocolError when m
// is nil or unknown, breaks a field constraint that Decode enforces (an empty
// id, an exec-exit without exactly one outcome, an empty error code), or
// encodes to more than MaxFrame bytes. A frame Encode returns is accepted by
// Decode with FDCount(m) descriptors.
func Encode(m Message) ([]byte, error) {
	if isNil(m) {
		return nil, protoErr(CodeBadFrame, "nil message")
	}
	p := pointerTo(m)
	if err := validate(p); err != nil {
		return nil, err
	}
	b := encodeFast(p)
	if b == nil {
		var err error
		if b, err = encodeJSON(p); err != nil {
			return nil, err
		}
	}
	if len(b) > MaxFrame {
		return nil, protoErr(CodeTooLarge, "%s frame is %d bytes, limit %d", m.Type(), len(b), MaxFrame)
	}
	return b, nil
}

// encodeJSON is Encode's body, through encoding/json, for a validated
// message p (a pointer).
func encodeJSON(p Message) ([]byte, error) {
	body, err := json.Marshal(p)
	if err != nil {
		return nil, fmt.Errorf("wire: encode %s: %w", p.Type(), err)
	}
	var b bytes.Buffer
	b.Grow(len(body) + 32)
	b.WriteString(`{"type":`)
	t, _ := json.Marshal(p.Type())
	b.Write(t)
	if n := FDCount(p); n > 0 {
		fmt.Fprintf(&b, `,"fds":%d`, n)
	}
	if len(body) > 2 { // body is "{...}"; "{}" adds nothing
		b.WriteByte(',')
		b.Write(body[1:])
	} else {
		b.WriteByte('}')
	}
	return b.Bytes(), nil
}

// Decode parses one frame that arrived with nfds descriptors and returns a
// pointer to the message struct of its type (*Hello, *ExecStart, ...).
// Unknown members are ignored. Every violation is returned as a
// *ProtocolError: CodeTooLarge for more than MaxFrame bytes; CodeBadFrame
// for anything that is not one JSON object with a string "type";
// CodeUnknownType for an unknown "type"; CodeFDMismatch when "fds" is not
// the type's descriptor count or nfds differs from it; CodeBadField for a
// member of the wrong JSON type or a constraint Encode also enforces.
// Decode never retains b.
func Decode(b []byte, nfds int) (Message, error) {
	if len(b) > MaxFrame {
		return nil, protoErr(CodeTooLarge, "frame is %d bytes, limit %d", len(b), MaxFrame)
	}
	if m := decodeFast(b, nfds); m != nil {
		return m, nil
	}
	return decodeJSON(b, nfds)
}

// decodeJSON is Decode's body, through encoding/json.
func decodeJSON(b []byte, nfds int) (Message, error) {
	var env map[string]json.RawMessage
	if err := json.Unmarshal(b, &env); err != nil {
		return nil, protoErr(CodeBadFrame, "not a JSON object: %v", err)
	}
	if env == nil {
		return nil, protoErr(CodeBadFrame, "not a JSON object: null")
	}
	rawType, ok := env["type"]
	if !ok {
		return nil, protoErr(CodeBadFrame, `missing "type"`)
	}
	var t string
	if err := json.Unmarshal(rawType, &t); err != nil || bytes.Equal(bytes.TrimSpace(rawType), []byte("null")) {
		return nil, protoErr(CodeBadFrame, `"type" is not a string`)
	}
	m := newMessage(t)
	if m == nil {
		return nil, protoErr(CodeUnknownType, "unknown type %q", truncate(t, 64))
	}
	declared := 0
	if rawFDs, ok := env["fds"]; ok {
		if err := json.Unmarshal(rawFDs, &declared); err != nil || declared < 0 ||
			bytes.Equal(bytes.TrimSpace(rawFDs), []byte("null")) {
			return nil, protoErr(CodeFDMismatch, `%s: "fds" is not a count`, t)
		}
	}
	want := typeFDs(t)
	if declared != want {
		return nil, protoErr(CodeFDMismatch, "%s declares %d descriptors, carries %d", t, declared, want)
	}
	if nfds != declared {
		return nil, protoErr(CodeFDMismatch, "%s declares %d descriptors, packet carried %d", t, declared, nfds)
	}
	if err := json.Unmarshal(b, m); err != nil {
		var ute *json.UnmarshalTypeError
		if errors.As(err, &ute) {
			return nil, protoErr(CodeBadField, "%s: field %q: %v", t, ute.Field, err)
		}
		return nil, protoErr(CodeBadField, "%s: %v", t, err)
	}
	if err := validate(m); err != nil {
		return nil, err
	}
	return m, nil
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}
