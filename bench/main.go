// Command bench measures corral against its peers and its targets in one
// run and rewrites docs/benchmarks.md with the table.
//
//	go run ./bench [-short] [-n N] [-out FILE] [-profile DIR] [-only PHASES]
//
// A full run rewrites the generated section of docs/benchmarks.md (between
// its bench markers; the rest of the file is kept); -short prints only,
// unless -out names a file. Missed targets are results: the exit status is
// 1 only when a measurement failed (a command that should have succeeded
// did not, a child process broke).
//
// It measures, side by side and interleaved:
//
//   - per-command latency of `true` (p50, p99, mean) along the path from
//     the floor to corral: bare os/exec; bare with corral's capture
//     (stdio on socketpairs read to EOF); the floors, an agent already
//     inside a machine's namespaces doing the init's steps, reached over
//     SOCK_SEQPACKET with SCM_RIGHTS (in C, compiled at start from
//     floors/agent.c, and in Go), directly and behind one relay process in
//     the worker's place; corral's gateway round trip; corral managed (warm,
//     cold, paced) and through the daemon API; corral host (confined and
//     direct); and the peers bwrap, unshare and nsenter;
//   - capture throughput (managed and host) against a bare socketpair copy;
//   - concurrency (1, 8 and 64 parallel `true`, the subjects alternating
//     in slices) with CPU per command split by cgroup accounting into the
//     bench's process, the worker (or relay) and the machines (or agents);
//   - the core's peak RSS and RssAnon under an output flood (in a child
//     process that runs only a core and the flood);
//   - the CPU cost of heartbeating 10,000 live leases (in a child process);
//   - phases other files register (extra.go).
//
// The targets are printed against their floors, each met or missed.
// Rows that need root (the worker, the floors, the CPU accounting, bwrap,
// unshare, nsenter) or gcc (the C floor) are skipped with a note when they
// cannot run. The privileged worker runs as a child process of the bench,
// as `corral worker` runs beside the daemon.
//
// The binary re-executes itself as machine init, confinement helper,
// worker, Go floor agent, relay, flood and lease child: main calls
// worker.MaybeRunInit and confine.MaybeRun first.
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"runtime"
	"strings"
	"time"

	"github.com/corral-sandbox/corral/confine"
	"github.com/corral-sandbox/corral/worker"
)

// config is the run's configuration, from the flags.
type config struct {
	short   bool
	n       int             // latency samples per row
	cold    int             // cold-start samples
	out     string          // markdown file to rewrite; empty writes none
	profile string          // directory for pprof CPU profiles; empty writes none
	only    map[string]bool // phases to run; empty means all

	captureBytes   int64
	captureSamples int
	concDuration   time.Duration
	leases         int
	leaseRounds    int
}

func main() {
	worker.MaybeRunInit()
	confine.MaybeRun()
	if len(os.Args) > 1 {
		if child, ok := children[os.Args[1]]; ok {
			if err := child(os.Args[2:]); err != nil {
				fmt.Fprintf(os.Stderr, "bench %s: %v\n", os.Args[1], err)
				os.Exit(1)
			}
			os.Exit(0)
		}
	}

	var cfg config
	flag.BoolVar(&cfg.short, "short", false, "few samples and smaller sizes (for CI, under a minute)")
	flag.IntVar(&cfg.n, "n", 0, "latency samples per row (default 1000, 100 with -short)")
	flag.StringVar(&cfg.out, "out", "", "markdown file whose generated section is rewritten (default docs/benchmarks.md, none with -short; \"-\" for none)")
	flag.StringVar(&cfg.profile, "profile", "", "write pprof CPU profiles of each phase (and of the worker) into this directory")
	capSamples := flag.Int("capture-samples", 0, "capture samples per row (default 3, 2 with -short)")
	only := flag.String("only", "", "comma-separated phases to run (latency,cold,capture,concurrency,flood,leases, and the extra phases: "+extraNames()+"); implies -out \"\"")
	flag.Parse()
	switch {
	case cfg.out == "-":
		cfg.out = ""
	case cfg.out == "" && !cfg.short:
		cfg.out = "docs/benchmarks.md"
	}
	if *only != "" {
		cfg.only = map[string]bool{}
		for _, p := range strings.Split(*only, ",") {
			cfg.only[strings.TrimSpace(p)] = true
		}
		cfg.out = ""
	}
	if cfg.n <= 0 {
		cfg.n = 1000
		if cfg.short {
			cfg.n = 100
		}
	}
	cfg.cold, cfg.captureBytes, cfg.captureSamples = 30, 1<<30, 3
	cfg.concDuration, cfg.leases, cfg.leaseRounds = 2*time.Second, 10000, 2
	if cfg.short {
		cfg.cold, cfg.captureBytes, cfg.captureSamples = 5, 256<<20, 2
		cfg.concDuration, cfg.leaseRounds = time.Second, 1
	}
	if *capSamples > 0 {
		cfg.captureSamples = *capSamples
	}
	slog.SetDefault(slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})))

	start := time.Now()
	rep, err := run(context.Background(), cfg)
	if err != nil {
		fmt.Fprintf(os.Stderr, "bench: %v\n", err)
		os.Exit(1)
	}
	rep.elapsed = time.Since(start)
	rep.print(os.Stdout)
	if cfg.out != "" {
		if err := rep.rewrite(cfg.out); err != nil {
			fmt.Fprintf(os.Stderr, "bench: %v\n", err)
			os.Exit(1)
		}
		fmt.Printf("\nwrote %s (%v, GOMAXPROCS %d)\n", cfg.out, rep.elapsed.Round(time.Second), runtime.GOMAXPROCS(0))
	}
	// Missed targets are results; failed commands are not.
	if ps := rep.problems(); len(ps) > 0 {
		fmt.Fprintf(os.Stderr, "bench: %d measurement(s) failed\n", len(ps))
		os.Exit(1)
	}
}
