package worker

import (
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// A session's /proc is its own pid namespace's: $$, ps, kill and /proc/PID
// agree, /proc/$$/fd is the shell's own, and PID 1 is the session's holder.
func TestSessionProc(t *testing.T) {
	for _, goHolders := range []bool{false, true} {
		t.Run(map[bool]string{false: "sleepHolders", true: "goHolders"}[goHolders], func(t *testing.T) {
			testSessionProc(t, goHolders)
		})
	}
}

func testSessionProc(t *testing.T, goHolders bool) {
	h := newHarness(t, func(c *Config) { c.GoHolders = goHolders })
	c := h.dial(t)
	p := h.project(t, 1)
	t.Run("$$ names the shell", func(t *testing.T) {
		// ls lists the shell's descriptors (its own fd for the directory
		// is ls's, not the shell's).
		r := h.run(t, c, p, "sh", "-c", `echo $$; cat /proc/$$/comm; tr '\0' ' ' < /proc/$$/cmdline; echo; ls /proc/$$/fd; readlink /proc/self`)
		lines := strings.Split(r.stdout, "\n")
		if r.code() != 0 || len(lines) != 8 || lines[1] != "sh" || !strings.HasPrefix(lines[2], "sh -c ") ||
			strings.Join(lines[3:6], " ") != "0 1 2" || lines[7] != "" {
			t.Fatalf("%v", r)
		}
		if pid, err := strconv.Atoi(lines[0]); err != nil || pid <= 1 {
			t.Fatalf("$$ is %q", lines[0])
		}
		// readlink runs as a child of the shell: a later pid of the same
		// namespace.
		if self, err := strconv.Atoi(lines[6]); err != nil || strconv.Itoa(self) == lines[0] {
			t.Fatalf("/proc/self of readlink is %q, the shell is %s", lines[6], lines[0])
		}
	})
	t.Run("ps lists the session alone", func(t *testing.T) {
		r := h.run(t, c, p, "ps", "-eo", "pid=,comm=")
		holder := map[bool]string{false: "sleep", true: "exe"}[goHolders] // the Go holder is /proc/self/exe
		lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
		if r.code() != 0 || len(lines) != 2 || strings.Join(strings.Fields(lines[0]), " ") != "1 "+holder ||
			!strings.HasSuffix(lines[1], " ps") || strings.HasPrefix(strings.TrimSpace(lines[1]), "1 ") {
			t.Fatalf("want the holder as 1 and ps: %v", r)
		}
	})
	t.Run("a pid from ps or /proc works with kill", func(t *testing.T) {
		// Each search waits for the child to have exec'd sleep.
		const script = `
sleep 100 &
while p=$(ps -o pid=,comm= --ppid $$ | awk '$2 == "sleep" { print $1 }'); [ -z "$p" ]; do :; done
[ "$p" = "$!" ] || echo "ps says $p, \$! is $!"
kill "$p"; wait "$p"; echo "ps: $?"
sleep 100 &
while [ -z "$q" ]; do
	for d in /proc/[0-9]*; do
		[ "$(cat $d/comm 2>/dev/null)" = sleep ] && [ "$(awk '/^PPid:/ { print $2 }' $d/status 2>/dev/null)" = $$ ] && q=${d#/proc/}
	done
done
[ "$q" = "$!" ] || echo "/proc says $q, \$! is $!"
kill "$q"; wait "$q"; echo "proc: $?"
`
		r := h.run(t, c, p, "sh", "-c", script)
		if r.code() != 0 || r.stdout != "ps: 143\nproc: 143\n" {
			t.Fatalf("%v", r)
		}
	})
	t.Run("PID 1 is the holder", func(t *testing.T) {
		r := h.run(t, c, p, "sh", "-c", "tr '\\0' ' ' < /proc/1/cmdline")
		want := "corral-ns-holder --ignore-signal=CHLD /bin/sleep infinity " // env's argv, then sleep's
		if goHolders {
			want = "corral-ns-holder __corral-ns-holder "
		}
		if r.code() != 0 || r.stdout != want && !(!goHolders && r.stdout == "/bin/sleep infinity ") {
			t.Fatalf("want %q: %v", want, r)
		}
	})
}

// Nothing but the session's own procfs is mounted in its mount namespace:
// not the machine's (its pid namespace holds every session) nor the host's.
func TestSessionProcOnlyMount(t *testing.T) {
	h := newHarness(t, nil)
	c := h.dial(t)
	p := h.project(t, 1)
	r := h.run(t, c, p, "cat", "/proc/self/mountinfo")
	if r.code() != 0 {
		t.Fatalf("%v", r)
	}
	var procs []string
	for _, l := range strings.Split(strings.TrimSpace(r.stdout), "\n") {
		f := strings.Fields(l)
		sep := slices.Index(f, "-")
		if sep < 0 || sep+1 >= len(f) || len(f) < 5 {
			t.Fatalf("mountinfo line %q", l)
		}
		if f[sep+1] == "proc" {
			procs = append(procs, f[3]+" "+f[4]) // root within the fs, mount point
		}
	}
	want := []string{"/ /proc"}
	for _, ro := range readOnlyPresent(t) {
		want = append(want, strings.TrimPrefix(ro, "/proc")+" "+ro)
	}
	if !slices.Equal(procs, want) {
		t.Fatalf("proc mounts %q, want %q:\n%s", procs, want, r.stdout)
	}
}

// Docker's masked paths show nothing; its read-only paths refuse writes;
// the host's kernel command line is not shown.
func TestProcMasks(t *testing.T) {
	h := newHarness(t, nil)
	c := h.dial(t)
	p := h.project(t, 1)
	masked := []string{
		"/proc/asound", "/proc/acpi", "/proc/interrupts", "/proc/kcore", "/proc/keys",
		"/proc/latency_stats", "/proc/timer_list", "/proc/timer_stats", "/proc/sched_debug",
		"/proc/scsi", "/proc/cmdline", "/sys/firmware", "/sys/devices/virtual/powercap",
	}
	var present []string // on this host, so in an unmasked procfs or sysfs
	for _, m := range masked {
		if _, err := os.Stat(m); err == nil {
			present = append(present, m)
		}
	}
	if len(present) < 4 {
		t.Fatalf("only %q of the masked paths exist on this host: the test proves little", present)
	}
	t.Run("masked", func(t *testing.T) {
		const script = `for f; do
	if [ -d "$f" ]; then echo "$f $(ls -A "$f" | wc -l) entries"
	elif [ -e "$f" ]; then echo "$f $(cat "$f" | wc -c) bytes"
	fi
done`
		r := h.run(t, c, p, append([]string{"sh", "-c", script, "sh"}, present...)...)
		var want []string
		for _, m := range present {
			if st, _ := os.Stat(m); st.IsDir() {
				want = append(want, m+" 0 entries")
			} else {
				want = append(want, m+" 0 bytes")
			}
		}
		if r.code() != 0 || r.stdout != strings.Join(want, "\n")+"\n" {
			t.Fatalf("want %q: %v", want, r)
		}
	})
	t.Run("read-only", func(t *testing.T) {
		// ns_last_pid is mode 0666 (its writer's capability is checked on
		// write): only a read-only mount refuses the open itself.
		r := h.run(t, c, p, "sh", "-c", "echo 1 > /proc/sys/kernel/ns_last_pid")
		if r.code() == 0 || !strings.Contains(r.stderr, "Read-only file system") {
			t.Fatalf("%v", r)
		}
		ro := readOnlyPresent(t)
		r = h.run(t, c, p, append([]string{"sh", "-c", `for m; do
	awk -v m="$m" '$5 == m { split($6, o, ","); print m, o[1] }' /proc/self/mountinfo
done`, "sh"}, ro...)...)
		if r.code() != 0 || r.stdout != strings.Join(ro, " ro\n")+" ro\n" {
			t.Fatalf("want %q read-only: %v", ro, r)
		}
	})
	t.Run("no host kernel command line", func(t *testing.T) {
		host, err := os.ReadFile("/proc/cmdline")
		if err != nil || len(strings.TrimSpace(string(host))) == 0 {
			t.Fatalf("host /proc/cmdline: %q, %v", host, err)
		}
		r := h.run(t, c, p, "cat", "/proc/cmdline")
		if r.code() != 0 || r.stdout != "" {
			t.Fatalf("%v", r)
		}
	})
}

// A session can open a pseudo-terminal of the machine's own devpts.
func TestSessionPty(t *testing.T) {
	h := newHarness(t, nil)
	c := h.dial(t)
	p := h.project(t, 1)
	r := h.run(t, c, p, "python3", "-c", "import os; m, s = os.openpty(); print(os.ttyname(s))")
	if r.code() != 0 || r.stdout != "/dev/pts/0\n" {
		t.Fatalf("openpty: %v", r)
	}
	r = h.run(t, c, p, "script", "-qc", "tty", "/dev/null")
	if r.code() != 0 || !strings.HasPrefix(r.stdout, "/dev/pts/") {
		t.Fatalf("tty under script: %v", r)
	}
	r = h.run(t, c, p, "sh", "-c", "readlink /dev/ptmx; echo x > /dev/shm/f && cat /dev/shm/f")
	if r.code() != 0 || r.stdout != "pts/ptmx\nx\n" {
		t.Fatalf("ptmx and shm: %v", r)
	}
}

// readOnlyPresent returns Docker's read-only /proc paths that this host's
// kernel has.
func readOnlyPresent(t *testing.T) []string {
	t.Helper()
	var ro []string
	for _, p := range []string{"/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger"} {
		if _, err := os.Stat(p); err == nil {
			ro = append(ro, p)
		}
	}
	if !slices.Contains(ro, "/proc/sys") {
		t.Fatal("no /proc/sys")
	}
	return ro
}

// A process that gained a user namespace of its own (while nested ones
// are allowed) cannot mount an unmasked procfs: the kernel refuses a new
// procfs as too revealing unless one in the mount namespace is fully
// visible, and the masks cover the session's (locked, in the nested
// namespace's copy).
func TestProcMasksNotBypassedByNewProc(t *testing.T) {
	if _, err := os.Stat("/proc/interrupts"); err != nil {
		t.Skip("no /proc/interrupts on this kernel")
	}
	h := newHarness(t, nil)
	c := h.dial(t)
	p := h.project(t, 1)
	r := h.run(t, c, p, "sh", "-c", `unshare -rpfm sh -c 'mount -t proc proc /proc && wc -c < /proc/interrupts || echo refused' 2>&1 || echo refused`)
	if r.code() != 0 || !strings.HasSuffix(r.stdout, "refused\n") {
		t.Fatalf("%v", r)
	}
}
