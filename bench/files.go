package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/corral-sandbox/corral/machine"
	"github.com/corral-sandbox/corral/sandbox"
)

// Files throughput: the files API's PUT and GET of one large file against
// cat doing the same inside the machine (issue 12's goal: at least 0.8×).
//
// The phase "files" of the run (registered below; -only files) reports
// each subject's time per transfer, its median throughput and its ratio
// to cat in the row's name; `bench files -size N -samples K` runs it
// alone and prints formatFiles' table.

// filesRow is one subject's throughput samples.
type filesRow struct {
	name    string
	mbps    []float64 // 10^6 bytes per second, one per sample
	times   []time.Duration
	skip    string
	failure error
	// base names the row this one is compared with ("" for a baseline).
	base string
}

// Subjects of the files rows.
const (
	subjCatWrite = "cat inside the machine: head -c N /dev/zero, piped to cat > file"
	subjCatRead  = "cat inside the machine: cat file > /dev/null"
	subjAPIPut   = "files API PUT (client.WriteFile over the daemon's Unix socket)"
	subjAPIGet   = "files API GET (client.ReadFile → io.Discard)"
	subjGwPut    = "machine.Gateway.WriteFile (no HTTP)"
	subjGwGet    = "machine.Gateway.OpenFile → io.Discard (no HTTP)"
)

// benchFile is where the samples write, in the warm machine.
const benchFile = "/home/corral/bench-files.dat"

// zeros is a reader of n zero bytes that allocates nothing per read.
type zeros struct{ n int64 }

func (z *zeros) Read(p []byte) (int, error) {
	if z.n <= 0 {
		return 0, io.EOF
	}
	if int64(len(p)) > z.n {
		p = p[:z.n]
	}
	clear(p)
	z.n -= int64(len(p))
	return len(p), nil
}

// measureFiles measures samples rounds of each subject with a file of size
// bytes in cr's warm managed machine; d, if not nil, is a daemon over cr
// (startDaemon) for the API rows. Without a worker every row is skipped.
func measureFiles(ctx context.Context, cr *corral, d *daemonProc, size int64, samples int) []filesRow {
	rows := []filesRow{
		{name: subjCatWrite}, {name: subjGwPut, base: subjCatWrite}, {name: subjAPIPut, base: subjCatWrite},
		{name: subjCatRead}, {name: subjGwGet, base: subjCatRead}, {name: subjAPIGet, base: subjCatRead},
	}
	skipAll := func(why string) []filesRow {
		for i := range rows {
			rows[i].skip = why
		}
		return rows
	}
	if cr == nil || cr.w == nil {
		return skipAll("no worker")
	}
	if d == nil {
		rows[2].skip, rows[5].skip = "no daemon", "no daemon"
	}
	mp := machine.Project{ID: cr.managed.ID, Workspace: cr.managed.Root}
	req := machine.FileRequest{Project: mp, Path: benchFile}
	gw := cr.core.Gateway()
	mbps := func(t time.Duration) float64 { return float64(size) / t.Seconds() / 1e6 }
	n := strconv.FormatInt(size, 10)
	sh := func(script string) error {
		a := cr.alice
		res, err := cr.ctl.RunCommand(ctx, input(cr.managed, "sh", "-c", script), &a, &sandbox.RunOptions{Timeout: 10 * time.Minute})
		if err != nil {
			return err
		}
		if res.Code == nil || *res.Code != 0 {
			return fmt.Errorf("%s: code %v %s", script, res.Code, res.Stderr)
		}
		return nil
	}
	subjects := map[string]func() error{
		subjCatWrite: func() error { return sh("head -c " + n + " /dev/zero | cat > " + benchFile) },
		subjCatRead:  func() error { return sh("cat " + benchFile + " > /dev/null") },
		subjGwPut: func() error {
			w, err := gw.WriteFile(ctx, req, 0o644, &zeros{size})
			if err == nil && w != size {
				err = fmt.Errorf("wrote %d of %d bytes", w, size)
			}
			return err
		},
		subjGwGet: func() error {
			f, _, err := gw.OpenFile(ctx, req)
			if err != nil {
				return err
			}
			defer f.Close()
			return copied(io.Copy(io.Discard, f))(size)
		},
	}
	if d != nil {
		subjects[subjAPIPut] = func() error {
			fi, err := d.cl.WriteFile(ctx, d.pid, benchFile, "", 0o644, &zeros{size})
			if err == nil && fi.Size != size {
				err = fmt.Errorf("wrote %d of %d bytes", fi.Size, size)
			}
			return err
		}
		subjects[subjAPIGet] = func() error {
			body, _, err := d.cl.ReadFile(ctx, d.pid, benchFile, "")
			if err != nil {
				return err
			}
			defer body.Close()
			// A reader's buffer of its choosing (io.Discard's ReadFrom
			// would read in 8 KiB steps).
			return copied(io.CopyBuffer(discard{}, body, make([]byte, 1<<20)))(size)
		}
	}
	// Rounds alternate the subjects, so that load on the host falls on
	// all of them alike. Every read follows a write of the whole file.
	for range samples {
		for i := range rows {
			r := &rows[i]
			if r.skip != "" || r.failure != nil {
				continue
			}
			t0 := time.Now()
			if err := subjects[r.name](); err != nil {
				r.failure = err
				continue
			}
			d := time.Since(t0)
			r.mbps = append(r.mbps, mbps(d))
			r.times = append(r.times, d)
		}
	}
	_ = sh("rm -f " + benchFile)
	return rows
}

