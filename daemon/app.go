// Package daemon is corral's HTTP application: the authenticated API over
// a core (accounts' bearer tokens, projects, members, bounded commands,
// raw sessions over WebSocket), the Sites gateway, and what operators
// watch (/metrics, /healthz). It serves whatever listeners it is given;
// Serve runs it on a Unix socket and optionally TCP with a graceful
// shutdown.
//
// The app never builds a privileged transport of its own: managed calls go
// through the core's machine gateway, built from the transport the host
// handed core.Build. Without one, they answer 503 "no privileged transport
// in this process".
//
// Every error is translated once, at the HTTP boundary, into an APIError
// whose JSON form is the pinned body
// {"error":{"kind":K,"message":S,"stdout":S,"stderr":S}}.
package daemon

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/corral-sandbox/corral/api"
	"github.com/corral-sandbox/corral/core"
	"github.com/corral-sandbox/corral/docs"
	"github.com/corral-sandbox/corral/export"
	"github.com/corral-sandbox/corral/mcpserver"
	"github.com/corral-sandbox/corral/projects"
	"github.com/corral-sandbox/corral/store"
)

// Defaults of AppOptions.
const (
	DefaultMaxBody    = 1 << 20
	DefaultMaxStdin   = 16 << 20
	DefaultMaxTimeout = time.Hour
	DefaultMaxOutput  = 64 << 20
)

// AppOptions configure BuildApp. The zero value means the documented
// defaults.
type AppOptions struct {
	// StateDir is the daemon's state directory: managed projects' workspaces
	// are created under StateDir/projects. Empty refuses to create managed
	// projects over HTTP.
	StateDir string
	// Logger receives access logs and diagnostics; nil means the core's
	// logger, slog.Default().
	Logger *slog.Logger
	// Metrics collects the Prometheus metrics served at /metrics. Nil
	// creates one, but then commands are counted only if its Observe was
	// set as core.Options.Control.Observe before core.Build (see
	// NewMetrics). Give each App its own Metrics.
	Metrics *Metrics
	// Admins names the accounts allowed to create accounts and tokens over
	// HTTP. Nil allows nobody (use the CLI).
	Admins []string
	// AllowHostPaths lets callers name host paths over HTTP: host
	// projects, managed projects copied from a host directory and git URLs
	// with the file protocol, for the accounts an admin granted host paths
	// (store.SetHostPaths, corral account grant host-paths), and trusted
	// members. False refuses them to everyone (403) — the CLI can still do
	// all of it. "/", the state directory and directories containing it
	// are refused whatever the grant.
	AllowHostPaths bool
	// GitImport configures the clones of projects created from a git URL
	// (which address ranges besides public ones they may reach).
	GitImport projects.GitImportOptions
	// MaxBody caps request bodies, in bytes; larger ones are refused with
	// 413 "requestTooLarge". Zero means DefaultMaxBody (1 MiB).
	MaxBody int64
	// MaxStdin caps the decoded "stdin" of a command request, in bytes;
	// a larger one is refused with 413 "requestTooLarge" (the request's
	// body may then be MaxBody plus the base64 of MaxStdin). Zero means
	// DefaultMaxStdin (16 MiB).
	MaxStdin int64
	// MaxTimeout caps a command's timeoutMs. Zero means DefaultMaxTimeout.
	MaxTimeout time.Duration
	// MaxOutput caps each output limit of a command, in bytes. Zero means
	// DefaultMaxOutput (64 MiB).
	MaxOutput int64
	// Export configures POST /v1/projects/{id}/export: the host's push
	// credential and which remotes are allowed. The zero value allows
	// https remotes only and pushes without a credential.
	Export export.Options
	// MaxSessionLifetime ends sessions (WebSocket, LSP, proxied site
	// connections) this long after they opened (close 1008). Zero means
	// DefaultMaxSessionLifetime (24 h).
	MaxSessionLifetime time.Duration
	// SessionCheckInterval is how often live sessions are checked against
	// the store (token revoked, account deleted, membership removed,
	// lifetime reached). Zero means DefaultSessionCheckInterval (1 s).
	SessionCheckInterval time.Duration
	// Sites configures the Sites gateway's own origins (NAME.D), signed
	// site URLs and their cookies. The zero value serves sites by path
	// only.
	Sites SitesOptions
	// ExportSweep tunes the sweeper that deletes export bundles left in
	// machines; it runs until Close. The zero value means its defaults.
	ExportSweep export.SweepOptions
	// Background processes (see processes.go). ProcessLifetime is a
	// process's lifetime when its request names none (zero:
	// DefaultProcessLifetime, 1 h); MaxProcessLifetime bounds the one it
	// names (zero: DefaultMaxProcessLifetime, 24 h). ProcessOutputBuffer
	// is how much of its newest output is retained when the request names
	// no size (zero: DefaultProcessOutputBuffer, 1 MiB);
	// MaxProcessOutputBuffer bounds the size a request names (zero:
	// DefaultMaxProcessOutputBuffer, 16 MiB). ProcessRetention is how long
	// an ended process stays listed with its outcome and output (zero:
	// DefaultProcessRetention, 10 min). MaxProcessesPerProject and
	// MaxProcessesPerAccount bound running processes (zero: 16 and 64);
	// a project also keeps at most MaxProcessesPerProject ended ones.
	ProcessLifetime        time.Duration
	MaxProcessLifetime     time.Duration
	ProcessOutputBuffer    int64
	MaxProcessOutputBuffer int64
	ProcessRetention       time.Duration
	MaxProcessesPerProject int
	MaxProcessesPerAccount int
	// OwnerLimits are the largest machine limits a project owner who is
	// not an admin may set (PUT /v1/projects/{id}/machine): the machines'
	// defaults, so that an owner may lower a limit but never lift one,
	// nor remove one (a negative value), which only admins may. A zero
	// field means the worker's default (DefaultOwnerLimits); a negative
	// one no ceiling (the defaults are unlimited); Disk zero means any
	// size (the default disk is none).
	OwnerLimits api.Limits
	// MaxAccountProjects bounds the projects an account that is not an
	// admin may have created and not deleted (POST /v1/projects answers
	// 403 beyond; projects others made it an owner of do not count): each managed
	// project takes one of the worker's host id ranges, which all
	// accounts share. Zero means DefaultMaxAccountProjects; negative, no
	// bound.
	MaxAccountProjects int
}

