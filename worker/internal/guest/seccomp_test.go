package guest

import (
	"encoding/binary"
	"runtime"
	"testing"

	"golang.org/x/net/bpf"
	"golang.org/x/sys/unix"
)

// decide runs the policy on one system call as the kernel would, in
// golang.org/x/net/bpf's VM. The VM loads words big-endian; seccomp_data
// is native (little-endian here), so each 32-bit word is stored
// big-endian where the filter loads it.
func decide(t *testing.T, vm *bpf.VM, archID uint32, nr uint32, args ...uint64) uint32 {
	t.Helper()
	data := make([]byte, 64)
	binary.BigEndian.PutUint32(data[0:], nr)
	binary.BigEndian.PutUint32(data[4:], archID)
	for i, a := range args {
		binary.BigEndian.PutUint32(data[16+8*i:], uint32(a))
		binary.BigEndian.PutUint32(data[20+8*i:], uint32(a>>32))
	}
	v, err := vm.Run(data)
	if err != nil {
		t.Fatal(err)
	}
	return uint32(v)
}

func TestPolicyDecisions(t *testing.T) {
	if runtime.GOARCH != "amd64" {
		t.Skip("the table is amd64's")
	}
	prog, skipped, err := assemblePolicy()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%d instructions; Docker's names unknown to go-seccomp-bpf (refused): %v", len(prog), skipped)
	vm, err := bpf.NewVM(prog)
	if err != nil {
		t.Fatal(err)
	}
	const (
		allow   = unix.SECCOMP_RET_ALLOW
		eperm   = unix.SECCOMP_RET_ERRNO | uint32(unix.EPERM)
		enosys  = unix.SECCOMP_RET_ERRNO | uint32(unix.ENOSYS)
		x86_64  = unix.AUDIT_ARCH_X86_64
		sigchld = uint64(unix.SIGCHLD)
	)
	tests := []struct {
		name string
		nr   uint32
		args []uint64
		want uint32
	}{
		{"read", unix.SYS_READ, nil, allow},
		{"execve", unix.SYS_EXECVE, nil, allow},
		{"fork-like clone", unix.SYS_CLONE, []uint64{sigchld}, allow},
		{"thread clone", unix.SYS_CLONE, []uint64{unix.CLONE_VM | unix.CLONE_FS | unix.CLONE_FILES | unix.CLONE_SIGHAND | unix.CLONE_THREAD}, allow},
		{"clone NEWUSER", unix.SYS_CLONE, []uint64{unix.CLONE_NEWUSER | sigchld}, eperm},
		{"clone NEWNET", unix.SYS_CLONE, []uint64{unix.CLONE_NEWNET}, eperm},
		{"clone NEWPID", unix.SYS_CLONE, []uint64{unix.CLONE_NEWPID | sigchld}, eperm},
		{"clone NEWNS", unix.SYS_CLONE, []uint64{unix.CLONE_NEWNS | sigchld}, eperm},
		{"vfork-like clone with a pidfd (ForkExec)", unix.SYS_CLONE, []uint64{unix.CLONE_VM | unix.CLONE_VFORK | unix.CLONE_PIDFD | sigchld}, allow},
		{"clone NEWUSER in high bits ignored? no: low word", unix.SYS_CLONE, []uint64{1<<40 | unix.CLONE_NEWUSER}, eperm},
		{"clone3", unix.SYS_CLONE3, nil, enosys},
		{"unshare NEWUSER", unix.SYS_UNSHARE, []uint64{unix.CLONE_NEWUSER}, eperm},
		{"unshare NEWNS", unix.SYS_UNSHARE, []uint64{unix.CLONE_NEWNS}, eperm},
		{"unshare FS", unix.SYS_UNSHARE, []uint64{unix.CLONE_FS}, eperm},
		{"setns pid", unix.SYS_SETNS, []uint64{3, unix.CLONE_NEWPID}, allow},
		{"setns mnt+pid", unix.SYS_SETNS, []uint64{3, unix.CLONE_NEWNS | unix.CLONE_NEWPID}, allow},
		{"setns any", unix.SYS_SETNS, []uint64{3, 0}, eperm},
		{"setns user", unix.SYS_SETNS, []uint64{3, unix.CLONE_NEWUSER}, eperm},
		{"setns net", unix.SYS_SETNS, []uint64{3, unix.CLONE_NEWNET}, eperm},
		{"mount", unix.SYS_MOUNT, nil, eperm},
		{"umount2", unix.SYS_UMOUNT2, nil, eperm},
		{"pivot_root", unix.SYS_PIVOT_ROOT, nil, eperm},
		{"move_mount", unix.SYS_MOVE_MOUNT, nil, eperm},
		{"open_tree", unix.SYS_OPEN_TREE, nil, eperm},
		{"fsopen", unix.SYS_FSOPEN, nil, eperm},
		{"fsmount", unix.SYS_FSMOUNT, nil, eperm},
		{"mount_setattr", unix.SYS_MOUNT_SETATTR, nil, eperm},
		{"keyctl", unix.SYS_KEYCTL, nil, eperm},
		{"add_key", unix.SYS_ADD_KEY, nil, eperm},
		{"request_key", unix.SYS_REQUEST_KEY, nil, eperm},
		{"bpf", unix.SYS_BPF, nil, eperm},
		{"perf_event_open", unix.SYS_PERF_EVENT_OPEN, nil, eperm},
		{"userfaultfd", unix.SYS_USERFAULTFD, nil, eperm},
		{"init_module", unix.SYS_INIT_MODULE, nil, eperm},
		{"finit_module", unix.SYS_FINIT_MODULE, nil, eperm},
		{"delete_module", unix.SYS_DELETE_MODULE, nil, eperm},
		{"clock_settime", unix.SYS_CLOCK_SETTIME, nil, eperm},
		{"settimeofday", unix.SYS_SETTIMEOFDAY, nil, eperm},
		{"clock_adjtime (reads; setting needs CAP_SYS_TIME)", unix.SYS_CLOCK_ADJTIME, nil, allow},
		{"stime-like adjtimex is Docker's too", unix.SYS_ADJTIMEX, nil, allow},
		{"reboot", unix.SYS_REBOOT, nil, eperm},
		{"io_uring_setup", unix.SYS_IO_URING_SETUP, nil, enosys},
		{"io_uring_enter", unix.SYS_IO_URING_ENTER, nil, enosys},
		{"io_uring_register", unix.SYS_IO_URING_REGISTER, nil, enosys},
		{"openat2", unix.SYS_OPENAT2, nil, enosys},
		{"personality 0", unix.SYS_PERSONALITY, []uint64{0}, allow},
		{"personality query", unix.SYS_PERSONALITY, []uint64{0xffffffff}, allow},
		{"personality READ_IMPLIES_EXEC", unix.SYS_PERSONALITY, []uint64{0x0400000}, eperm},
		{"ptrace (kernel >= 4.8)", unix.SYS_PTRACE, nil, allow},
		{"chmod 0755", unix.SYS_CHMOD, []uint64{0, 0o755}, allow},
		{"chmod u+s", unix.SYS_CHMOD, []uint64{0, 0o4755}, eperm},
		{"fchmod g+s", unix.SYS_FCHMOD, []uint64{0, 0o2755}, eperm},
		{"fchmodat u+s", unix.SYS_FCHMODAT, []uint64{0, 0, 0o4755}, eperm},
		{"fchmodat2 u+s", unix.SYS_FCHMODAT2, []uint64{0, 0, 0o4755, 0}, eperm},
		{"fchmodat2 0644", unix.SYS_FCHMODAT2, []uint64{0, 0, 0o644, 0}, allow},
		{"openat O_CREAT 0644", unix.SYS_OPENAT, []uint64{0, 0, unix.O_CREAT, 0o644}, allow},
		{"openat O_CREAT 04755", unix.SYS_OPENAT, []uint64{0, 0, unix.O_CREAT, 0o4755}, eperm},
		{"open 02755", unix.SYS_OPEN, []uint64{0, unix.O_CREAT, 0o2755}, eperm},
		{"creat 04755", unix.SYS_CREAT, []uint64{0, 0o4755}, eperm},
		{"mknod set-id", unix.SYS_MKNOD, []uint64{0, unix.S_IFREG | 0o4755}, eperm},
		{"mknodat fifo", unix.SYS_MKNODAT, []uint64{0, 0, unix.S_IFIFO | 0o644}, allow},
		{"socket AF_INET", unix.SYS_SOCKET, []uint64{unix.AF_INET}, allow},
		{"socket AF_VSOCK", unix.SYS_SOCKET, []uint64{unix.AF_VSOCK}, eperm},
		{"socket AF_ALG", unix.SYS_SOCKET, []uint64{unix.AF_ALG}, eperm},
		{"x32 ABI", 0x40000000 | unix.SYS_READ, nil, enosys},
		{"unknown number", 1000, nil, eperm},
	}
	for _, tt := range tests {
		if got := decide(t, vm, x86_64, tt.nr, tt.args...); got != tt.want {
			t.Errorf("%s: got %#x, want %#x", tt.name, got, tt.want)
		}
	}
	if got := decide(t, vm, unix.AUDIT_ARCH_I386, 3, 0); got != eperm {
		t.Errorf("i386 ABI: got %#x, want EPERM", got)
	}
}
