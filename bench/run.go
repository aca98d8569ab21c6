package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"runtime/pprof"
	"strconv"
	"strings"
	"time"

	"github.com/corral-sandbox/corral/client"
	"github.com/corral-sandbox/corral/daemon"
	"github.com/corral-sandbox/corral/sandbox"
)

// report is everything one run measured.
type report struct {
	cfg     config
	started time.Time
	elapsed time.Duration
	notes   []string
	loadavg string

	// acct describes the CPU accounting (empty: host-wide /proc/stat).
	acct string

	latency  []latRow
	cold     latRow
	extras   []extraResult
	capture  []captureRow
	conc     []concRow
	flood    []floodRow
	leases   *leasesResult
	leaseErr error
}

// floodRow is one flood configuration's outcome.
type floodRow struct {
	name  string
	limit int64
	par   int
	// target: this row is the one measured against the ≤ 32 MiB target.
	target bool
	res    floodResult
	err    error
	// skipped: err says why the flood could not run here (no worker).
	skipped bool
}

// Names of the latency subjects, referenced by the targets.
const (
	subjBare      = "bare exec.Command(\"true\").Run()"
	subjBwrap     = "bwrap --ro-bind / / --dev /dev --proc /proc --unshare-all true"
	subjUnshare   = "unshare --user --map-root-user --mount --pid --fork --net true"
	subjNsenter   = "nsenter -t PID -a true (held namespaces)"
	subjConfined  = "corral host RunCommand, confined (Landlock-restricted thread)"
	subjDirect    = "corral host RunCommand, direct (trusted member)"
	subjManaged   = "corral managed RunCommand, warm machine"
	subjDaemon    = "corral daemon API, client.RunCommand (Unix socket, managed)"
	subjManagedCc = "corral managed RunCommand"
	subjSlimCc    = "experiment: managed, worker linked alone"

	subjManagedSlim = "experiment: corral managed RunCommand, warm, worker linked alone (bench/slimworker)"

	// pace separates the paced samples.
	pace             = 10 * time.Millisecond
	subjBarePaced    = "bare exec, paced (10 ms idle before each call)"
	subjManagedPaced = "corral managed RunCommand, warm, paced (10 ms idle before each call)"
	subjBareCc       = "bare exec"
)

// on reports whether phase name was selected (-only).
func (cfg config) on(name string) bool {
	return len(cfg.only) == 0 || cfg.only[name]
}

// phase runs fn under a CPU profile named name when profiling.
func (cfg config) phase(name string, fn func()) {
	if cfg.profile == "" {
		fn()
		return
	}
	f, err := os.Create(filepath.Join(cfg.profile, name+".pprof"))
	if err == nil {
		err = pprof.StartCPUProfile(f)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "bench: profile %s: %v\n", name, err)
		fn()
		return
	}
	fn()
	pprof.StopCPUProfile()
	f.Close()
}