// DefaultMaxAccountProjects is AppOptions.MaxAccountProjects' default:
// a tenth of the worker's id ranges (worker.DefaultMaxProjects).
const DefaultMaxAccountProjects = 100

// App is the daemon's HTTP application over one core. It is an
// http.Handler; Close it when done (after the server stopped).
type App struct {
	core    *core.Core
	store   store.Store
	opts    AppOptions
	log     *slog.Logger
	metrics *Metrics
	mux     *http.ServeMux
	routes  []Route
	admins  map[string]bool
	proj    *projects.Projects
	sites   *sitesGateway

	exporter *export.Exporter
	procs    *processTable
	mcp      *mcpserver.Handler

	ctx     context.Context // ended by Close: cancels sessions
	cancel  context.CancelFunc
	sessMu  sync.Mutex
	closing bool                      // guarded by sessMu
	live    map[*liveSession]struct{} // guarded by sessMu
	// untracked is closed, and replaced, whenever a session leaves live
	// (guarded by sessMu): deleteProject waits on it.
	untracked chan struct{}
	wg        sync.WaitGroup // sessions in flight

	followDone chan struct{} // closed when followSessions returned
	once       sync.Once

	imports   inflight // git imports
	fileCalls inflight // files API calls
	mcpCalls  inflight // MCP requests
}

// Bounds of git imports (POST /v1/projects with a git URL) running at
// once: each is a clone on the host for up to CloneTimeout.
const (
	MaxAccountImports = 2 // per account that is not an admin
	MaxImports        = 8 // for the whole daemon
)

// Route is one registered route: Method is empty for routes that accept
// every method (the Sites gateway). Pattern uses net/http's syntax.
type Route struct {
	Method  string
	Pattern string
	// Auth says the route needs a bearer token.
	Auth    bool
	handler func(w http.ResponseWriter, r *http.Request) error
}

