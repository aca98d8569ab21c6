package confine

import (
	"encoding/binary"
	"log/slog"
	"runtime"
	"strconv"
	"sync"

	"golang.org/x/sys/unix"
)

// initCode is the machine code of the static init (x86-64; see
// staticInit), loaded at initBase+initHeader:
//
//	xor    %eax,%eax          31 c0
//	push   %rax ×3            50 50 50         sa_mask, sa_restorer, sa_flags
//	push   $1                 6a 01            sa_handler = SIG_IGN
//	mov    $13,%eax           b8 0d 00 00 00   rt_sigaction(
//	mov    $17,%edi           bf 11 00 00 00     SIGCHLD,
//	mov    %rsp,%rsi          48 89 e6           &act,
//	xor    %edx,%edx          31 d2              NULL,
//	mov    $8,%r10d           41 ba 08 00 00 00  8): the kernel reaps orphans
//	syscall                   0f 05
//	loop:
//	xor    %eax,%eax          31 c0            read(
//	xor    %edi,%edi          31 ff              0,
//	mov    %rsp,%rsi          48 89 e6           the stack,
//	mov    $1,%edx            ba 01 00 00 00     1)
//	syscall                   0f 05
//	test   %rax,%rax          48 85 c0
//	jg     loop               7f ed            until EOF or an error
//	mov    $231,%eax          b8 e7 00 00 00   exit_group(
//	xor    %edi,%edi          31 ff              0)
//	syscall                   0f 05
var initCode = []byte{
	0x31, 0xc0, 0x50, 0x50, 0x50, 0x6a, 0x01,
	0xb8, 0x0d, 0x00, 0x00, 0x00, 0xbf, 0x11, 0x00, 0x00, 0x00,
	0x48, 0x89, 0xe6, 0x31, 0xd2, 0x41, 0xba, 0x08, 0x00, 0x00, 0x00, 0x0f, 0x05,
	0x31, 0xc0, 0x31, 0xff, 0x48, 0x89, 0xe6, 0xba, 0x01, 0x00, 0x00, 0x00, 0x0f, 0x05,
	0x48, 0x85, 0xc0, 0x7f, 0xed,
	0xb8, 0xe7, 0x00, 0x00, 0x00, 0x31, 0xff, 0x0f, 0x05,
}

const (
	initBase   = 0x400000 // where the file is mapped
	initHeader = 64 + 2*56
)

// initELF returns initCode as a static ELF executable: a 64-byte header
// and two program headers, a PT_LOAD mapping the whole file readable and
// executable at initBase and a PT_GNU_STACK asking for a stack that is not
// executable.
func initELF() []byte {
	le := binary.LittleEndian
	b := make([]byte, initHeader, initHeader+len(initCode))
	copy(b, "\x7fELF\x02\x01\x01") // 64-bit, little-endian, ELF version 1, System V ABI
	le.PutUint16(b[16:], 2)        // ET_EXEC
	le.PutUint16(b[18:], 62)       // EM_X86_64
	le.PutUint32(b[20:], 1)        // EV_CURRENT
	le.PutUint64(b[24:], initBase+initHeader)
	le.PutUint64(b[32:], 64) // program headers' offset
	le.PutUint16(b[52:], 64) // header size
	le.PutUint16(b[54:], 56) // program header size
	le.PutUint16(b[56:], 2)  // program headers
	load := b[64:]
	le.PutUint32(load[0:], 1) // PT_LOAD
	le.PutUint32(load[4:], 5) // PF_R|PF_X
	le.PutUint64(load[16:], initBase)
	le.PutUint64(load[24:], initBase)
	le.PutUint64(load[32:], uint64(initHeader+len(initCode)))
	le.PutUint64(load[40:], uint64(initHeader+len(initCode)))
	le.PutUint64(load[48:], 0x1000)
	stack := b[64+56:]
	le.PutUint32(stack[0:], 0x6474e551) // PT_GNU_STACK
	le.PutUint32(stack[4:], 6)          // PF_R|PF_W
	le.PutUint64(stack[48:], 16)
	return append(b, initCode...)
}

var static struct {
	sync.Mutex
	tried    bool   // made (or found impossible) once
	path     string // "": none
	fd       int
	dev, ino uint64 // the memfd's identity, checked at every use
}

// staticInit returns the path of the static init, "/proc/self/fd/N" of a
// sealed memfd that holds it, or "" if this machine cannot have it (not
// x86-64, memfds cannot be executable, /proc is missing). The static init
// is the cheapest init a tree can have: no dynamic loader, three system
// calls; it ignores SIGCHLD, so that the kernel reaps the orphans
// reparented to it, and reads its standard input (the lifeline) until EOF.
// A bounded command's init costs about a tenth of /bin/cat's start.
//
// Landlock does not restrict a memfd (it lies on no mount a path can
// reach), so the init's thread needs no rule for it; nothing can write it
// (sealed), and a command cannot reach this process's descriptor. The
// descriptor is kept at 1000 or above, away from the numbers ordinary
// opens reuse, and its identity is checked at every call: if code that did
// not own it closed it and the number now names another file, a new memfd
// is made (the path then changes) instead of executing that file.
func staticInit() string {
	static.Lock()
	defer static.Unlock()
	if static.path != "" {
		var st unix.Stat_t
		if unix.Fstat(static.fd, &st) == nil && st.Dev == static.dev && st.Ino == static.ino {
			return static.path
		}
		slog.Error("confine: the static init's descriptor was closed or replaced by another owner; making it again", "fd", static.fd)
		static.path, static.tried = "", false // the number is not ours any more: never closed here
	}
	if static.tried {
		return ""
	}
	static.tried = true
	if runtime.GOARCH != "amd64" {
		return ""
	}
	fd, err := unix.MemfdCreate("corral-init", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING|unix.MFD_EXEC)
	if err != nil {
		return ""
	}
	if high, err := unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, offlineFDMin); err == nil {
		unix.Close(fd)
		fd = high
	} else if fd < 3 {
		unix.Close(fd) // never one of the standard descriptors a start replaces
		return ""
	}
	elf := initELF()
	if n, err := unix.Write(fd, elf); err != nil || n != len(elf) {
		unix.Close(fd)
		return ""
	}
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS,
		unix.F_SEAL_SEAL|unix.F_SEAL_SHRINK|unix.F_SEAL_GROW|unix.F_SEAL_WRITE); err != nil {
		unix.Close(fd)
		return ""
	}
	path := "/proc/self/fd/" + strconv.Itoa(fd)
	var st unix.Stat_t
	if unix.Access(path, unix.X_OK) != nil || unix.Fstat(fd, &st) != nil {
		unix.Close(fd)
		return ""
	}
	static.path, static.fd, static.dev, static.ino = path, fd, st.Dev, st.Ino // kept open for the process's life
	return static.path
}