func run(ctx context.Context, cfg config) (*report, error) {
	rep := &report{cfg: cfg, started: time.Now(), loadavg: "unknown"}
	if b, err := os.ReadFile("/proc/loadavg"); err == nil {
		if f := strings.Fields(string(b)); len(f) >= 3 {
			rep.loadavg = strings.Join(f[:3], " ")
		}
	}
	if cfg.profile != "" {
		if err := os.MkdirAll(cfg.profile, 0o755); err != nil {
			return nil, err
		}
	}
	dir, err := os.MkdirTemp("", "corral-bench")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	fmt.Fprintf(os.Stderr, "bench: state in %s\n", dir)

	// CPU accounting first: the worker and the floors' processes start
	// in their groups; the groups go after everything stopped.
	var acct *cpuAcct
	if os.Geteuid() != 0 {
		rep.notes = append(rep.notes, "CPU per process not measured (cgroups need root): CPU/cmd is host-wide (/proc/stat)")
	} else if acct, err = newCPUAcct(); err != nil {
		rep.notes = append(rep.notes, fmt.Sprintf("CPU per process not measured (%v): CPU/cmd is host-wide (/proc/stat)", err))
		acct = nil
	} else {
		rep.acct = acct.describe()
	}
	defer acct.close()

	var w *workerProc
	workerSkip := ""
	if os.Geteuid() != 0 {
		workerSkip = "the privileged worker needs root"
	} else if err = acct.in(groupWorker, func() (err error) { w, err = startWorker(dir, cfg.profile); return err }); err != nil {
		workerSkip = err.Error()
		w = nil
	} else {
		acct.addMachines(w.cgroupPrefix + strconv.Itoa(w.proc.Pid))
	}
	defer w.stop()
	if workerSkip != "" {
		rep.notes = append(rep.notes, "managed rows skipped: "+workerSkip)
	}
	cr, err := buildCorral(ctx, dir, w)
	if err != nil {
		return nil, fmt.Errorf("build core: %w", err)
	}
	defer cr.core.Close()

	// The daemon: the real HTTP app over the same core, on a Unix socket.
	dmn, err := startDaemon(ctx, dir, cr)
	if err != nil {
		return nil, fmt.Errorf("daemon: %w", err)
	}
	defer dmn.stop()

	var ns *heldNamespace
	nsSkip := toolSkip("nsenter", true)
	if nsSkip == "" {
		if ns, err = holdNamespace(); err != nil {
			nsSkip = err.Error()
		}
	}
	defer ns.stop()

	// The experiment: the same managed path through a worker linked
	// alone, whose machine inits and pid namespace holders re-execute a
	// small binary. Not in -short (it builds that binary).
	slimSkip := workerSkip
	var slim *corral
	switch {
	case slimSkip != "":
	case cfg.short:
		slimSkip = "not in -short"
	case !cfg.on("latency") && !cfg.on("concurrency"):
		slimSkip = "not selected"
	default:
		var sw *workerProc
		err := acct.in(groupWorker, func() (err error) { sw, err = startSlimWorker(filepath.Join(dir, "slim")); return err })
		if err != nil {
			slimSkip = err.Error()
			break
		}
		acct.addMachines(sw.cgroupPrefix + strconv.Itoa(sw.proc.Pid))
		defer sw.stop()
		if slim, err = buildCorral(ctx, filepath.Join(dir, "slim"), sw); err != nil {
			slimSkip = err.Error()
			break
		}
		defer slim.core.Close()
	}

	fl := startFloors(filepath.Join(dir, "floors"), acct)
	defer fl.stop()

	confinedSkip := ""
	if err := cr.runTrue(ctx, cr.host, cr.alice); err != nil {
		confinedSkip = fmt.Sprintf("confined start failed (Landlock?): %v", err)
	}
	nsenter := func() error { return errors.New("no held namespace") }
	if ns != nil {
		nsenter = runExec("nsenter", "-t", strconv.Itoa(ns.pid), "-a", "true")
	}
	managedTrue := func() error { return cr.runTrue(ctx, cr.managed, cr.alice) }
	storeFloor := fl.subject(subjAgentCStore, fl.cRelay, fl.cSkip)
	switch {
	case workerSkip != "":
		storeFloor.skip = workerSkip
	case storeFloor.skip == "":
		storeFloor.run = cr.storeFloor(ctx, fl.cRelay)
	}
	subjects := []subject{
		{name: subjBare, run: bareTrue},
		{name: subjBareCapture, run: bareCaptureTrue},
		fl.subject(subjAgentC, fl.c, fl.cSkip),
		fl.subject(subjAgentCRelay, fl.cRelay, fl.cSkip),
		storeFloor,
		fl.subject(subjAgentGo, fl.goAgent, fl.goSkip),
		fl.subject(subjAgentGoRly, fl.goRelay, fl.goSkip),
		{name: compGateway, run: func() error { return cr.gatewayTrue(ctx) }, skip: workerSkip},
		{name: subjManaged, run: managedTrue, skip: workerSkip},
		{name: subjDaemon, run: dmn.runTrue, skip: workerSkip},
		{name: subjConfined, run: func() error { return cr.runTrue(ctx, cr.host, cr.alice) }, skip: confinedSkip},
		{name: subjDirect, run: func() error { return cr.runTrue(ctx, cr.host, cr.bob) }},
		{name: subjBwrap, run: runExec("bwrap", "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--unshare-all", "true"), skip: toolSkip("bwrap", false)},
		{name: subjUnshare, run: runExec("unshare", "--user", "--map-root-user", "--mount", "--pid", "--fork", "--net", "true"), skip: toolSkip("unshare", false)},
		{name: subjNsenter, run: nsenter, skip: nsSkip},
		{name: subjBarePaced, run: bareTrue, pause: pace},
		{name: subjManagedPaced, run: managedTrue, skip: workerSkip, pause: pace},
		{name: compPrepare, run: func() error { return cr.prepareRelease(ctx) }, skip: workerSkip},
		{name: compJournal, run: func() error { return cr.journalTrue(ctx) }, skip: workerSkip},
		{name: subjManagedSlim, run: func() error { return slim.runTrue(ctx, slim.managed, slim.alice) }, skip: slimSkip},
	}
	step := func(s string) {
		fmt.Fprintf(os.Stderr, "bench: %s (%v)\n", s, time.Since(rep.started).Round(time.Millisecond))
	}

	if cfg.on("latency") {
		step("latency")
		cfg.phase("latency", func() { rep.latency = measureLatency(subjects, cfg.n) })
	}
	switch {
	case !cfg.on("cold"):
		rep.cold = latRow{name: "corral managed, cold (new machine)", skip: "not selected"}
	case workerSkip == "":
		step("cold start")
		cfg.phase("cold", func() { rep.cold = coldSamples(ctx, cr, cfg.cold) })
	default:
		rep.cold = latRow{name: "corral managed, cold (new machine)", skip: workerSkip}
	}

	if cfg.on("capture") {
		step("capture")
		cfg.phase("capture", func() {
			rep.capture = measureCapture(ctx, cr, workerSkip, cfg.captureBytes, cfg.captureSamples)
		})
	}

	if cfg.on("concurrency") {
		step("concurrency")
		cs := []concSubject{
			{name: subjBareCc, run: bareTrue},
			{name: subjBareCapture, run: bareCaptureTrue},
			fl.concSubject(subjAgentCRelay, fl.cRelay, fl.cSkip),
			{name: storeFloor.name, run: storeFloor.run, skip: storeFloor.skip},
		}
		if !cfg.short {
			cs = append(cs, fl.concSubject(subjAgentGoRly, fl.goRelay, fl.goSkip),
				concSubject{name: compGateway, run: func() error { return cr.gatewayTrue(ctx) }, skip: workerSkip})
		}
		cs = append(cs, concSubject{name: subjManagedCc, run: managedTrue, skip: workerSkip})
		if slim != nil {
			cs = append(cs, concSubject{name: subjSlimCc, run: func() error { return slim.runTrue(ctx, slim.managed, slim.alice) }})
		}
		cfg.phase("concurrency", func() {
			for _, level := range concLevels {
				rep.conc = append(rep.conc, measureConcurrency(cs, level, cfg.concDuration, acct)...)
			}
		})
	}

	for _, p := range extraPhases {
		if !cfg.on(p.name) {
			continue
		}
		step(p.name)
		env := &phaseEnv{cfg: cfg, cr: cr, workerSkip: workerSkip, dmn: dmn, bare: rep.lat(subjBare)}
		cfg.phase(p.name, func() { rep.extras = append(rep.extras, extraResult{phase: p, rows: p.run(ctx, env)}) })
	}

	// The target holds at the default limits; at 64 MiB the results
	// alone (10 × 64 MiB of strings) are 640 MiB, so that row informs.
	floods := []floodRow{
		{name: "10 × `cat /dev/zero`, default 1 MiB stdout limit", limit: sandbox.DefaultStreamLimit, par: 10, target: true},
		{name: "10 × `cat /dev/zero`, 64 MiB stdout limit each", limit: 64 << 20, par: 10},
	}
	if cfg.on("flood") {
		step("flood")
	} else {
		floods = nil
	}
	for _, f := range floods {
		if workerSkip != "" {
			f.err, f.skipped = errors.New(workerSkip), true
		} else if ws, err := w.workspace("flood"); err != nil {
			// Every flood child's core names its project 1: they share
			// one workspace, so the worker sees one project.
			f.err = err
		} else {
			args := []string{"-socket", w.socket, "-workspace", ws,
				"-limit", strconv.FormatInt(f.limit, 10), "-par", strconv.Itoa(f.par)}
			if cfg.profile != "" {
				args = append(args, "-memprofile", filepath.Join(cfg.profile, fmt.Sprintf("flood%d.allocs.pprof", f.limit)))
			}
			f.err = runChild(&f.res, "__flood", args...)
		}
		rep.flood = append(rep.flood, f)
	}

	if !cfg.on("leases") {
		step("done")
		return rep, nil
	}
	step("leases")
	var lr leasesResult
	largs := []string{"-n", strconv.Itoa(cfg.leases), "-rounds", strconv.Itoa(cfg.leaseRounds)}
	if cfg.profile != "" {
		largs = append(largs, "-cpuprofile", filepath.Join(cfg.profile, "leases.pprof"))
	}
	if err := runChild(&lr, "__leases", largs...); err != nil {
		rep.leaseErr = err
	} else {
		rep.leases = &lr
	}
	step("done")
	return rep, nil
}