// BuildApp builds the HTTP app over c. It forwards nothing it builds
// itself: managed calls use c's machine gateway. It fails if the metrics
// cannot be registered (a Metrics already used by another App).
func BuildApp(c *core.Core, opts AppOptions) (*App, error) {
	if c == nil {
		return nil, errors.New("daemon: BuildApp needs a core")
	}
	if opts.MaxStdin <= 0 {
		opts.MaxStdin = DefaultMaxStdin
	}
	if opts.MaxBody <= 0 {
		opts.MaxBody = DefaultMaxBody
	}
	if opts.MaxTimeout <= 0 {
		opts.MaxTimeout = DefaultMaxTimeout
	}
	if opts.MaxAccountProjects == 0 {
		opts.MaxAccountProjects = DefaultMaxAccountProjects
	}
	if opts.MaxOutput <= 0 {
		opts.MaxOutput = DefaultMaxOutput
	}
	if opts.MaxSessionLifetime <= 0 {
		opts.MaxSessionLifetime = DefaultMaxSessionLifetime
	}
	if opts.SessionCheckInterval <= 0 {
		opts.SessionCheckInterval = DefaultSessionCheckInterval
	}
	opts.processDefaults()
	log := opts.Logger
	if log == nil {
		log = slog.Default()
	}
	if err := opts.Sites.normalize(); err != nil {
		return nil, err
	}
	m := opts.Metrics
	if m == nil {
		m = NewMetrics()
	}
	a := &App{
		core:      c,
		store:     c.Store(),
		opts:      opts,
		log:       log,
		metrics:   m,
		mux:       http.NewServeMux(),
		admins:    make(map[string]bool),
		live:      make(map[*liveSession]struct{}),
		untracked: make(chan struct{}),
		procs:     newProcessTable(),

		imports:   inflight{what: "git imports", account: MaxAccountImports, daemon: MaxImports},
		fileCalls: inflight{what: "files calls", account: MaxAccountFileCalls, daemon: MaxFileCalls},
		mcpCalls:  inflight{what: "MCP requests", account: MaxAccountMCPRequests, daemon: MaxMCPRequests},

		followDone: make(chan struct{}),
	}
	for _, n := range opts.Admins {
		a.admins[n] = true
	}
	a.ctx, a.cancel = context.WithCancel(context.Background())
	a.proj = &projects.Projects{Store: a.store, StateDir: opts.StateDir, GitImport: opts.GitImport, Logger: log, Gateway: c.Gateway(), Sandbox: c.Sandbox}
	if err := m.attach(c); err != nil {
		return nil, err
	}
	a.sites = newSitesGateway(a, opts.Sites)
	if err := a.startExport(); err != nil {
		return nil, err
	}
	go a.followSessions()
	a.mcp = mcpserver.NewHandler(a, mcpserver.Options{Logger: log})
	a.routes = []Route{
		{"GET", "/healthz", false, a.healthz},
		{"GET", "/metrics", false, a.serveMetrics},
		{"GET", "/openapi.json", false, a.openapi},
		{"GET", "/v1/whoami", true, a.whoami},
		{"POST", "/v1/accounts", true, a.createAccount},
		{"POST", "/v1/accounts/{name}/tokens", true, a.createToken},
		{"GET", "/v1/images", true, a.listImages},
		{"POST", "/v1/images", true, a.pullImage},
		{"GET", "/v1/projects", true, a.listProjects},
		{"POST", "/v1/projects", true, a.createProject},
		{"GET", "/v1/projects/{id}", true, a.getProject},
		{"DELETE", "/v1/projects/{id}", true, a.deleteProject},
		{"PUT", "/v1/projects/{id}/machine", true, a.setMachine},
		{"POST", "/v1/projects/{id}/reset", true, a.resetMachine},
		{"GET", "/v1/projects/{id}/members", true, a.listMembers},
		{"POST", "/v1/projects/{id}/members", true, a.addMember},
		{"POST", "/v1/projects/{id}/commands", true, a.runCommand},
		{"GET", "/v1/projects/{id}/sessions", true, a.session},
		{"GET", "/v1/projects/{id}/sites", true, a.listSites},
		{"PUT", "/v1/projects/{id}/sites/{name}", true, a.publishSite},
		{"DELETE", "/v1/projects/{id}/sites/{name}", true, a.unpublishSite},
		{"POST", "/v1/projects/{id}/sites/{name}/url", true, a.siteURL},
		{"GET", "/v1/projects/{id}/lsp/{server}", true, a.lspSession},
		{"POST", "/v1/projects/{id}/export", true, a.exportBranch},
		{"GET", "/v1/projects/{id}/git/status", true, a.editorGit},
		{"GET", "/v1/projects/{id}/git/log", true, a.editorGit},
		{"GET", "/v1/projects/{id}/git/diff", true, a.editorGit},
		{"GET", "/v1/projects/{id}/git/show", true, a.editorGit},
		{"GET", "/v1/projects/{id}/egress", true, a.getEgress},
		{"PUT", "/v1/projects/{id}/egress", true, a.putEgress},
		{"GET", "/v1/projects/{id}/egress/log", true, a.egressLog},
		{"POST", "/v1/projects/{id}/processes", true, a.startProcess},
		{"GET", "/v1/projects/{id}/processes", true, a.listProcesses},
		{"GET", "/v1/projects/{id}/processes/{pid}", true, a.getProcess},
		{"DELETE", "/v1/projects/{id}/processes/{pid}", true, a.deleteProcess},
		{"GET", "/v1/projects/{id}/processes/{pid}/output", true, a.processOutput},
		{"POST", "/v1/projects/{id}/processes/{pid}/signal", true, a.signalProcess},
		{"GET", "/v1/projects/{id}/files", true, a.getFile},
		{"PUT", "/v1/projects/{id}/files", true, a.putFile},
		{"GET", "/v1/projects/{id}/files/stat", true, a.statFile},
		{"GET", "/v1/projects/{id}/files/list", true, a.listFiles},
		{"POST", "/v1/projects/{id}/files/mkdir", true, a.makeDirectory},
		{"POST", "/v1/projects/{id}/files/remove", true, a.removeFile},
		{"POST", "/v1/projects/{id}/files/rename", true, a.renameFile},
		{"GET", "/v1/projects/{id}/files/watch", true, a.watchFiles},
		{"POST", "/v1/mcp", true, a.serveMCP},
		{"", "/sites/{name}/{path...}", true, a.sites.serve},
	}
	for _, rt := range a.routes {
		pattern := rt.Pattern
		if rt.Method != "" {
			pattern = rt.Method + " " + pattern
		}
		a.mux.Handle(pattern, a.wrap(rt))
	}
	// /sites/{name} without the trailing slash redirects, so that relative
	// links of the site resolve below its prefix.
	a.mux.HandleFunc("/sites/{name}", func(w http.ResponseWriter, r *http.Request) {
		u := *r.URL
		u.Path, u.RawPath = r.URL.Path+"/", ""
		http.Redirect(w, r, u.RequestURI(), http.StatusPermanentRedirect)
	})
	a.mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, apiErr(http.StatusNotFound, KindNotFound, "no route for %s %s", r.Method, r.URL.Path))
	})
	return a, nil
}

