package daemon

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/corral-sandbox/corral/core"
	"github.com/corral-sandbox/corral/machine"
	"github.com/corral-sandbox/corral/sandbox"
)

// Metrics are the daemon's Prometheus metrics, on a registry of their own
// (never the global one):
//
//	corral_commands_total{outcome}            commands settled: outcome is "exit",
//	                                          "signal" or the error kind
//	corral_commands_oom_killed_total          commands (outcome "signal",
//	                                          SIGKILL) the kernel's OOM
//	                                          killer killed
//	corral_command_duration_seconds{outcome}  start to end of started commands
//	corral_command_output_bytes_total{stream} bytes captured (stdout, stderr)
//	corral_live_leases                        live leases in the store
//	corral_sessions_active                    raw sessions with an open socket
//	corral_sessions_total                     raw sessions opened
//	corral_worker_connected                   1 if the worker answers a ping,
//	                                          0 if not, -1 without a transport
//	corral_worker_starts_total                worker processes started by the
//	                                          daemon's supervisor
//	corral_http_requests_total{route,code}    requests served
//	corral_egress_connections_total{verdict}  machines' outbound connection
//	                                          attempts: allowed, denied, failed
//	corral_egress_bytes_total{direction}      bytes through the egress proxies:
//	                                          in (to machines), out
//
// plus the Go and process collectors. Machines are not counted: the
// gateway does not report them.
//
// Commands are counted by Observe, which must be installed as
// core.Options.Control.Observe before core.Build, so that every
// RunCommand through the core (API, plugins) is seen:
//
//	m := daemon.NewMetrics()
//	c, _ := core.Build(ctx, core.Options{..., Control: sandbox.ControlOptions{Observe: m.Observe}})
//	app, _ := daemon.BuildApp(c, daemon.AppOptions{Metrics: m})
type Metrics struct {
	reg            *prometheus.Registry
	commands       *prometheus.CounterVec
	oomKilled      prometheus.Counter
	duration       *prometheus.HistogramVec
	output         *prometheus.CounterVec
	sessionsActive prometheus.Gauge
	sessionsTotal  prometheus.Counter
	workerStarts   prometheus.Counter
	requests       *prometheus.CounterVec
	egress         egressMetrics

	mu       sync.Mutex
	attached bool
	gateway  *machine.Gateway
}

// NewMetrics returns a fresh set of metrics.
func NewMetrics() *Metrics {
	m := &Metrics{
		reg: prometheus.NewRegistry(),
		commands: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "corral_commands_total",
			Help: "Commands settled, by outcome: exit, signal, or the error kind (prepare, start, timeout, abort, overflow, transport, cleanup).",
		}, []string{"outcome"}),
		oomKilled: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "corral_commands_oom_killed_total",
			Help: "Commands the kernel's OOM killer killed (counted in corral_commands_total as signal).",
		}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "corral_command_duration_seconds",
			Help:    "Run time of started commands, from start to settlement.",
			Buckets: []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 300},
		}, []string{"outcome"}),
		output: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "corral_command_output_bytes_total",
			Help: "Output bytes captured from commands, by stream.",
		}, []string{"stream"}),
		sessionsActive: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "corral_sessions_active",
			Help: "Raw sessions whose WebSocket is open.",
		}),
		sessionsTotal: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "corral_sessions_total",
			Help: "Raw sessions opened.",
		}),
		workerStarts: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "corral_worker_starts_total",
			Help: "Worker processes started by the daemon's supervisor.",
		}),
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "corral_http_requests_total",
			Help: "HTTP requests served, by route and status code.",
		}, []string{"route", "code"}),
	}
	m.reg.MustRegister(m.commands, m.oomKilled, m.duration, m.output, m.sessionsActive, m.sessionsTotal, m.workerStarts, m.requests,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	m.egress = newEgressMetrics(m.reg)
	return m
}

// Observe counts one settled command. Install it as
// core.Options.Control.Observe. It is safe for concurrent use.
func (m *Metrics) Observe(rec sandbox.Record) {
	outcome := "exit"
	switch {
	case rec.Err != nil:
		outcome = string(rec.Err.Kind)
	case rec.Result != nil && rec.Result.Code == nil:
		outcome = "signal"
	}
	m.commands.WithLabelValues(outcome).Inc()
	if rec.Result != nil && rec.Result.OOMKilled {
		m.oomKilled.Inc()
	}
	if !rec.Started.IsZero() && !rec.Ended.IsZero() {
		m.duration.WithLabelValues(outcome).Observe(rec.Ended.Sub(rec.Started).Seconds())
	}
	m.output.WithLabelValues("stdout").Add(float64(rec.StdoutBytes))
	m.output.WithLabelValues("stderr").Add(float64(rec.StderrBytes))
}

// WorkerStarted counts a worker process started by a supervisor.
func (m *Metrics) WorkerStarted() { m.workerStarts.Inc() }

// Handler serves the metrics in the Prometheus exposition format.
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{})
}

// Registry returns the registry the metrics are registered on, for
// embedders that add their own.
func (m *Metrics) Registry() *prometheus.Registry { return m.reg }

// attach registers the metrics that read c: live leases and the worker's
// state. A Metrics attaches to one core only.
func (m *Metrics) attach(c *core.Core) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.attached {
		return errors.New("daemon: these Metrics already serve another App")
	}
	m.attached = true
	m.gateway = c.Gateway()
	st := c.Store()
	leases := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "corral_live_leases",
		Help: "Live leases in the store (overdue ones included).",
	}, func() float64 {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		n, err := st.LiveLeaseCount(ctx)
		if err != nil {
			return -1
		}
		return float64(n)
	})
	worker := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "corral_worker_connected",
		Help: "1 if the privileged worker answers a ping, 0 if it does not, -1 if this process has no privileged transport.",
	}, func() float64 {
		switch m.workerState() {
		case "connected":
			return 1
		case "none":
			return -1
		}
		return 0
	})
	if err := m.reg.Register(leases); err != nil {
		return fmt.Errorf("daemon: register metrics: %w", err)
	}
	if err := m.reg.Register(worker); err != nil {
		return fmt.Errorf("daemon: register metrics: %w", err)
	}
	return nil
}

// workerState pings the worker (for at most a second): "connected",
// "unreachable", or "none" without a transport.
func (m *Metrics) workerState() string {
	m.mu.Lock()
	g := m.gateway
	m.mu.Unlock()
	if g == nil {
		return "none"
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	err := g.Ping(ctx)
	switch {
	case err == nil:
		return "connected"
	case errors.Is(err, machine.ErrNoPrivilegedTransport):
		return "none"
	}
	return "unreachable"
}
