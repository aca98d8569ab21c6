package main

import (
	"bufio"
	"bytes"
	"context"
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
	"testing"
	"time"
)

// startDaemonProcess runs `corral daemon --state state args…` as a process
// of its own (this test binary as corral) until the test ends, and returns
// its pid and socket.
func startDaemonProcess(t *testing.T, state string, args ...string) (*os.Process, string) {
	t.Helper()
	cmd := exec.Command(os.Args[0], append([]string{"daemon", "--state", state}, args...)...)
	cmd.Env = append(os.Environ(), "CORRAL_TEST_AS_MAIN=1", "GOMEMLIMIT=")
	var logs bytes.Buffer
	cmd.Stderr = &logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Signal(os.Interrupt)
		_ = cmd.Wait()
		if t.Failed() {
			t.Logf("daemon log:\n%s", tail(logs.String(), 4000))
		}
	})
	sock := filepath.Join(state, "corral.sock")
	deadline := time.Now().Add(20 * time.Second)
	for {
		if c, err := net.Dial("unix", sock); err == nil {
			c.Close()
			return cmd.Process, sock
		}
		if time.Now().After(deadline) {
			t.Fatalf("daemon did not listen:\n%s", logs.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func tail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}

func unixClient(sock string) *http.Client {
	return &http.Client{Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", sock)
		},
	}}
}

// peakRSS returns a process's peak resident set (VmHWM), in bytes.
func peakRSS(t *testing.T, pid int) int64 { return procStatus(t, pid, "VmHWM:") }

// rss returns a process's resident set (VmRSS), in bytes.
func rss(t *testing.T, pid int) int64 { return procStatus(t, pid, "VmRSS:") }

func procStatus(t *testing.T, pid int, field string) int64 {
	t.Helper()
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), field); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			return kb << 10
		}
	}
	t.Fatalf("no %s in /proc/%d/status", field, pid)
	return 0
}

// TestFloodsStayInBudget: 32 concurrent commands asking for 64 MiB per
// stream, each writing 70 MiB, through a real daemon with a 512 MiB
// captured-bytes budget: the ones beyond the budget are refused with 429
// and Retry-After, the others overflow (413), and the daemon's peak RSS
// stays under the budget plus a margin. (Without admission control and
// streamed responses, eight such floods took a daemon to 5.7 GiB.)
func TestFloodsStayInBudget(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: host commands are confined by corral's Landlock helper")
	}
	if raceEnabled {
		t.Skip("measures memory: the race detector's shadow memory multiplies the daemon's RSS")
	}
	state, err := os.MkdirTemp("", "cf")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(state)
	mustCLI(t, "account", "create", "alice", "--state", state)
	tok := mustCLI(t, "token", "create", "alice", "--state", state)
	id := mustCLI(t, "project", "create", "web", "--host", t.TempDir(), "--owner", "alice", "--state", state)

	const budget = 512 << 20
	proc, sock := startDaemonProcess(t, state, "--max-captured", "512MiB", "--account-max-captured", "512MiB")
	client := unixClient(sock)
	base := peakRSS(t, proc.Pid)

	body := `{"command":{"type":"argv","file":"head","args":["-c","70M","/dev/zero"]},"timeoutMs":120000,"outputLimit":{"stdout":67108864,"stderr":67108864}}`
	const floods = 32
	var mu sync.Mutex
	statuses := map[int]int{}
	var wg sync.WaitGroup
	for range floods {
		wg.Add(1)
		go func() {
			defer wg.Done()
			req, _ := http.NewRequest("POST", "http://corral/v1/projects/"+id+"/commands", strings.NewReader(body))
			req.Header.Set("Authorization", "Bearer "+tok)
			req.Header.Set("Content-Type", "application/json")
			resp, err := client.Do(req)
			if err != nil {
				t.Error(err)
				return
			}
			defer resp.Body.Close()
			var head [256]byte
			n, _ := io.ReadFull(resp.Body, head[:])
			rest, _ := io.Copy(io.Discard, resp.Body)
			switch resp.StatusCode {
			case http.StatusTooManyRequests:
				if resp.Header.Get("Retry-After") == "" || !strings.Contains(string(head[:n]), "budget of 536870912 captured bytes is exhausted") {
					t.Errorf("429 without Retry-After or reason: %q %s", resp.Header, head[:n])
				}
			case http.StatusRequestEntityTooLarge:
				// The pinned body with 64 MiB of NULs as \u0000.
				if !strings.HasPrefix(string(head[:n]), `{"error":{"kind":"overflow"`) || int64(n)+rest < 6*64<<20 {
					t.Errorf("overflow body: %d bytes, starts %q", int64(n)+rest, head[:min(n, 80)])
				}
			default:
				t.Errorf("status %d: %s", resp.StatusCode, head[:n])
			}
			mu.Lock()
			statuses[resp.StatusCode]++
			mu.Unlock()
		}()
	}
	wg.Wait()
	peak := peakRSS(t, proc.Pid)
	t.Logf("statuses %v; daemon peak RSS %d MiB (at start %d MiB), budget %d MiB", statuses, peak>>20, base>>20, budget>>20)
	if statuses[http.StatusTooManyRequests] == 0 || statuses[http.StatusRequestEntityTooLarge] == 0 {
		t.Errorf("want both refusals (429) and overflows (413): %v", statuses)
	}
	if limit := int64(budget + 256<<20); peak > limit {
		t.Errorf("daemon peak RSS %d MiB over the budget plus margin (%d MiB)", peak>>20, limit>>20)
	}
	// The memory goes back to the system once the floods are over.
	deadline := time.Now().Add(30 * time.Second)
	for rss(t, proc.Pid) > base+128<<20 {
		if time.Now().After(deadline) {
			t.Fatalf("daemon RSS %d MiB 30 s after the floods (%d MiB at start)", rss(t, proc.Pid)>>20, base>>20)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