// discard is io.Discard without ReadFrom.
type discard struct{}

func (discard) Write(p []byte) (int, error) { return len(p), nil }

// copied checks that an io.Copy moved want bytes.
func copied(n int64, err error) func(want int64) error {
	return func(want int64) error {
		if err == nil && n != want {
			err = fmt.Errorf("read %d of %d bytes", n, want)
		}
		return err
	}
}

func medianOf(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := append([]float64(nil), v...)
	for i := 1; i < len(s); i++ {
		for j := i; j > 0 && s[j] < s[j-1]; j-- {
			s[j], s[j-1] = s[j-1], s[j]
		}
	}
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// formatFiles renders rows as a Markdown table: median throughput and,
// for the API rows, the ratio to cat with the ≥ 0.8× goal's verdict.
func formatFiles(rows []filesRow, size int64) string {
	var b strings.Builder
	fmt.Fprintf(&b, "Files throughput, one file of %d MiB (median of the samples):\n\n", size>>20)
	b.WriteString("| subject | MB/s | vs cat | goal ≥ 0.8× |\n|---|---|---|---|\n")
	med := map[string]float64{}
	for _, r := range rows {
		med[r.name] = medianOf(r.mbps)
	}
	for _, r := range rows {
		switch {
		case r.skip != "":
			fmt.Fprintf(&b, "| %s | skipped: %s | | |\n", r.name, r.skip)
			continue
		case r.failure != nil:
			fmt.Fprintf(&b, "| %s | failed: %v | | |\n", r.name, r.failure)
			continue
		}
		ratio, goal := "", ""
		if r.base != "" && med[r.base] > 0 {
			x := med[r.name] / med[r.base]
			ratio, goal = fmt.Sprintf("%.2f×", x), verdict(x >= 0.8)
		}
		fmt.Fprintf(&b, "| %s | %.0f | %s | %s |\n", r.name, med[r.name], ratio, goal)
	}
	return b.String()
}

func init() {
	children["files"] = filesChild
	registerPhase(extraPhase{
		name:  "files",
		title: "Files API throughput",
		intro: "One file of the capture size (1 GiB; 256 MiB with -short) written and read in the warm machine, per transfer: cat inside the machine (head -c N /dev/zero piped to cat > file; cat file > /dev/null), the machine gateway (descriptors passed by the worker, no HTTP) and the daemon's files API over its Unix socket (client.WriteFile, client.ReadFile). The goal is ≥ 0.8× cat's throughput.",
		run:   filesPhase,
	})
}

// filesPhase is the run's "files" phase.
func filesPhase(ctx context.Context, env *phaseEnv) []latRow {
	cr := env.cr
	if env.workerSkip != "" {
		cr = nil
	}
	size, samples := env.cfg.captureBytes, env.cfg.captureSamples
	rows := measureFiles(ctx, cr, env.dmn, size, samples)
	med := map[string]float64{}
	for _, r := range rows {
		med[r.name] = medianOf(r.mbps)
	}
	out := make([]latRow, 0, len(rows))
	for _, r := range rows {
		name := r.name
		if len(r.mbps) > 0 {
			name = fmt.Sprintf("%s: %.0f MB/s", r.name, med[r.name])
			if r.base != "" && med[r.base] > 0 {
				x := med[r.name] / med[r.base]
				name += fmt.Sprintf(", %.2f× cat (goal ≥ 0.8×: %s)", x, verdict(x >= 0.8))
			}
		}
		l := latRow{name: name, skip: r.skip, st: summarize(r.times)}
		if r.failure != nil {
			l.failures, l.firstErr = 1, r.failure
		}
		out = append(out, l)
	}
	return out
}

// filesChild is `bench files [-size BYTES] [-samples N]`: the files rows
// alone, printed, without the rest of the run (and without rewriting
// docs/benchmarks.md).
func filesChild(args []string) error {
	size, samples := int64(1<<30), 3
	for i := 0; i+1 < len(args); i += 2 {
		v, err := strconv.ParseInt(args[i+1], 10, 64)
		if err != nil {
			return fmt.Errorf("%s: %w", args[i], err)
		}
		switch args[i] {
		case "-size":
			size = v
		case "-samples":
			samples = int(v)
		default:
			return fmt.Errorf("unknown flag %s", args[i])
		}
	}
	ctx := context.Background()
	dir, err := os.MkdirTemp("", "corral-bench-files")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	w, err := startWorker(dir, "")
	if err != nil {
		return err
	}
	defer w.stop()
	cr, err := buildCorral(ctx, dir, w)
	if err != nil {
		return err
	}
	defer cr.core.Close()
	d, err := startDaemon(ctx, dir, cr)
	if err != nil {
		return err
	}
	defer d.stop()
	rows := measureFiles(ctx, cr, d, size, samples)
	fmt.Print(formatFiles(rows, size))
	for _, r := range rows {
		if r.failure != nil {
			return r.failure
		}
	}
	return nil
}
