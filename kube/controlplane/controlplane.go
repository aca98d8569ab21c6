// Package controlplane builds and runs a real Kubernetes control plane for
// tests and for people: etcd, kube-apiserver, kube-controller-manager and
// kube-scheduler built from Go modules (Build), started on loopback
// envtest-style (Start) with certificates generated in Go and an admin
// kubeconfig written, and stopped with everything they left (Stop).
//
//	bins, err := controlplane.Build(ctx, "", t.Logf) // once per cache, then at once
//	cp, err := controlplane.Start(ctx, controlplane.Options{Binaries: bins})
//	defer cp.Stop()
//	// cp.Kubeconfig is an admin kubeconfig for client-go or kubectl.
//
// Nothing is a fake: the API server stores in etcd, the scheduler binds
// Pods, the controller manager runs its controllers (node lifecycle,
// garbage collection, service accounts, ...). There is no kubelet: nodes
// are whatever registers (a corral node).
package controlplane

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/corral-sandbox/corral/internal/pdeath"
)

// Options configure Start. The zero value is valid when Binaries is set.
type Options struct {
	// Binaries are the programs to run; zero means Build's (building them
	// first if they are not in the cache yet).
	Binaries Binaries
	// Dir holds the control plane's state: certificates and keys, the
	// admin kubeconfig, etcd's data, each program's log (NAME.log). Empty
	// means a new temporary directory, removed by Stop; a Dir given is left
	// in place (with everything in it) by Stop.
	Dir string
	// ReadyTimeout bounds the start of every program (zero means 60s).
	ReadyTimeout time.Duration
}

// ControlPlane is a running control plane. Its fields are set by Start and
// must not be changed.
type ControlPlane struct {
	// Dir is the state directory (Options.Dir or the temporary one).
	Dir string
	// URL is the API server's base URL: https://127.0.0.1:PORT.
	URL string
	// Kubeconfig is the path of an admin kubeconfig (user "admin" in the
	// group system:masters, by client certificate) in Dir.
	Kubeconfig string
	// CA is the PEM certificate of the authority that signed the API
	// server's serving certificate and every client certificate it accepts.
	CA []byte
	// AdminCert and AdminKey are the admin's PEM client certificate and key.
	AdminCert, AdminKey []byte

	ownDir   bool
	procs    []*process // in start order
	stopOnce sync.Once
	stopErr  error
}

// process is one program of the control plane.
type process struct {
	name   string
	cmd    *exec.Cmd
	log    string
	exited chan struct{} // closed when the program has exited
	err    error         // its Wait error, set before exited is closed
}

// Start starts a control plane: etcd, then kube-apiserver, then
// kube-controller-manager and kube-scheduler, each on free loopback ports,
// and returns when every one answers its health check. Every program is
// the calling process's child, killed if it dies (parent-death signal), so
// a killed test leaves none behind. When a program exits before it is
// ready (another process took its port between choosing and binding), Start
// tries again with new ports, three times in all; its error then carries
// the end of that program's log. On error nothing is left running.
func Start(ctx context.Context, opts Options) (*ControlPlane, error) {
	bins := opts.Binaries
	if bins == (Binaries{}) {
		var err error
		if bins, err = Build(ctx, "", nil); err != nil {
			return nil, err
		}
	}
	if opts.ReadyTimeout == 0 {
		opts.ReadyTimeout = 60 * time.Second
	}
	cp := &ControlPlane{Dir: opts.Dir}
	if cp.Dir == "" {
		d, err := os.MkdirTemp("", "corral-controlplane-")
		if err != nil {
			return nil, fmt.Errorf("controlplane: %w", err)
		}
		cp.Dir, cp.ownDir = d, true
	} else if err := os.MkdirAll(cp.Dir, 0o700); err != nil {
		return nil, fmt.Errorf("controlplane: %w", err)
	}
	var err error
	for attempt := 1; attempt <= 3; attempt++ {
		if err = cp.start(ctx, bins, opts.ReadyTimeout); err == nil {
			return cp, nil
		}
		cp.stopProcesses()
		if !errors.Is(err, errEarlyExit) || ctx.Err() != nil {
			break
		}
	}
	if cp.ownDir {
		os.RemoveAll(cp.Dir)
	}
	return nil, err
}

// errEarlyExit marks a program that exited before it was ready.
var errEarlyExit = errors.New("exited before it was ready")

