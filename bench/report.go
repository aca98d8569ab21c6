package main

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"runtime"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// target is one of the issues' targets and how this run fared.
type target struct {
	what     string
	goal     string
	measured string
	verdict  string // PASS, MISS or SKIP
}

func verdict(ok bool) string {
	if ok {
		return "PASS"
	}
	return "MISS"
}

func ms(d time.Duration) string { return fmt.Sprintf("%.3f ms", float64(d)/1e6) }

func mib(b int64) string { return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20)) }

func (r *report) lat(name string) *latRow {
	for i := range r.latency {
		if r.latency[i].name == name {
			return &r.latency[i]
		}
	}
	return nil
}

func (l *latRow) ok() bool { return l != nil && l.skip == "" && l.st.n > 0 }

func (r *report) concAt(subject string, level int) *concRow {
	for i := range r.conc {
		if r.conc[i].subject == subject && r.conc[i].level == level {
			return &r.conc[i]
		}
	}
	return nil
}

// floodTarget is the measured flood row that the RSS target applies to, or
// nil.
func (r *report) floodTarget() *floodRow {
	for i := range r.flood {
		if f := &r.flood[i]; f.target && f.err == nil {
			return f
		}
	}
	return nil
}

func (r *report) targets() []target {
	var ts []target
	skip := func(what, goal string) { ts = append(ts, target{what, goal, "not measured", "SKIP"}) }
	bare, mgd, bw := r.lat(subjBare), r.lat(subjManaged), r.lat(subjBwrap)
	if bare.ok() && mgd.ok() {
		x := float64(mgd.st.p50) / float64(bare.st.p50)
		ts = append(ts, target{"managed `true` vs bare Go Run (p50)", "≤ 1.30×", fmt.Sprintf("%.2f×", x), verdict(x <= 1.3 && mgd.failures == 0)})
		ts = append(ts, target{"managed `true` p99", "< 3 ms", ms(mgd.st.p99), verdict(mgd.st.p99 < 3*time.Millisecond)})
	} else {
		skip("managed `true` vs bare Go Run (p50)", "≤ 1.30×")
		skip("managed `true` p99", "< 3 ms")
	}
	if bw.ok() && mgd.ok() {
		x := float64(bw.st.p50) / float64(mgd.st.p50)
		ts = append(ts, target{"managed `true` faster than bwrap (p50)", "≥ 5×", fmt.Sprintf("%.2f×", x), verdict(x >= 5)})
	} else {
		skip("managed `true` faster than bwrap (p50)", "≥ 5×")
	}
	if bw.ok() && r.cold.ok() {
		x := float64(r.cold.st.p50) / float64(bw.st.p50)
		ts = append(ts, target{"cold start vs one bwrap start (p50)", "≤ 3×", fmt.Sprintf("%.2f× (%s)", x, ms(r.cold.st.p50)), verdict(x <= 3 && r.cold.failures == 0)})
	} else {
		skip("cold start vs one bwrap start (p50)", "≤ 3×")
	}
	for _, h := range []struct{ name, what string }{
		{subjConfined, "host RunCommand(`true`), confined, vs bare (p50)"},
		{subjDirect, "host RunCommand(`true`), direct, vs bare (p50)"},
	} {
		if l := r.lat(h.name); bare.ok() && l.ok() {
			x := float64(l.st.p50) / float64(bare.st.p50)
			ts = append(ts, target{h.what, "≤ 1.10×", fmt.Sprintf("%.2f×", x), verdict(x <= 1.1 && l.failures == 0)})
		} else {
			skip(h.what, "≤ 1.10×")
		}
	}
	if len(r.capture) == 2 && len(r.capture[0].mbps) > 0 && len(r.capture[1].mbps) > 0 {
		x := median(r.capture[1].mbps) / median(r.capture[0].mbps)
		ts = append(ts, target{"capture through a managed session vs bare socketpair", "≥ 0.90×", fmt.Sprintf("%.2f×", x), verdict(x >= 0.9)})
	} else {
		skip("capture through a managed session vs bare socketpair", "≥ 0.90×")
	}
	if b, m := r.concAt(subjBareCc, 64), r.concAt(subjManagedCc, 64); b != nil && m != nil && m.skip == "" && b.perSec > 0 {
		x := m.perSec / b.perSec
		ts = append(ts, target{"64 concurrent: managed vs bare throughput, failures", "≥ 0.80×, 0 failures",
			fmt.Sprintf("%.2f×, %d failures", x, m.failures), verdict(x >= 0.8 && m.failures == 0)})
	} else {
		skip("64 concurrent: managed vs bare throughput, failures", "≥ 0.80×, 0 failures")
	}
	if f := r.floodTarget(); f != nil {
		ts = append(ts, target{"core peak RSS under a flood (" + f.name + ")", "≤ 32 MiB", mib(f.res.PeakRSS), verdict(f.res.PeakRSS <= 32<<20)})
	} else {
		skip("core peak RSS under a flood", "≤ 32 MiB")
	}
	if r.leases != nil {
		ts = append(ts, target{fmt.Sprintf("heartbeats of %d live leases, CPU", r.leases.Leases), "< 2 % of a core",
			fmt.Sprintf("%.2f %%", r.leases.PercentCPU), verdict(r.leases.PercentCPU < 2 && r.leases.Errors == 0)})
	} else {
		skip("heartbeats of 10000 live leases, CPU", "< 2 % of a core")
	}
	return ts
}

