// Package wire implements protocol 2, the protocol spoken between corral's
// core (the machine gateway, the client) and the privileged worker (the
// server). It is pinned: programs other than corral speak it, so every byte
// described here is part of the contract.
//
// # Transport and framing
//
// The transport is a Unix SOCK_SEQPACKET socket ("unixpacket" in Go). One
// packet is one frame: one JSON object of at most [MaxFrame] bytes whose
// "type" member names the message. A larger packet would be truncated by the
// kernel; the receiver learns every packet's full length (this package
// receives with MSG_TRUNC, which reports it; peeking with
// MSG_PEEK|MSG_TRUNC first does the same), so an oversized packet is
// detected and reported as a protocol error ("too-large") instead of being
// silently cut.
//
// File descriptors ride as SCM_RIGHTS ancillary data on the packet that
// declares them with "fds": n, and the packet must carry exactly n of them.
// Only exec-attach (3), net-dialed (1) and, of the announced extensions,
// exec-run (3), net-listening (1), exec-tty (1), file-opened (1) and
// file-watch (1) carry descriptors. Descriptors are
// received with MSG_CMSG_CLOEXEC and every descriptor received on a packet is
// closed when anything about that packet is wrong.
//
// A count mismatch, an oversized packet, bad JSON, a frame that is not an
// object, a missing or unknown "type", or a malformed field is a protocol
// error. The side that detects it answers an error frame
//
//	{"type":"error","code":"<code>","message":"<text>"}
//
// and closes the connection (closing every descriptor it received on it).
// [Recv] and [Decode] return such violations as *[ProtocolError].
//
// # Messages
//
// Client (core) on the left, worker on the right; [n] is the number of
// descriptors carried by the packet.
//
//	client                                        worker
//	  │                                              │
//	  │── hello {protocol:2} ───────────────────────►│  first frame, always
//	  │◄─────────────────── hello {protocol:2,worker}│  or error "unsupported-protocol",
//	  │                                              │  then the worker closes
//	  │                                              │
//	  │── exec-start {id,project,account,lease, ────►│
//	  │               argv,cwd,env}                  │
//	  │◄───────────────────────── exec-accepted {id} │  or exec-rejected {id,code,message}
//	  │                                              │
//	  │── exec-attach {id,fds:3} [stdin,stdout,stderr]►  socket ends the client made;
//	  │                                              │  they become the child's fd 0/1/2
//	  │◄────────────────────────── exec-started {id} │
//	  │                                              │
//	  │── exec-cancel {id} ─────────────────────────►│  optional, idempotent; kills the
//	  │                                              │  session's whole process tree
//	  │◄──────── exec-exit {id, code|signal|notStarted}  exactly one outcome; always last
//	  │                                              │  for an accepted session
//	  │                                              │
//	  │── net-dial {id,project,port} ───────────────►│
//	  │◄───────────────── net-dialed {id,fds:1} [conn]  a socket connected inside the
//	  │                                              │  machine's network namespace, or
//	  │◄───────────────────── error {id,code,message}│  error (e.g. "dial-failed")
//	  │                                              │
//	  │── ping {id} ────────────────────────────────►│  either side may ping;
//	  │◄───────────────────────────────── pong {id}  │  the other answers pong
//	  │                                              │
//	  │── (close) ──────────────────────────────────►│  cancels all of the connection's
//	  │                                              │  sessions
//
// # Announced extensions
//
// The worker's hello may list "features" (the Feature constants). A client
// sends a feature's optional members only to a worker that announced it,
// and a worker sends a feature's optional members only where it announced
// it; a frame without them means what it meant before. The features so far:
//
//	feature        member                              in
//	user           "user": name or numeric uid         exec-start
//	project-forget "forget": true (the project was     machine-reset
//	                 deleted: its home and disk go too
//	                 and its id range is freed)
//	machine-spec   project."image": image name         exec-start, net-dial
//	               project."limits": {memory, pids,
//	                 cpuMillis, disk, tmp}
//	oom-killed     "oomKilled": true (with "signal")   exec-exit
//	net-listen     messages net-listen {id,project,port}
//	               → net-listening {id,fds:1} [listener]
//	               or error {id,code,message}
//	tty            "tty": {rows, cols} (uint16 each)   exec-start
//	               the frame exec-tty {id,fds:1}       worker → client
//
// net-listen asks for a TCP socket listening on 127.0.0.1:port inside the
// network namespace of the project's running machine (it starts none:
// "dial-failed" when there is none, or when the port is taken). The worker
// passes the descriptor and keeps no copy; connections accepted on it are
// the client's, which relays them (corral's egress proxies). The listener
// keeps listening after the machine stops, with nothing left to connect to
// it: the client closes it.
//
// A terminal session (tty) runs on a pseudo-terminal the worker allocates
// inside the machine, from the machine's own devpts: the slave is the
// session's controlling terminal and its descriptors 0, 1 and 2, sized
// rows × cols before the program starts. The client still sends exec-attach
// with three descriptors (any, e.g. /dev/null; the worker closes them
// unused), and the worker passes the master back before exec-started:
//
//	│── exec-start {id,…,tty:{rows,cols}} ───────►│
//	│◄───────────────────────── exec-accepted {id} │
//	│── exec-attach {id,fds:3} [unused] ──────────►│
//	│◄─────────────────── exec-tty {id,fds:1} [pty]│  the master: the client
//	│◄────────────────────────── exec-started {id} │  reads, writes and resizes
//	│◄──────── exec-exit {id, code|signal|notStarted}  it (TIOCSWINSZ) itself
//
// No frame resizes a terminal: the client holds the master. exec-exit
// reports the session's program as for any session; the master reads EIO
// (end of file) once no process holds the slave.
//
// New rejection codes of these features: "bad-user", "bad-image".
//
// Features may also add messages, which a client sends only to a worker
// that announced them:
//
//	feature        client                      worker
//	machine-reset  machine-reset {id,project}  machine-reset-done {id}, or
//	                                           error {id,code,message}
//	                                           ("busy": the machine has
//	                                           sessions)
//	exec-signal    exec-signal {id,signal}     nothing (an exec-exit follows
//	                                           if the signal ended it)
//	exec-run       exec-run {id,…,fds:3}       exec-started {id} (no
//	                 [stdin,stdout,stderr]     exec-accepted), or
//	                                           exec-rejected {id,code,message}
//
// exec-run is exec-start and exec-attach in one frame: exec-start's members
// (those of its features too) and the three descriptors exec-attach would
// carry. A command is then three frames instead of five:
//
//	│── exec-run {id,…,fds:3} [stdin,stdout,stderr] ►│
//	│◄──────────────────────────── exec-started {id} │  accepted and started
//	│◄──────── exec-exit {id, code|signal|notStarted}│
//
// The worker sends no exec-accepted for it: exec-started (preceded, for a
// terminal session, by exec-tty), or an exec-exit {notStarted} for a
// program that could not run, says the session was accepted. A refused
// exec-run is answered exec-rejected alone, its descriptors closed unused,
// and nothing follows. A terminal session's three descriptors are closed
// unused, as its exec-attach's are. exec-start and exec-attach stay valid
// on the same connection.
//
// exec-signal sends a signal, named as in exec-exit ("SIGTERM"), to every
// process of a running session's tree: its pid namespace but the
// namespace's holder, orphans included (exec-cancel kills the same tree).
// An unknown or ended session, or an unknown name, is ignored; processes
// forked while it is delivered may miss it.
//
//	files          file-request {id,project,user,op,   file-entries {id,entries}…,
//	               path,to,mode,recursive,depth,limit}  then file-opened {id,fds:1}
//	                                                   [fd], file-result {id}, or
//	                                                   error {id,code,message}
//	               file-watch {id,project,user,path,   file-entries…, then
//	               recursive,fds:1} [inotify]          file-result {id}, or error
//
// files opens a project's files inside its machine (started if none runs)
// as the request's user and passes descriptors, never bytes: a read's file,
// a create's temporary file (which the client writes, fsyncs and has
// renamed over the target: an atomic replace), a watch's inotify
// descriptor. The worker resolves each path with openat2 under
// RESOLVE_IN_ROOT and RESOLVE_NO_MAGICLINKS against the machine's root (the
// init's /proc/<pid>/root), with the user's uids, gids and groups and no
// capability on a thread of its own (guest root: its override capabilities
// on a retry, limited to files of the machine's ids); procfs, sysfs and
// cgroupfs are refused. file-watch hands the client's inotify descriptor
// back to add the watches of a directory that appeared. Its ops, answers
// and error codes ("not-found", "permission-denied", "bad-path", …) are
// drawn in files.go.
//
// machine-reset discards the state a project's machine keeps between
// starts (the upper layer of its root filesystem), stopping the machine
// first; the workspace and the home are kept.
//
// A worker may refuse a connection because of who the peer is (corral's
// worker serves only root and the daemon's uid, by SO_PEERCRED): it then
// sends, before interpreting anything the peer sent, the connection error
// frame
//
//	{"type":"error","code":"forbidden","message":"<text>"}
//
// and closes. A client reads it where it expects the worker's hello.
//
// Session ids are chosen by the client and are unique per connection; every
// frame about a session carries its id. An error frame about one request
// carries that request's id; an error frame without an id is about the
// connection, which the sender then closes.
//
// # Go API
//
// [Encode] and [Decode] convert between messages and frames and perform no
// I/O, through encoding/json; they are what the fuzz targets exercise.
// [Conn] sends and receives frames with their descriptors over a connected
// socket. [Listen], [Dial], [ClientHello] and [ServerHello] set up
// connections. Decode returns pointers
// to the message structs (*Hello, *ExecStart, ...), so receivers type-switch
// on pointer types; Send and Encode accept values or pointers.
package wire
