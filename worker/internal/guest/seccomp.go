package guest

import (
	"fmt"
	"slices"
	"sync"
	"unsafe"

	"github.com/elastic/go-seccomp-bpf/arch"
	dockerprofile "github.com/moby/profiles/seccomp"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/net/bpf"
	"golang.org/x/sys/unix"
)

// The syscall policy of sessions is Docker's default seccomp profile
// (github.com/moby/profiles/seccomp, evaluated for the capabilities guest
// root keeps, rootCaps, on this kernel), with these changes, checked
// first:
//
//   - Set-id modes. Sessions write the workspace as its host owner (an
//     idmapped mount), who may be root: a set-user-ID or set-group-ID file
//     made there would hand that owner's identity to whoever runs it on the
//     host. Every mode argument carrying S_ISUID or S_ISGID is refused with
//     EPERM: chmod, fchmod, fchmodat(2), open, openat, creat, mknod(at).
//   - ENOSYS for the calls whose arguments a filter cannot inspect, so that
//     libc and runtimes fall back to ones it can: clone3 (flags in a
//     struct; glibc falls back to clone, whose flags are checked, as in
//     Docker), openat2 (mode in a struct) and io_uring_* (which performs
//     opens itself and which Docker no longer allows).
//   - setns, which Docker allows only with CAP_SYS_ADMIN, may enter pid
//     and mount namespaces (never a user namespace, nor "any type"): the
//     init's forking threads, under the same filter, enter their holders'
//     namespaces for each fork. No session can: the kernel requires
//     CAP_SYS_ADMIN, which no session holds (see rootCaps).
//
// Namespaces are otherwise Docker's: clone may create none (the flags are
// checked), unshare is refused, clone3 answers ENOSYS.
//
// Everything else is Docker's: a call not allowed fails with EPERM (no
// mount, umount2, pivot_root, move_mount, open_tree, fsopen, fsmount,
// keyctl, add_key, request_key, bpf, perf_event_open, userfaultfd,
// kernel-module, reboot, swap, clock- and time-setting, acct, quotactl,
// lookup_dcookie, ...; personality only with Docker's five values;
// ptrace, process_vm_readv and process_vm_writev on kernels from 4.8,
// whose ptrace cannot bypass the filter; socket only for Docker's address
// families). Unlike Docker, the 32-bit x86 and x32 system call ABIs are
// refused as a whole (EPERM and ENOSYS): the filter knows the native
// architecture only, and a 32-bit binary cannot run in a machine.
//
// The profile is compiled here, to classic BPF (golang.org/x/net/bpf),
// with system call numbers from github.com/elastic/go-seccomp-bpf/arch.
// That package's own compiler is not used: it does not reload the system
// call number after an argument check, so every rule after a conditional
// one compares an argument with system call numbers (TestPolicyDecisions
// fails with it). The program is: the architecture check, the x32 check,
// then one block per system call — compare the number, then its rules in
// order, each a conjunction of argument comparisons that returns its
// action when all hold, and the default action after the last — and runs
// of unconditionally allowed calls sharing one return. Every block ends
// in a return, so the accumulator holds the number wherever a block
// starts. The kernel caches the verdict of every call whose verdict does
// not depend on its arguments (since Linux 5.11), so only the calls with
// argument rules (open and openat, chmod, clone, socket, ...) run the
// program; they come first.
//
// Arguments are compared as 64-bit values, except the set-id bits, which
// are looked for in the low 32 bits of the mode (a mode_t is 32 bits
// wide).

// sessionPolicy returns the policy's program, assembled once.
var sessionPolicy = sync.OnceValues(func() ([]bpf.Instruction, error) {
	prog, _, err := assemblePolicy()
	return prog, err
})

const (
	setIDBits = unix.S_ISUID | unix.S_ISGID
	// initNamespaces are the namespaces the init's forking threads enter
	// (setns): those of session holders.
	initNamespaces = unix.CLONE_NEWPID | unix.CLONE_NEWNS
)

// Verdicts.
const (
	retAllow  = unix.SECCOMP_RET_ALLOW
	retEPERM  = unix.SECCOMP_RET_ERRNO | uint32(unix.EPERM)
	retENOSYS = unix.SECCOMP_RET_ERRNO | uint32(unix.ENOSYS)
)