// problems lists what failed during the run (commands that should have
// succeeded, children that broke): not missed targets, and not rows skipped
// because this machine cannot run them.
func (r *report) problems() []string {
	var ps []string
	for _, l := range append(append([]latRow(nil), r.latency...), r.cold) {
		if l.failures > 0 {
			ps = append(ps, fmt.Sprintf("%s: %d failures, first: %v", l.name, l.failures, l.firstErr))
		}
	}
	for _, c := range r.capture {
		if c.failure != nil {
			ps = append(ps, fmt.Sprintf("%s: %v", c.name, c.failure))
		}
	}
	for _, c := range r.conc {
		if c.failures > 0 {
			ps = append(ps, fmt.Sprintf("%s ×%d: %d failures, first: %v", c.subject, c.level, c.failures, c.firstErr))
		}
	}
	for _, f := range r.flood {
		if f.err != nil && !f.skipped {
			ps = append(ps, fmt.Sprintf("flood %s: %v", f.name, f.err))
		}
	}
	if r.leaseErr != nil {
		ps = append(ps, fmt.Sprintf("leases: %v", r.leaseErr))
	} else if r.leases != nil && r.leases.Errors > 0 {
		ps = append(ps, fmt.Sprintf("leases: %d heartbeats failed", r.leases.Errors))
	}
	return ps
}

