package controlplane_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/corral-sandbox/corral/kube/controlplane"
)

// binaries returns the control plane's programs, or skips t when they are
// not built: a test's timeout is no place for their build (minutes), which
// .ci/run does first (go run ./kube/controlplane/prebuild).
func binaries(t *testing.T) controlplane.Binaries {
	t.Helper()
	bins, ok := controlplane.Cached("")
	if !ok {
		t.Skipf("controlplane: the control plane is not built in %s: run go run ./kube/controlplane/prebuild (.ci/run does)", controlplane.CacheDir())
	}
	return bins
}

// api sends one request as the admin and decodes a JSON answer into out
// (when not nil); it returns the status code.
func api(t *testing.T, c *http.Client, method, url string, body any, out any) int {
	t.Helper()
	var r io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			t.Fatal(err)
		}
		r = bytes.NewReader(b)
	}
	req, err := http.NewRequest(method, url, r)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	if out != nil && resp.StatusCode < 300 {
		if err := json.Unmarshal(b, out); err != nil {
			t.Fatalf("%s %s: %v: %s", method, url, err, b)
		}
	}
	return resp.StatusCode
}

// eventually polls cond every 100ms until it returns nil, failing t with
// cond's last error after timeout.
func eventually(t *testing.T, timeout time.Duration, cond func() error) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		err := cond()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("after %v: %v", timeout, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestControlPlaneRunsAndStops starts the real control plane and checks
// each program at work through the API: the API server stores a namespace
// (etcd), the controller manager's service-account controller gives it its
// "default" ServiceAccount, and the scheduler marks a Pod unschedulable
// with its reason (no node exists). Stop ends every program and removes
// the state directory.
func TestControlPlaneRunsAndStops(t *testing.T) {
	bins := binaries(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	start := time.Now()
	cp, err := controlplane.Start(ctx, controlplane.Options{Binaries: bins})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("control plane ready in %v at %s", time.Since(start).Round(time.Millisecond), cp.URL)
	stopped := false
	defer func() {
		if !stopped {
			cp.Stop()
		}
	}()
	kc, err := os.ReadFile(cp.Kubeconfig)
	if err != nil || !strings.Contains(string(kc), "server: "+cp.URL) {
		t.Fatalf("kubeconfig %s: %v\n%s", cp.Kubeconfig, err, kc)
	}
	c, err := cp.AdminHTTPClient()
	if err != nil {
		t.Fatal(err)
	}
	// Without the admin's certificate the API server refuses (no anonymous
	// cluster access) but the TLS chain is its CA's.
	anon := &http.Client{Transport: &http.Transport{TLSClientConfig: c.Transport.(*http.Transport).TLSClientConfig.Clone()}}
	anon.Transport.(*http.Transport).TLSClientConfig.Certificates = nil
	if code := api(t, anon, "GET", cp.URL+"/api/v1/namespaces", nil, nil); code != http.StatusForbidden && code != http.StatusUnauthorized {
		t.Errorf("anonymous list of namespaces: status %d, want 401 or 403", code)
	}

	ns := fmt.Sprintf("cp-test-%d", time.Now().UnixNano())
	if code := api(t, c, "POST", cp.URL+"/api/v1/namespaces", map[string]any{
		"apiVersion": "v1", "kind": "Namespace", "metadata": map[string]any{"name": ns},
	}, nil); code != http.StatusCreated {
		t.Fatalf("create namespace: status %d", code)
	}
	eventually(t, 30*time.Second, func() error {
		if code := api(t, c, "GET", cp.URL+"/api/v1/namespaces/"+ns+"/serviceaccounts/default", nil, nil); code != http.StatusOK {
			return fmt.Errorf("ServiceAccount default in %s: status %d (the controller manager made none)", ns, code)
		}
		return nil
	})

	pod := map[string]any{
		"apiVersion": "v1", "kind": "Pod",
		"metadata": map[string]any{"name": "p"},
		"spec": map[string]any{
			"automountServiceAccountToken": false,
			"containers":                   []any{map[string]any{"name": "c", "image": "base", "command": []string{"true"}}},
		},
	}
	if code := api(t, c, "POST", cp.URL+"/api/v1/namespaces/"+ns+"/pods", pod, nil); code != http.StatusCreated {
		t.Fatalf("create pod: status %d", code)
	}
	eventually(t, 30*time.Second, func() error {
		var got struct {
			Status struct {
				Conditions []struct{ Type, Status, Reason, Message string }
			}
		}
		if code := api(t, c, "GET", cp.URL+"/api/v1/namespaces/"+ns+"/pods/p", nil, &got); code != http.StatusOK {
			return fmt.Errorf("get pod: status %d", code)
		}
		for _, cond := range got.Status.Conditions {
			if cond.Type == "PodScheduled" && cond.Status == "False" && cond.Reason == "Unschedulable" && cond.Message != "" {
				t.Logf("scheduler: %s", cond.Message)
				return nil
			}
		}
		return fmt.Errorf("pod conditions %+v: the scheduler has not marked it Unschedulable", got.Status.Conditions)
	})

	dir := cp.Dir
	if n := processesIn(dir); n != 4 {
		t.Errorf("%d processes name %s in their arguments, want 4 (etcd and the three of Kubernetes)", n, dir)
	}
	stopped = true
	if err := cp.Stop(); err != nil {
		t.Errorf("Stop: %v", err)
	}
	if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("Stop left %s: %v", dir, err)
	}
	if n := processesIn(dir); n != 0 {
		t.Errorf("%d processes naming %s run after Stop", n, dir)
	}
	if _, err := c.Get(cp.URL + "/readyz"); err == nil {
		t.Errorf("the API server still answers after Stop")
	}
}

// processesIn counts the processes whose arguments name dir.
func processesIn(dir string) int {
	cmdlines, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	n := 0
	for _, f := range cmdlines {
		if b, err := os.ReadFile(f); err == nil && bytes.Contains(b, []byte(dir+"/")) {
			n++
		}
	}
	return n
}