// op is an argument comparison.
type op int

const (
	opEqual     op = iota // arg == value
	opNotEqual            // arg != value
	opLess                // arg < value (unsigned)
	opNoneSet             // arg & value == 0
	opAnySetLow           // low 32 bits of arg & value != 0
)

// cond compares argument arg with value.
type cond struct {
	arg   uint32
	op    op
	value uint64
}

// rule returns verdict when every one of its conditions holds.
type rule struct {
	conds   []cond
	verdict uint32
}

// modeRules name, per syscall, the index of its mode argument.
var modeRules = []struct {
	name string
	arg  uint32
}{
	{"openat", 3}, {"open", 2}, {"chmod", 1}, {"fchmod", 1}, {"fchmodat", 2}, {"fchmodat2", 2},
	{"creat", 1}, {"mknod", 1}, {"mknodat", 2},
}

// enosys are answered ENOSYS.
var enosys = []string{"clone3", "openat2", "io_uring_setup", "io_uring_enter", "io_uring_register"}

// policy is a compiled-to-be profile: rules per system call, in order.
type policy struct {
	info  *arch.Info
	order []string // names in block order
	rules map[string][]rule
	// skipped are names unknown to the architecture's table.
	skipped []string
}

func (p *policy) add(name string, r rule) {
	if _, ok := p.info.SyscallNames[name]; !ok {
		if !slices.Contains(p.skipped, name) {
			p.skipped = append(p.skipped, name)
		}
		return
	}
	rs, ok := p.rules[name]
	if !ok {
		p.order = append(p.order, name)
	}
	if len(rs) > 0 && len(rs[len(rs)-1].conds) == 0 {
		return // an unconditional rule already decides
	}
	p.rules[name] = append(rs, r)
}

// assemblePolicy builds the policy's BPF program. skipped are the syscall
// names of Docker's profile that the architecture's table does not know
// (names of other ABIs, such as the 32-bit *64 calls): refused, as every
// call not allowed.
func assemblePolicy() (prog []bpf.Instruction, skipped []string, err error) {
	info, err := arch.GetInfo("")
	if err != nil {
		return nil, nil, fmt.Errorf("seccomp: %w", err)
	}
	p := &policy{info: info, rules: map[string][]rule{}}
	// Set-id modes first; the same calls without them are allowed.
	for _, r := range modeRules {
		if _, ok := info.SyscallNames[r.name]; !ok {
			continue // not on this architecture (chmod, open, ... on arm64)
		}
		p.add(r.name, rule{conds: []cond{{r.arg, opAnySetLow, setIDBits}}, verdict: retEPERM})
		p.add(r.name, rule{verdict: retAllow})
	}
	p.add("setns", rule{conds: []cond{{1, opNoneSet, ^uint64(initNamespaces)}, {1, opNotEqual, 0}}, verdict: retAllow})
	p.add("setns", rule{verdict: retEPERM})
	for _, n := range enosys {
		p.add(n, rule{verdict: retENOSYS})
	}

	docker, err := dockerprofile.GetDefaultProfile(&specs.Spec{Process: &specs.Process{
		Capabilities: &specs.LinuxCapabilities{Bounding: capNames(rootCaps)},
	}})
	if err != nil {
		return nil, nil, fmt.Errorf("seccomp: Docker's profile: %w", err)
	}
	if docker.DefaultAction != specs.ActErrno || docker.DefaultErrnoRet == nil || *docker.DefaultErrnoRet != uint(unix.EPERM) {
		return nil, nil, fmt.Errorf("seccomp: Docker's profile defaults to %s", docker.DefaultAction)
	}
	for _, s := range docker.Syscalls {
		r := rule{}
		switch s.Action {
		case specs.ActAllow:
			r.verdict = retAllow
		case specs.ActErrno:
			r.verdict = retEPERM
			if s.ErrnoRet != nil {
				r.verdict = unix.SECCOMP_RET_ERRNO | uint32(*s.ErrnoRet)&unix.SECCOMP_RET_DATA
			}
		default:
			return nil, nil, fmt.Errorf("seccomp: Docker's profile action %s for %v", s.Action, s.Names)
		}
		if r.conds, err = conditions(s.Args); err != nil {
			return nil, nil, fmt.Errorf("seccomp: %v: %w", s.Names, err)
		}
		for _, n := range s.Names {
			p.add(n, r)
		}
	}
	prog, err = p.compile()
	if err != nil {
		return nil, nil, err
	}
	return prog, p.skipped, nil
}

