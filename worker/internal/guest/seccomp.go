package guest

import (
	"fmt"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Sessions write the workspace as its host owner (an idmapped mount), who
// may be root. A set-user-ID or set-group-ID file made there would hand
// that owner's identity to whoever runs it on the host, so the init, before
// forking any session, installs a seccomp filter (inherited by every
// session) that refuses with EPERM every mode argument carrying S_ISUID or
// S_ISGID: chmod and friends, open and mknod with O_CREAT-style modes. The
// calls whose modes it cannot inspect (openat2 passes a struct, io_uring
// performs opens itself) fail with ENOSYS, so libc and runtimes fall back
// to the inspectable ones.

// modeRule denies syscall nr when its argument arg has S_ISUID or S_ISGID.
type modeRule struct {
	nr  uint32
	arg uint32
}

const setIDBits = unix.S_ISUID | unix.S_ISGID

func bpfStmt(code uint16, k uint32) unix.SockFilter {
	return unix.SockFilter{Code: code, K: k}
}

func bpfJump(code uint16, k uint32, jt, jf uint8) unix.SockFilter {
	return unix.SockFilter{Code: code, Jt: jt, Jf: jf, K: k}
}

// setIDFilter assembles the filter for one architecture. Arguments are
// read as their low 32 bits (little-endian seccomp_data).
func setIDFilter(arch uint32, x32 bool, rules []modeRule, enosys []uint32) []unix.SockFilter {
	const (
		ld   = unix.BPF_LD | unix.BPF_W | unix.BPF_ABS
		jeq  = unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_K
		jge  = unix.BPF_JMP | unix.BPF_JGE | unix.BPF_K
		jset = unix.BPF_JMP | unix.BPF_JSET | unix.BPF_K
		ret  = unix.BPF_RET | unix.BPF_K
	)
	eperm := uint32(unix.SECCOMP_RET_ERRNO) | uint32(unix.EPERM)
	prog := []unix.SockFilter{
		bpfStmt(ld, 4), // seccomp_data.arch
		bpfJump(jeq, arch, 1, 0),
		bpfStmt(ret, unix.SECCOMP_RET_KILL_PROCESS),
		bpfStmt(ld, 0), // seccomp_data.nr
	}
	if x32 {
		prog = append(prog, bpfJump(jge, 0x40000000, 0, 1), bpfStmt(ret, eperm))
	}
	for _, r := range rules {
		prog = append(prog,
			bpfJump(jeq, r.nr, 0, 4),
			bpfStmt(ld, 16+8*r.arg), // seccomp_data.args[arg], low half
			bpfJump(jset, setIDBits, 0, 1),
			bpfStmt(ret, eperm),
			bpfStmt(ld, 0),
		)
	}
	for _, nr := range enosys {
		prog = append(prog, bpfJump(jeq, nr, 0, 1), bpfStmt(ret, uint32(unix.SECCOMP_RET_ERRNO)|uint32(unix.ENOSYS)))
	}
	return append(prog, bpfStmt(ret, unix.SECCOMP_RET_ALLOW))
}

// installSetIDFilter installs the filter on the calling thread, whose
// children inherit it. It needs CAP_SYS_ADMIN in the machine's user
// namespace, which the init has.
func installSetIDFilter() error {
	prog := setIDFilterForArch()
	if prog == nil {
		return fmt.Errorf("seccomp: no set-id filter for this architecture")
	}
	fprog := unix.SockFprog{Len: uint16(len(prog)), Filter: &prog[0]}
	if err := unix.Prctl(unix.PR_SET_SECCOMP, unix.SECCOMP_MODE_FILTER, uintptr(unsafe.Pointer(&fprog)), 0, 0); err != nil {
		return fmt.Errorf("seccomp: %w", err)
	}
	return nil
}