// Routes returns the registered routes (for documentation and tests).
func (a *App) Routes() []Route { return append([]Route(nil), a.routes...) }

// Metrics returns the app's metrics.
func (a *App) Metrics() *Metrics { return a.metrics }

// Projects returns the project service the app uses.
func (a *App) Projects() *projects.Projects { return a.proj }

// ServeHTTP implements http.Handler. A request whose Host is under the
// sites domain (AppOptions.Sites.Domain) goes to the Sites gateway and
// never to the API.
func (a *App) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if _, under := a.sites.hostSite(r.Host); under {
		a.sites.host.ServeHTTP(w, r)
		return
	}
	a.mux.ServeHTTP(w, r)
}

// Close cancels every session still open (their leases are released) and
// waits for them to end, then closes the Sites gateway's idle connections.
// It does not close the core. It blocks, and may be called more than once.
func (a *App) Close() error {
	a.once.Do(func() {
		a.sessMu.Lock()
		a.closing = true
		a.sessMu.Unlock()
		a.cancel()
		a.wg.Wait()
		<-a.followDone
		a.sites.close()
		_ = a.mcp.Close()
	})
	return nil
}

// statusWriter records the status written, for logs and metrics. It
// passes hijacking and flushing through (WebSocket upgrades, proxies).
type statusWriter struct {
	http.ResponseWriter
	status int
	bytes  int64
}