// conditions converts a Docker rule's argument comparisons (all of which
// must hold).
func conditions(args []specs.LinuxSeccompArg) ([]cond, error) {
	var out []cond
	for _, a := range args {
		c := cond{arg: uint32(a.Index), value: a.Value}
		switch a.Op {
		case specs.OpEqualTo:
			c.op = opEqual
		case specs.OpNotEqual:
			c.op = opNotEqual
		case specs.OpLessThan:
			c.op = opLess
		case specs.OpMaskedEqual:
			// (arg & mask) == 0 is the only masked comparison Docker uses.
			if a.ValueTwo != 0 {
				return nil, fmt.Errorf("masked comparison with %#x", a.ValueTwo)
			}
			c.op = opNoneSet
		default:
			return nil, fmt.Errorf("comparison %s", a.Op)
		}
		if c.arg > 5 {
			return nil, fmt.Errorf("argument %d", c.arg)
		}
		out = append(out, c)
	}
	return out, nil
}

// seccomp_data offsets; arguments are little-endian 64-bit words.
const (
	offNR   = 0
	offArch = 4
	offArgs = 16
)

func ldLo(arg uint32) bpf.Instruction { return bpf.LoadAbsolute{Off: offArgs + 8*arg, Size: 4} }
func ldHi(arg uint32) bpf.Instruction { return bpf.LoadAbsolute{Off: offArgs + 8*arg + 4, Size: 4} }

// jump is a conditional jump whose targets are "next" (0), "fail" (the
// end of the rule) or a number of instructions to skip.
type jump struct {
	cond   bpf.JumpTest
	val    uint32
	jt, jf int // skip counts; fail: -1
}

const fail = -1

// condCode returns c's instructions: loads, and jumps whose fail targets
// are fail, resolved by the caller.
func condCode(c cond) []any {
	hi, lo := uint32(c.value>>32), uint32(c.value)
	switch c.op {
	case opEqual:
		return []any{ldHi(c.arg), jump{cond: bpf.JumpEqual, val: hi, jf: fail}, ldLo(c.arg), jump{cond: bpf.JumpEqual, val: lo, jf: fail}}
	case opNotEqual:
		return []any{ldHi(c.arg), jump{cond: bpf.JumpEqual, val: hi, jf: 2}, ldLo(c.arg), jump{cond: bpf.JumpEqual, val: lo, jt: fail}}
	case opLess:
		return []any{ldHi(c.arg), jump{cond: bpf.JumpGreaterThan, val: hi, jt: fail}, jump{cond: bpf.JumpEqual, val: hi, jf: 2},
			ldLo(c.arg), jump{cond: bpf.JumpGreaterOrEqual, val: lo, jt: fail}}
	case opNoneSet:
		var out []any
		if hi != 0 {
			out = append(out, ldHi(c.arg), jump{cond: bpf.JumpBitsSet, val: hi, jt: fail})
		}
		if lo != 0 {
			out = append(out, ldLo(c.arg), jump{cond: bpf.JumpBitsSet, val: lo, jt: fail})
		}
		return out
	case opAnySetLow:
		return []any{ldLo(c.arg), jump{cond: bpf.JumpBitsSet, val: lo, jf: fail}}
	}
	panic("seccomp: unknown comparison")
}