func (cp *ControlPlane) start(ctx context.Context, bins Binaries, timeout time.Duration) error {
	ports, err := freePorts(5)
	if err != nil {
		return err
	}
	etcdClient, etcdPeer, apiPort, cmPort, schedPort := ports[0], ports[1], ports[2], ports[3], ports[4]
	path := func(name string) string { return filepath.Join(cp.Dir, name) }
	for _, d := range []string{"etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler"} {
		if err := os.RemoveAll(path(d)); err != nil { // a retry or a reused Dir starts afresh
			return fmt.Errorf("controlplane: %w", err)
		}
		if err := os.MkdirAll(path(d), 0o700); err != nil {
			return fmt.Errorf("controlplane: %w", err)
		}
	}

	ca, err := newAuthority("corral-controlplane-ca")
	if err != nil {
		return fmt.Errorf("controlplane: certificates: %w", err)
	}
	serving, err := ca.issue("kube-apiserver", nil, true,
		[]string{"localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc", "kubernetes.default.svc.cluster.local"},
		[]net.IP{net.IPv4(127, 0, 0, 1), net.IPv4(10, 0, 0, 1)})
	if err != nil {
		return fmt.Errorf("controlplane: certificates: %w", err)
	}
	admin, err := ca.issue("admin", []string{"system:masters"}, false, nil, nil)
	if err != nil {
		return fmt.Errorf("controlplane: certificates: %w", err)
	}
	saKey, saPub, err := serviceAccountKey()
	if err != nil {
		return fmt.Errorf("controlplane: service-account key: %w", err)
	}
	cp.URL = "https://127.0.0.1:" + strconv.Itoa(apiPort)
	cp.CA, cp.AdminCert, cp.AdminKey = ca.pem, admin.cert, admin.key
	cp.Kubeconfig = path("kubeconfig")
	if err := writeFiles(map[string][]byte{
		path("ca.crt"):        ca.pem,
		path("apiserver.crt"): serving.cert,
		path("apiserver.key"): serving.key,
		path("sa.key"):        saKey,
		path("sa.pub"):        saPub,
		path("kubeconfig"):    cp.kubeconfig(),
		path("admin.crt"):     admin.cert,
		path("admin.key"):     admin.key,
	}); err != nil {
		return err
	}

	loop := func(p int) string { return "127.0.0.1:" + strconv.Itoa(p) }
	etcdURL := "http://" + loop(etcdClient)
	peerURL := "http://" + loop(etcdPeer)
	etcd, err := cp.run(bins.Etcd, "etcd",
		"--name=corral",
		"--data-dir="+path("etcd"),
		"--listen-client-urls="+etcdURL,
		"--advertise-client-urls="+etcdURL,
		"--listen-peer-urls="+peerURL,
		"--initial-advertise-peer-urls="+peerURL,
		"--initial-cluster=corral="+peerURL,
		"--unsafe-no-fsync=true", // a test's cluster: durable against etcd's crash, not the host's
		"--log-level=warn",
	)
	if err != nil {
		return err
	}
	plain := &http.Client{Timeout: 2 * time.Second}
	if err := etcd.await(ctx, timeout, plain, etcdURL+"/health"); err != nil {
		return err
	}

	api, err := cp.run(bins.APIServer, "kube-apiserver",
		"--etcd-servers="+etcdURL,
		"--bind-address=127.0.0.1",
		"--advertise-address=127.0.0.1",
		// A loopback address may not be the kubernetes Service's endpoint:
		// nothing runs in the cluster's network that would use it.
		"--endpoint-reconciler-type=none",
		"--secure-port="+strconv.Itoa(apiPort),
		"--cert-dir="+path("kube-apiserver"),
		"--tls-cert-file="+path("apiserver.crt"),
		"--tls-private-key-file="+path("apiserver.key"),
		"--client-ca-file="+path("ca.crt"),
		"--service-account-key-file="+path("sa.pub"),
		"--service-account-signing-key-file="+path("sa.key"),
		"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
		"--service-cluster-ip-range=10.0.0.0/24",
		"--authorization-mode=RBAC",
		"--allow-privileged=true",
		"--profiling=false",
	)
	if err != nil {
		return err
	}
	adminClient, err := cp.AdminHTTPClient()
	if err != nil {
		return err
	}
	if err := api.await(ctx, timeout, adminClient, cp.URL+"/readyz"); err != nil {
		return err
	}

	// Both serve their health on a self-signed certificate of their own
	// (in --cert-dir): only reachability and status are checked.
	selfSigned := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
	cm, err := cp.run(bins.ControllerManager, "kube-controller-manager",
		"--kubeconfig="+cp.Kubeconfig,
		"--authentication-kubeconfig="+cp.Kubeconfig,
		"--authorization-kubeconfig="+cp.Kubeconfig,
		"--bind-address=127.0.0.1",
		"--secure-port="+strconv.Itoa(cmPort),
		"--cert-dir="+path("kube-controller-manager"),
		"--leader-elect=false",
		"--service-account-private-key-file="+path("sa.key"),
		"--root-ca-file="+path("ca.crt"),
		"--use-service-account-credentials=false",
		"--profiling=false",
	)
	if err != nil {
		return err
	}
	sched, err := cp.run(bins.Scheduler, "kube-scheduler",
		"--kubeconfig="+cp.Kubeconfig,
		"--authentication-kubeconfig="+cp.Kubeconfig,
		"--authorization-kubeconfig="+cp.Kubeconfig,
		"--bind-address=127.0.0.1",
		"--secure-port="+strconv.Itoa(schedPort),
		"--cert-dir="+path("kube-scheduler"),
		"--leader-elect=false",
		"--profiling=false",
	)
	if err != nil {
		return err
	}
	if err := cm.await(ctx, timeout, selfSigned, "https://"+loop(cmPort)+"/healthz"); err != nil {
		return err
	}
	return sched.await(ctx, timeout, selfSigned, "https://"+loop(schedPort)+"/healthz")
}

