package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/corral-sandbox/corral/machine"
	"github.com/corral-sandbox/corral/sandbox"
	"github.com/corral-sandbox/corral/store"
)

// subject is one way of running `true`, measured per call.
type subject struct {
	name string
	run  func() error
	skip string // why it cannot run here; empty if it can
	// pause is slept (untimed) before each sample: it lets background
	// work a call left behind finish before the next one.
	pause time.Duration
}

// latRow is the measured latency of one subject.
type latRow struct {
	name     string
	st       stats
	failures int
	skip     string
	firstErr error
}

// measureLatency runs every subject n times, interleaved in rounds so that
// drift of the machine affects all of them alike, after a few warm-up
// calls each.
func measureLatency(subjects []subject, n int) []latRow {
	const rounds = 10
	rows := make([]latRow, len(subjects))
	samples := make([][]time.Duration, len(subjects))
	for i, s := range subjects {
		rows[i].name, rows[i].skip = s.name, s.skip
		if s.skip != "" {
			continue
		}
		for range 5 {
			if err := s.run(); err != nil {
				rows[i].skip = fmt.Sprintf("warm-up failed: %v", err)
				rows[i].failures++
				rows[i].firstErr = err
				break
			}
		}
	}
	for r := range rounds {
		per := n / rounds
		if r < n%rounds {
			per++
		}
		for i, s := range subjects {
			if rows[i].skip != "" {
				continue
			}
			for range per {
				time.Sleep(s.pause)
				t0 := time.Now()
				err := s.run()
				d := time.Since(t0)
				if err != nil {
					rows[i].failures++
					if rows[i].firstErr == nil {
						rows[i].firstErr = err
					}
					continue
				}
				samples[i] = append(samples[i], d)
			}
		}
	}
	for i := range rows {
		rows[i].st = summarize(samples[i])
	}
	return rows
}

// runExec runs argv and waits for it.
func runExec(argv ...string) func() error {
	return func() error {
		out, err := exec.Command(argv[0], argv[1:]...).CombinedOutput()
		if err != nil {
			return fmt.Errorf("%s: %w: %s", strings.Join(argv, " "), err, bytesTrim(out))
		}
		return nil
	}
}

func bytesTrim(b []byte) string {
	s := strings.TrimSpace(string(b))
	if len(s) > 200 {
		s = s[:200] + "…"
	}
	return s
}

// bareTrue is the floor every ratio is taken against.
func bareTrue() error { return exec.Command("true").Run() }

// toolSkip says why a peer tool cannot be measured, or "".
func toolSkip(name string, needRoot bool) string {
	if _, err := exec.LookPath(name); err != nil {
		return name + " not installed (apt-get install " + map[string]string{"bwrap": "bubblewrap"}[name] + ")"
	}
	if needRoot && os.Geteuid() != 0 {
		return "needs root"
	}
	return ""
}

// heldNamespace is a `sleep infinity` in new user, mount, pid, net, ipc
// and uts namespaces, for nsenter to enter.
type heldNamespace struct {
	unshare *exec.Cmd
	pid     int // the sleep, PID 1 of the new pid namespace
}

func holdNamespace() (*heldNamespace, error) {
	cmd := exec.Command("unshare", "--user", "--map-root-user", "--mount", "--pid", "--net", "--ipc", "--uts",
		"--fork", "--kill-child", "sleep", "infinity")
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	h := &heldNamespace{unshare: cmd}
	children := fmt.Sprintf("/proc/%d/task/%d/children", cmd.Process.Pid, cmd.Process.Pid)
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		b, _ := os.ReadFile(children)
		if f := strings.Fields(string(b)); len(f) > 0 {
			pid, err := strconv.Atoi(f[0])
			if err == nil {
				// Wait until the child has exec'd sleep in its namespaces.
				if comm, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid)); strings.TrimSpace(string(comm)) == "sleep" {
					h.pid = pid
					return h, nil
				}
			}
		}
		time.Sleep(5 * time.Millisecond)
	}
	h.stop()
	return nil, errors.New("unshare did not start its sleep within 5s")
}

// stop kills the held namespace's processes (ours) and reaps unshare.
func (h *heldNamespace) stop() {
	if h == nil {
		return
	}
	if h.pid > 0 {
		_ = syscall.Kill(h.pid, syscall.SIGKILL)
	}
	_ = h.unshare.Process.Kill()
	_ = h.unshare.Wait()
}