func (w *statusWriter) WriteHeader(code int) {
	if w.status == 0 {
		w.status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	n, err := w.ResponseWriter.Write(b)
	w.bytes += int64(n)
	return n, err
}

func (w *statusWriter) Flush() {
	if f, ok := w.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

func (w *statusWriter) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	h, ok := w.ResponseWriter.(http.Hijacker)
	if !ok {
		return nil, nil, errors.New("daemon: connection cannot be hijacked")
	}
	if w.status == 0 {
		w.status = http.StatusSwitchingProtocols
	}
	return h.Hijack()
}

func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// wrap turns a route's handler into an http.Handler: it records the
// status, translates a returned error into the API's error body, and logs
// and counts the request.
func (a *App) wrap(rt Route) http.Handler {
	label := rt.Pattern
	if rt.Method != "" {
		label = rt.Method + " " + rt.Pattern
	}
	return http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		start := time.Now()
		w := &statusWriter{ResponseWriter: rw}
		var err error
		if rt.Auth {
			var acct store.Account
			var tok int64
			acct, tok, err = a.authenticate(r)
			if err == nil {
				r = r.WithContext(context.WithValue(withAccount(r.Context(), acct), tokenKey{}, tok))
			}
		}
		if err == nil {
			err = rt.handler(w, r)
		}
		var ae *APIError
		if err != nil {
			ae = a.writeFailure(w, r, err)
		}
		status := w.status
		if status == 0 {
			status = http.StatusOK
		}
		a.metrics.requests.WithLabelValues(label, strconv.Itoa(status)).Inc()
		attrs := []any{"method", r.Method, "route", label, "path", r.URL.Path, "status", status, "duration", time.Since(start)}
		if acct, ok := accountFrom(r.Context()); ok {
			attrs = append(attrs, "account", acct.ID)
		}
		switch {
		case ae != nil && ae.Status >= 500:
			a.log.Error("request failed", append(attrs, "kind", ae.Kind, "err", ae.Cause)...)
		case ae != nil:
			a.log.Info("request refused", append(attrs, "kind", ae.Kind, "message", ae.Message)...)
		case !rt.Auth:
			// Probes and scrapes: not worth an info line each.
			a.log.Debug("request", attrs...)
		default:
			a.log.Info("request", attrs...)
		}
	})
}

// writeFailure translates err (toAPIError) and writes it, unless a
// response was written already (then it records the error's status in w, a
// *statusWriter). A handler that must write its error before it returns
// (while its output is still reserved) calls it, and returns err too.
func (a *App) writeFailure(rw http.ResponseWriter, r *http.Request, err error) *APIError {
	ae := toAPIError(err)
	if ae.Status == StatusClientClosed && r.Context().Err() == nil {
		// An abort the client did not cause (the daemon is shutting
		// down) is the server's unavailability.
		ae.Status = http.StatusServiceUnavailable
	}
	w, ok := rw.(*statusWriter)
	switch {
	case !ok || w.status == 0:
		writeError(rw, ae)
	case w.status != ae.Status:
		// A hijacked or half-written response: record the error's
		// status.
		w.status = ae.Status
	}
	return ae
}

// jsonStreamer is a value that streams its own JSON (command results and
// error bodies: their output may be tens of MiB, which encoding/json would
// copy several times).
type jsonStreamer interface {
	WriteJSON(w io.Writer, escapeHTML bool) error
}