// compile assembles p.
func (p *policy) compile() ([]bpf.Instruction, error) {
	prog := []bpf.Instruction{
		bpf.LoadAbsolute{Off: offArch, Size: 4},
		bpf.JumpIf{Cond: bpf.JumpEqual, Val: uint32(p.info.ID), SkipTrue: 1},
		bpf.RetConstant{Val: retEPERM},
		bpf.LoadAbsolute{Off: offNR, Size: 4},
	}
	if p.info.ID == arch.X86_64.ID {
		prog = append(prog,
			bpf.JumpIf{Cond: bpf.JumpGreaterOrEqual, Val: uint32(arch.X32.SeccompMask), SkipFalse: 1},
			bpf.RetConstant{Val: retENOSYS})
	}
	var allowRun []uint32 // unconditionally allowed, pending
	flush := func() {
		for len(allowRun) > 0 {
			n := min(len(allowRun), 200)
			for i, nr := range allowRun[:n] {
				prog = append(prog, bpf.JumpIf{Cond: bpf.JumpEqual, Val: nr, SkipTrue: uint8(n - i)})
			}
			prog = append(prog, bpf.Jump{Skip: 1}, bpf.RetConstant{Val: retAllow})
			allowRun = allowRun[n:]
		}
	}
	for _, name := range p.order {
		nr := uint32(p.info.SyscallNames[name])
		rs := p.rules[name]
		if len(rs) == 1 && len(rs[0].conds) == 0 && rs[0].verdict == retAllow {
			allowRun = append(allowRun, nr)
			continue
		}
		flush()
		body, err := ruleBlock(rs)
		if err != nil {
			return nil, fmt.Errorf("seccomp: %s: %w", name, err)
		}
		if len(body) <= 255 {
			prog = append(prog, bpf.JumpIf{Cond: bpf.JumpEqual, Val: nr, SkipFalse: uint8(len(body))})
		} else {
			prog = append(prog, bpf.JumpIf{Cond: bpf.JumpEqual, Val: nr, SkipTrue: 1}, bpf.Jump{Skip: uint32(len(body))})
		}
		prog = append(prog, body...)
	}
	flush()
	prog = append(prog, bpf.RetConstant{Val: retEPERM})
	if len(prog) > unix.BPF_MAXINSNS {
		return nil, fmt.Errorf("seccomp: program of %d instructions", len(prog))
	}
	return prog, nil
}

// ruleBlock compiles one system call's rules: each returns its verdict if
// its conditions hold, else control passes to the next; after the last,
// the default verdict. The block always returns.
func ruleBlock(rs []rule) ([]bpf.Instruction, error) {
	var out []bpf.Instruction
	for _, r := range rs {
		var code []any
		for _, c := range r.conds {
			code = append(code, condCode(c)...)
		}
		// The rule is code then its return; fail jumps go past that return.
		for i, x := range code {
			switch x := x.(type) {
			case bpf.Instruction:
				out = append(out, x)
			case jump:
				toFail := len(code) - i // past the remaining code and the return
				resolve := func(v int) (uint8, error) {
					if v == fail {
						v = toFail
					}
					if v < 0 || v > 255 {
						return 0, fmt.Errorf("jump of %d", v)
					}
					return uint8(v), nil
				}
				jt, err := resolve(x.jt)
				if err != nil {
					return nil, err
				}
				jf, err := resolve(x.jf)
				if err != nil {
					return nil, err
				}
				out = append(out, bpf.JumpIf{Cond: x.cond, Val: x.val, SkipTrue: jt, SkipFalse: jf})
			}
		}
		out = append(out, bpf.RetConstant{Val: r.verdict})
		if len(r.conds) == 0 {
			return out, nil
		}
	}
	return append(out, bpf.RetConstant{Val: retEPERM}), nil
}

// installFilter installs the policy on the calling thread, whose children
// inherit it. The thread must have no_new_privs set or CAP_SYS_ADMIN.
func installFilter() error {
	insts, err := sessionPolicy()
	if err != nil {
		return err
	}
	raw, err := bpf.Assemble(insts)
	if err != nil {
		return fmt.Errorf("seccomp: %w", err)
	}
	prog := make([]unix.SockFilter, len(raw))
	for i, r := range raw {
		prog[i] = unix.SockFilter{Code: r.Op, Jt: r.Jt, Jf: r.Jf, K: r.K}
	}
	fprog := unix.SockFprog{Len: uint16(len(prog)), Filter: &prog[0]}
	if err := unix.Prctl(unix.PR_SET_SECCOMP, unix.SECCOMP_MODE_FILTER, uintptr(unsafe.Pointer(&fprog)), 0, 0); err != nil {
		return fmt.Errorf("seccomp: %w", err)
	}
	return nil
}