// coldSamples measures the first command of n new managed projects: each
// starts a machine.
func coldSamples(ctx context.Context, cr *corral, n int) latRow {
	row := latRow{name: "corral managed, cold (new machine)"}
	var samples []time.Duration
	for range n {
		p, err := cr.coldProject(ctx)
		if err != nil {
			row.skip = err.Error()
			return row
		}
		t0 := time.Now()
		err = cr.runTrue(ctx, p, cr.alice)
		d := time.Since(t0)
		if err != nil {
			row.failures++
			if row.firstErr == nil {
				row.firstErr = err
			}
			continue
		}
		samples = append(samples, d)
	}
	row.st = summarize(samples)
	return row
}

// Components of a managed RunCommand, measured alone so that the table
// shows where its time goes.
const (
	compGateway = "component: machine gateway Exec + Wait (worker round trip, no store)"
	compPrepare = "component: PrepareExecution + lease Release (store: tenancy, lease insert and update)"
	compJournal = "component: journal start + finish (store: insert and update)"
)

// gatewayTrue runs `true` in the warm machine through the gateway alone.
func (cr *corral) gatewayTrue(ctx context.Context) error {
	s, err := cr.core.Gateway().Exec(ctx, machine.ExecRequest{
		Project: machine.Project{ID: cr.managed.ID, Workspace: cr.managed.Root},
		Account: cr.alice.AccountUserID,
		Argv:    []string{"true"},
		Cwd:     "/workspace",
		Env:     map[string]string{"PATH": "/usr/bin:/bin"},
	})
	if err != nil {
		return err
	}
	defer s.Close()
	exit, err := s.Wait()
	if err != nil {
		return err
	}
	if exit.Code == nil || *exit.Code != 0 {
		return fmt.Errorf("true: code %v signal %q", exit.Code, exit.Signal)
	}
	return nil
}

// prepareRelease prepares a managed `true` (tenancy checks, lease minted)
// and releases the lease without running anything.
func (cr *corral) prepareRelease(ctx context.Context) error {
	a := cr.alice
	prep, err := cr.ctl.PrepareExecution(ctx, input(cr.managed, "true"), &a)
	if err != nil {
		return err
	}
	return prep.Common().Lease.Release(ctx)
}

// storeFloor runs `true` through fc between the two store writes that
// DESIGN's RunCommand requires around every command, as corral makes them:
// the lease inserted with its journal entry in one statement before the
// start, released with the journal's end in one statement before the
// result. No tenancy, egress or supervision: the floor of the contract on
// top of the floor of the architecture.
func (cr *corral) storeFloor(ctx context.Context, fc *floorClient) func() error {
	return func() error {
		l, err := cr.st.CreateLease(ctx, store.NewLease{
			Account: cr.alice.AccountUserID, Project: cr.managed.ID, Kind: string(sandbox.LeaseEditor),
			Holder: "bench-floor", TTL: 15 * time.Second,
			Journal: &store.JournalCommand{
				Account: cr.alice.AccountUserID, Project: cr.managed.ID, Domain: "sandbox",
				LeaseKind: string(sandbox.LeaseEditor), Argv: []string{"true"},
				Limits: store.Limits{TimeoutMS: 10000, Stdout: 1 << 20, Stderr: 1 << 20},
			},
		}, time.Now())
		if err != nil {
			return err
		}
		runErr := fc.run([]string{"true"})
		code := 0
		_, err = cr.st.ReleaseAndFinish(ctx, l.ID, time.Now(), l.Journal, store.JournalEnd{Outcome: store.OutcomeExit, Code: &code})
		return errors.Join(runErr, err)
	}
}

// journalTrue writes one journal entry and finishes it, as core's journal
// hook does around every command.
func (cr *corral) journalTrue(ctx context.Context) error {
	id, err := cr.st.JournalStart(ctx, store.JournalCommand{
		Account: cr.alice.AccountUserID, Project: cr.managed.ID, Domain: "sandbox",
		Lease: "bench", LeaseKind: string(sandbox.LeaseTerminal), Argv: []string{"true"},
		Limits: store.Limits{TimeoutMS: 10000, Stdout: 1 << 20, Stderr: 1 << 20},
	})
	if err != nil {
		return err
	}
	code := 0
	return cr.st.JournalFinish(ctx, id, store.JournalEnd{Outcome: store.OutcomeExit, Code: &code})
}