// markdown renders the generated section.
func (r *report) markdown(w io.Writer) {
	p := func(format string, a ...any) { fmt.Fprintf(w, format, a...) }
	var uts unix.Utsname
	_ = unix.Uname(&uts)
	mode := "full"
	if r.cfg.short {
		mode = "-short"
	}
	p("Generated by `go run ./bench%s` on %s (%s mode, %v).\n",
		map[bool]string{true: " -short", false: ""}[r.cfg.short], r.started.UTC().Format("2006-01-02 15:04 UTC"), mode, r.elapsed.Round(time.Second))
	p("Machine: %s, Linux %s, %d CPUs, %s, euid %d; load average at the start: %s.\n\n",
		unix.ByteSliceToString(uts.Machine[:]), unix.ByteSliceToString(uts.Release[:]), runtime.NumCPU(), runtime.Version(), os.Geteuid(), r.loadavg)
	for _, n := range r.notes {
		p("- Note: %s\n", n)
	}
	for _, n := range r.problems() {
		p("- **Failure**: %s\n", oneLine(n))
	}
	if len(r.notes)+len(r.problems()) > 0 {
		p("\n")
	}

	p("### Targets\n\n| Target | Goal | Measured | Verdict |\n|---|---|---|---|\n")
	for _, t := range r.targets() {
		p("| %s | %s | %s | **%s** |\n", t.what, t.goal, t.measured, t.verdict)
	}

	p("\n### Per-command latency of `true`\n\n%d samples per row, interleaved in 10 rounds after 5 warm-up calls; cold start: %d new projects, one sample each. Ratios are p50 / bare p50.\n\n", r.cfg.n, r.cfg.cold)
	p("| Subject | p50 | p99 | mean | n | ×bare | Notes |\n|---|---:|---:|---:|---:|---:|---|\n")
	bare := r.lat(subjBare)
	rows := append(append([]latRow(nil), r.latency...), r.cold)
	for _, l := range rows {
		if l.skip != "" {
			p("| %s | – | – | – | 0 | – | skipped: %s |\n", l.name, l.skip)
			continue
		}
		ratio := "–"
		if bare.ok() && l.st.n > 0 {
			ratio = fmt.Sprintf("%.2f×", float64(l.st.p50)/float64(bare.st.p50))
		}
		note := ""
		if l.failures > 0 {
			note = fmt.Sprintf("%d failures, first: %v", l.failures, l.firstErr)
		}
		p("| %s | %s | %s | %s | %d | %s | %s |\n", l.name, ms(l.st.p50), ms(l.st.p99), ms(l.st.mean), l.st.n, ratio, oneLine(note))
	}

	p("\n### Capture throughput\n\n%s of zeros written by `dd bs=64K`; median of %d samples; MB = 10⁶ bytes.\n\n", mib(r.cfg.captureBytes), r.cfg.captureSamples)
	p("| Path | median MB/s | samples | ×bare |\n|---|---:|---:|---:|\n")
	for _, c := range r.capture {
		if c.skip != "" || len(c.mbps) == 0 {
			why := c.skip
			if c.failure != nil {
				why = c.failure.Error()
			}
			p("| %s | – | 0 | – (skipped: %s) |\n", c.name, oneLine(why))
			continue
		}
		ratio := "–"
		if len(r.capture[0].mbps) > 0 {
			ratio = fmt.Sprintf("%.2f×", median(c.mbps)/median(r.capture[0].mbps))
		}
		p("| %s | %.0f | %d | %s |\n", c.name, median(c.mbps), len(c.mbps), ratio)
	}

	p("\n### Concurrency scaling (`true`, %v per level)\n\n", r.cfg.concDuration)
	p("Host CPU/cmd is the whole host's busy time (/proc/stat) per completed command: core, worker, machine and the command itself.\n\n")
	p("| Parallel | bare exec cmd/s | managed cmd/s | managed ×bare | managed p99 | host CPU/cmd (bare / managed) | failures (bare / managed) |\n|---:|---:|---:|---:|---:|---|---|\n")
	for _, level := range []int{1, 8, 64} {
		b, m := r.concAt(subjBareCc, level), r.concAt(subjManagedCc, level)
		if b == nil || m == nil {
			continue
		}
		if m.skip != "" {
			p("| %d | %.0f | – | – | – | %s / – | %d / – (managed skipped: %s) |\n", level, b.perSec, ms(b.cpuPerCmd), b.failures, m.skip)
			continue
		}
		fails := fmt.Sprintf("%d / %d", b.failures, m.failures)
		if m.firstErr != nil {
			fails += " — " + oneLine(m.firstErr.Error())
		}
		p("| %d | %.0f | %.0f | %.2f× | %s | %s / %s | %s |\n", level, b.perSec, m.perSec, m.perSec/b.perSec, ms(m.p99), ms(b.cpuPerCmd), ms(m.cpuPerCmd), fails)
	}
	var slim []string
	for _, level := range []int{1, 8, 64} {
		if c := r.concAt(subjSlimCc, level); c != nil {
			slim = append(slim, fmt.Sprintf("×%d: %.0f cmd/s, p99 %s, host CPU/cmd %s, %d failures", level, c.perSec, ms(c.p99), ms(c.cpuPerCmd), c.failures))
		}
	}
	if len(slim) > 0 {
		p("\nExperiment, managed through a worker linked alone (bench/slimworker: machine inits and pid namespace holders re-execute a small binary): %s.\n", strings.Join(slim, "; "))
	}

	p("\n### Core memory under an output flood\n\nA child process runs only a core (its own store, the worker's socket) and the flood, all in one managed project; peak is its VmHWM, which includes the resident pages of the mapped executable (file-backed, shared with other processes running it, counted in 2 MiB pages where the kernel maps the file with huge pages); the rest is the core's own memory. The target (≤ 32 MiB) applies to the flood at the default limits; the 64 MiB row is for information: its 10 × 64 MiB of returned output alone exceeds any such target.\n\n")
	p("| Flood | RSS before | peak RSS (VmHWM) | of it file-backed | outcomes | stdout returned | time | role |\n|---|---:|---:|---:|---|---:|---:|---|\n")
	for _, f := range r.flood {
		role := "information"
		if f.target {
			role = "target"
		}
		if f.err != nil {
			p("| %s | – | – | – | error: %s | – | – | %s |\n", f.name, oneLine(f.err.Error()), role)
			continue
		}
		p("| %s | %s | %s | %s | %s | %s | %d ms | %s |\n", f.name, mib(f.res.BaseRSS), mib(f.res.PeakRSS), mib(f.res.FileRSS), kinds(f.res.Kinds), mib(f.res.Captured), f.res.ElapsedMs, role)
	}

	p("\n### Lease heartbeats\n\nA child process holds the leases (lease package defaults: 15 s TTL, 3 s sweeps) and keeps each alive every 5 s, registered at a random phase, through the lease manager's keep-alive loop (lease.KeepAlive, as RunCommand does), with the reconciler running; after one round that registers every lease, CPU is getrusage over the measured rounds.\n\n")
	if r.leases == nil {
		p("Not measured: %v\n", r.leaseErr)
	} else {
		l := r.leases
		p("| Live leases | rounds (5 s) | heartbeats | errors | CPU | share of one core | acquire all |\n|---:|---:|---:|---:|---:|---:|---:|\n")
		p("| %d | %d | %d | %d | %d ms in %d ms | %.2f %% | %d ms |\n", l.Leases, r.cfg.leaseRounds, l.Beats, l.Errors, l.CPUMs, l.WindowMs, l.PercentCPU, l.AcquireMs)
	}
}