// AdminHTTPClient returns an HTTP client that trusts the control plane's
// authority and presents the admin's client certificate: requests to URL
// act as a cluster administrator.
func (cp *ControlPlane) AdminHTTPClient() (*http.Client, error) {
	pair, err := tls.X509KeyPair(cp.AdminCert, cp.AdminKey)
	if err != nil {
		return nil, fmt.Errorf("controlplane: admin certificate: %w", err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(cp.CA)
	return &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{
		RootCAs:      pool,
		Certificates: []tls.Certificate{pair},
		MinVersion:   tls.VersionTLS12,
	}}}, nil
}

// kubeconfig returns the admin kubeconfig, every credential embedded.
func (cp *ControlPlane) kubeconfig() []byte {
	b64 := base64.StdEncoding.EncodeToString
	return fmt.Appendf(nil, `apiVersion: v1
kind: Config
clusters:
- name: corral
  cluster:
    server: %s
    certificate-authority-data: %s
users:
- name: admin
  user:
    client-certificate-data: %s
    client-key-data: %s
contexts:
- name: corral
  context:
    cluster: corral
    user: admin
current-context: corral
`, cp.URL, b64(cp.CA), b64(cp.AdminCert), b64(cp.AdminKey))
}

// run starts one program, its output appended to Dir/NAME.log.
func (cp *ControlPlane) run(bin, name string, args ...string) (*process, error) {
	logPath := filepath.Join(cp.Dir, name+".log")
	logf, err := os.OpenFile(logPath, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return nil, fmt.Errorf("controlplane: %w", err)
	}
	defer logf.Close() // the child holds its own descriptor
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.Dir = cp.Dir
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := pdeath.Start(cmd); err != nil {
		return nil, fmt.Errorf("controlplane: start %s: %w", name, err)
	}
	p := &process{name: name, cmd: cmd, log: logPath, exited: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		close(p.exited)
	}()
	cp.procs = append(cp.procs, p)
	return p, nil
}

// await polls url until it answers 200, the program exits, ctx ends or
// timeout passes.
func (p *process) await(ctx context.Context, timeout time.Duration, client *http.Client, url string) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var last string
	for {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return fmt.Errorf("controlplane: %w", err)
		}
		if resp, err := client.Do(req); err != nil {
			last = err.Error()
		} else {
			body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
			last = resp.Status + ": " + strings.TrimSpace(string(body))
		}
		select {
		case <-p.exited:
			return fmt.Errorf("controlplane: %s %w (%v); end of %s:\n%s", p.name, errEarlyExit, p.err, p.log, tail(p.log))
		case <-ctx.Done():
			return fmt.Errorf("controlplane: %s not ready at %s within %v (last: %s); end of %s:\n%s", p.name, url, timeout, last, p.log, tail(p.log))
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// tail returns the last lines of a log file.
func tail(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	if len(b) > 4000 {
		b = b[len(b)-4000:]
		if i := bytes.IndexByte(b, '\n'); i >= 0 {
			b = b[i+1:]
		}
	}
	return string(b)
}

// freePorts returns n distinct loopback ports that were free a moment ago.
func freePorts(n int) ([]int, error) {
	var ports []int
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("controlplane: choosing a port: %w", err)
		}
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

// Stop stops every program (SIGTERM, then SIGKILL to a program still
// running 20 seconds later; the last started first), waits for each to
// exit, and removes Dir when Start made it. Its error is the removal's;
// later calls return the first call's result.
func (cp *ControlPlane) Stop() error {
	cp.stopOnce.Do(func() {
		cp.stopProcesses()
		if cp.ownDir {
			if err := os.RemoveAll(cp.Dir); err != nil {
				cp.stopErr = fmt.Errorf("controlplane: %w", err)
			}
		}
	})
	return cp.stopErr
}

func (cp *ControlPlane) stopProcesses() {
	for i := len(cp.procs) - 1; i >= 0; i-- {
		p := cp.procs[i]
		pgid := -p.cmd.Process.Pid
		syscall.Kill(pgid, syscall.SIGTERM)
		select {
		case <-p.exited:
		case <-time.After(20 * time.Second):
			syscall.Kill(pgid, syscall.SIGKILL)
			<-p.exited
		}
	}
	cp.procs = nil
}