// concLevels are the levels of parallelism measured.
var concLevels = []int{1, 8, 64}

// daemonProc is the daemon's HTTP app serving on a Unix socket, and a
// client of it as alice.
type daemonProc struct {
	app    *daemon.App
	cancel context.CancelFunc
	done   chan error
	cl     *client.Client
	pid    int64
}

func startDaemon(ctx context.Context, dir string, cr *corral) (*daemonProc, error) {
	log := slog.Default()
	app, err := daemon.BuildApp(cr.core, daemon.AppOptions{StateDir: dir, Logger: log})
	if err != nil {
		return nil, err
	}
	sock := filepath.Join(dir, "d.sock")
	ln, err := daemon.ListenUnix(sock, daemon.SocketMode)
	if err != nil {
		app.Close()
		return nil, err
	}
	token, _, err := cr.st.CreateToken(ctx, cr.alice.AccountUserID, "bench")
	if err != nil {
		ln.Close()
		app.Close()
		return nil, err
	}
	cl, err := client.New(sock, token)
	if err != nil {
		ln.Close()
		app.Close()
		return nil, err
	}
	sctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	d := &daemonProc{app: app, cancel: cancel, done: make(chan error, 1), cl: cl, pid: cr.managed.ID}
	go func() { d.done <- daemon.Serve(sctx, app, []net.Listener{ln}, log) }()
	return d, nil
}

func (d *daemonProc) runTrue() error {
	res, err := d.cl.RunCommand(context.Background(), d.pid, client.CommandRequest{
		Command: sandbox.Command{Type: sandbox.CommandTypeArgv, File: "true"},
	})
	if err != nil {
		return err
	}
	if res.Code == nil || *res.Code != 0 {
		return fmt.Errorf("true: code %v signal %q", res.Code, res.Signal)
	}
	return nil
}

func (d *daemonProc) stop() {
	d.cl.HTTPClient().CloseIdleConnections()
	d.cancel()
	<-d.done
	d.app.Close()
}