func kinds(m map[string]int) string {
	var parts []string
	for _, k := range []string{"completed", "overflow", "timeout", "abort", "start", "transport", "cleanup", "prepare"} {
		if m[k] > 0 {
			parts = append(parts, fmt.Sprintf("%d %s", m[k], k))
		}
	}
	return strings.Join(parts, ", ")
}

func oneLine(s string) string {
	s = strings.ReplaceAll(s, "\n", " ")
	s = strings.ReplaceAll(s, "|", "\\|")
	if len(s) > 160 {
		s = s[:160] + "…"
	}
	return s
}

// print writes the generated section to w.
func (r *report) print(w io.Writer) { r.markdown(w) }

const (
	beginMarker = "<!-- bench:begin (generated by go run ./bench; edit outside the markers) -->"
	endMarker   = "<!-- bench:end -->"
)

// rewrite replaces the generated section of the markdown file at path,
// keeping everything outside the markers; a file without them is created
// (or replaced) with a title and the section.
func (r *report) rewrite(path string) error {
	var gen bytes.Buffer
	r.markdown(&gen)
	old, err := os.ReadFile(path)
	if err != nil && !os.IsNotExist(err) {
		return err
	}
	var out bytes.Buffer
	s := string(old)
	i, j := strings.Index(s, beginMarker), strings.Index(s, endMarker)
	if i >= 0 && j > i {
		out.WriteString(s[:i])
		out.WriteString(beginMarker + "\n")
		out.Write(gen.Bytes())
		out.WriteString(s[j:])
	} else {
		out.WriteString("# Benchmarks\n\n")
		out.WriteString(beginMarker + "\n")
		out.Write(gen.Bytes())
		out.WriteString(endMarker + "\n")
	}
	return os.WriteFile(path, out.Bytes(), 0o644)
}