// writeJSON writes v as JSON with status. The bytes are json.Marshal's
// and a newline; a jsonStreamer is streamed without a copy.
func writeJSON(w http.ResponseWriter, status int, v any) {
	if js, ok := v.(jsonStreamer); ok {
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("X-Content-Type-Options", "nosniff")
		w.WriteHeader(status)
		if js.WriteJSON(w, true) == nil {
			_, _ = io.WriteString(w, "\n")
		}
		return
	}
	b, err := json.Marshal(v)
	if err != nil {
		status = http.StatusInternalServerError
		b = []byte(`{"error":{"kind":"internal","message":"cannot encode response","stdout":"","stderr":""}}`)
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(status)
	_, _ = w.Write(append(b, '\n'))
}

// decodeBody decodes r's JSON body into v: at most MaxBody bytes (413
// "requestTooLarge" beyond), unknown fields and trailing data refused (400).
func (a *App) decodeBody(w http.ResponseWriter, r *http.Request, v any) error {
	return a.decodeBodyLimit(w, r, v, a.opts.MaxBody)
}

// decodeBodyLimit is decodeBody with a cap of limit bytes.
func (a *App) decodeBodyLimit(w http.ResponseWriter, r *http.Request, v any, limit int64) error {
	if ct := r.Header.Get("Content-Type"); ct != "" && !strings.HasPrefix(ct, "application/json") {
		return apiErr(http.StatusUnsupportedMediaType, KindInvalid, "content type %q is not application/json", ct)
	}
	body := http.MaxBytesReader(w, r.Body, limit)
	dec := json.NewDecoder(body)
	dec.DisallowUnknownFields()
	err := dec.Decode(v)
	if err == nil {
		if dec.More() {
			err = errors.New("trailing data after the JSON object")
		} else if _, terr := dec.Token(); terr == nil {
			err = errors.New("trailing data after the JSON object")
		}
	}
	if err == nil {
		return nil
	}
	var mbe *http.MaxBytesError
	if errors.As(err, &mbe) {
		return apiErr(http.StatusRequestEntityTooLarge, KindRequestTooLarge, "request body is larger than %d bytes", mbe.Limit)
	}
	return apiErr(http.StatusBadRequest, KindInvalid, "request body: %v", err)
}

func (a *App) healthz(w http.ResponseWriter, r *http.Request) error {
	ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
	defer cancel()
	if _, err := a.store.SchemaVersion(ctx); err != nil {
		return apiErr(http.StatusServiceUnavailable, KindUnavailable, "store: %v", err)
	}
	body := api.Health{Status: "ok", Store: "ok", Sandbox: "ok", Worker: a.metrics.workerState()}
	if _, err := a.core.Sandbox(); err != nil {
		body.Sandbox = err.Error()
	}
	// A worker that cannot start machines fails every managed command:
	// unhealthy for a while after each such failure.
	if at, msg := a.core.Gateway().LastStartFailure(); !at.IsZero() && time.Since(at) < StartFailureWindow {
		return apiErr(http.StatusServiceUnavailable, KindUnavailable, "worker: failed to start a machine %s ago: %s", time.Since(at).Round(time.Second), msg)
	}
	writeJSON(w, http.StatusOK, body)
	return nil
}

// StartFailureWindow is how long after the worker last failed to start a
// machine /healthz answers 503.
const StartFailureWindow = time.Minute

// serveMetrics serves GET /metrics: open on the Unix socket (whose mode
// decides who may connect), and only to an administrator's bearer token on
// TCP (401 without a valid token, 403 for other accounts). A Prometheus
// that cannot present one scrapes Config.MetricsListen instead.
func (a *App) serveMetrics(w http.ResponseWriter, r *http.Request) error {
	if !overUnixSocket(r) {
		acct, _, err := a.authenticate(r)
		if err != nil {
			return err
		}
		if !a.isAdmin(acct) {
			return apiErr(http.StatusForbidden, KindForbidden, "metrics are for the daemon's administrators (or its Unix socket, or --metrics-listen)")
		}
	}
	a.metrics.Handler().ServeHTTP(w, r)
	return nil
}

// overUnixSocket reports whether r arrived on a Unix socket listener.
func overUnixSocket(r *http.Request) bool {
	addr, ok := r.Context().Value(http.LocalAddrContextKey).(net.Addr)
	return ok && addr.Network() == "unix"
}

func (a *App) openapi(w http.ResponseWriter, _ *http.Request) error {
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(docs.OpenAPI)
	return nil
}

// pathID parses the {id} path value (400 if it is not a positive integer).
func pathID(r *http.Request) (int64, error) {
	s := r.PathValue("id")
	id, err := strconv.ParseInt(s, 10, 64)
	if err != nil || id <= 0 {
		return 0, apiErr(http.StatusBadRequest, KindInvalid, "project id %q is not a positive integer", s)
	}
	return id, nil
}
