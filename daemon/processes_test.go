package daemon

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/corral-sandbox/corral/api"
	"github.com/corral-sandbox/corral/internal/testenv"
	"github.com/corral-sandbox/corral/sandbox"
	"github.com/corral-sandbox/corral/sandbox/sandboxtest"
	"github.com/corral-sandbox/corral/store"
)

func processesPath(id int64) string { return fmt.Sprintf("/v1/projects/%d/processes", id) }

// startProc starts a background process and returns it.
func startProc(t *testing.T, e *env, tok string, id int64, body map[string]any) api.Process {
	t.Helper()
	status, b := e.do(context.Background(), "POST", processesPath(id), tok, body)
	if status != http.StatusCreated {
		t.Fatalf("start %v: %d %s", body, status, b)
	}
	var p api.Process
	if err := json.Unmarshal(b, &p); err != nil {
		t.Fatal(err)
	}
	// A command that ends at once may have ended by the answer.
	if (p.State != api.ProcessRunning && p.State != api.ProcessExited) || !strings.HasPrefix(p.ID, "proc_") || p.LeaseID == "" {
		t.Fatalf("started: %s", b)
	}
	return p
}

// getProc returns a process's state (the status when not 200).
func getProc(t *testing.T, e *env, tok string, id int64, pid string) (int, api.Process) {
	t.Helper()
	status, b := e.do(context.Background(), "GET", processesPath(id)+"/"+pid, tok, nil)
	var p api.Process
	if status == 200 {
		if err := json.Unmarshal(b, &p); err != nil {
			t.Fatal(err)
		}
	}
	return status, p
}

// awaitEnd polls a process until it is no longer running.
func awaitEnd(t *testing.T, e *env, tok string, id int64, pid string) api.Process {
	t.Helper()
	var p api.Process
	deadline := time.Now().Add(20 * time.Second)
	for {
		status, q := getProc(t, e, tok, id, pid)
		if status != 200 {
			t.Fatalf("get %s: %d", pid, status)
		}
		if p = q; p.State != api.ProcessRunning {
			return p
		}
		if time.Now().After(deadline) {
			t.Fatalf("process %s still runs", pid)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// outputLines reads GET …/output?QUERY as NDJSON lines.
func outputLines(t *testing.T, e *env, tok string, id int64, pid, query string) (http.Header, []map[string]any) {
	t.Helper()
	req, _ := http.NewRequest("GET", "http://corral"+processesPath(id)+"/"+pid+"/output?"+query, nil)
	req.Header.Set("Authorization", "Bearer "+tok)
	resp, err := e.http.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != api.MediaNDJSON {
		t.Fatalf("output: %d %s", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	var lines []map[string]any
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var m map[string]any
		if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
			t.Fatalf("line %q: %v", sc.Text(), err)
		}
		lines = append(lines, m)
	}
	return resp.Header, lines
}

// joined concatenates the data of one stream's chunk lines.
func joined(lines []map[string]any, stream string) string {
	var b strings.Builder
	for _, l := range lines {
		if l["stream"] == stream {
			b.WriteString(l["data"].(string))
		}
	}
	return b.String()
}

// marker returns a unique argument for sleep, to find a tree in /proc.
func marker() string {
	var b [3]byte
	_, _ = rand.Read(b[:])
	return fmt.Sprintf("3%d.%s", 10+int(b[0])%80, strconv.Itoa(100000+int(b[1])<<8|int(b[2])))
}

// treePids returns the pids whose command line holds mark, and their
// descendants, as seen in the host's /proc.
func treePids(t *testing.T, mark string) map[int]bool {
	t.Helper()
	ents, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	parent := map[int]int{}
	pids := map[int]bool{}
	for _, d := range ents {
		pid, err := strconv.Atoi(d.Name())
		if err != nil {
			continue
		}
		if cl, err := os.ReadFile(filepath.Join("/proc", d.Name(), "cmdline")); err == nil && bytes.Contains(cl, []byte(mark)) {
			pids[pid] = true
		}
		if st, err := os.ReadFile(filepath.Join("/proc", d.Name(), "status")); err == nil {
			for _, line := range strings.Split(string(st), "\n") {
				if v, ok := strings.CutPrefix(line, "PPid:"); ok {
					parent[pid], _ = strconv.Atoi(strings.TrimSpace(v))
				}
			}
		}
	}
	for changed := true; changed; {
		changed = false
		for pid, pp := range parent {
			if pids[pp] && !pids[pid] {
				pids[pid], changed = true, true
			}
		}
	}
	return pids
}

// alive reports which of pids still exist (and are not zombies).
func alive(pids map[int]bool) []int {
	var out []int
	for pid := range pids {
		st, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			continue
		}
		if i := bytes.LastIndexByte(st, ')'); i > 0 && len(st) > i+2 && st[i+2] == 'Z' {
			continue
		}
		out = append(out, pid)
	}
	return out
}

// TestProcessAuthBeforeProvider: every process route refuses anonymous
// callers (401) and non-members (403) before any provider call; a member
// of one project cannot see or signal another's process by id (404).
func TestProcessAuthBeforeProvider(t *testing.T) {
	fake := &sandboxtest.Provider{Dir: t.TempDir()}
	e := newEnv(t, envOpts{fake: fake})
	alice, atok := e.account("alice")
	bob, btok := e.account("bob")
	pa := e.hostProject("a", alice)
	pb := e.hostProject("b", bob)
	pid := "proc_0123456789abcdef0123456789abcdef"
	routes := []struct{ method, path string }{
		{"POST", processesPath(pa.ID)},
		{"GET", processesPath(pa.ID)},
		{"GET", processesPath(pa.ID) + "/" + pid},
		{"GET", processesPath(pa.ID) + "/" + pid + "/output"},
		{"POST", processesPath(pa.ID) + "/" + pid + "/signal"},
		{"DELETE", processesPath(pa.ID) + "/" + pid},
	}
	body := map[string]any{"argv": []string{"sleep", "30"}, "signal": "TERM"}
	for _, rt := range routes {
		status, b := e.do(context.Background(), rt.method, rt.path, "", body)
		if kind, _, _, _ := apiError(t, b); status != 401 || kind != KindUnauthorized {
			t.Errorf("anonymous %s %s: %d %s", rt.method, rt.path, status, b)
		}
		status, b = e.do(context.Background(), rt.method, rt.path, btok, body)
		if kind, _, _, _ := apiError(t, b); status != 403 || kind != KindForbidden {
			t.Errorf("non-member %s %s: %d %s", rt.method, rt.path, status, b)
		}
	}
	if n := fake.Calls(); n != 0 {
		t.Fatalf("the provider was contacted %d times for refused requests", n)
	}
	// Bob's own process: alice cannot reach it through her project.
	bp := startProc(t, e, btok, pb.ID, map[string]any{"argv": []string{"sleep", "30"}})
	for _, rt := range []struct{ method, path string }{
		{"GET", processesPath(pa.ID) + "/" + bp.ID},
		{"GET", processesPath(pa.ID) + "/" + bp.ID + "/output?follow=0"},
		{"POST", processesPath(pa.ID) + "/" + bp.ID + "/signal"},
		{"DELETE", processesPath(pa.ID) + "/" + bp.ID},
	} {
		status, b := e.do(context.Background(), rt.method, rt.path, atok, map[string]string{"signal": "KILL"})
		if kind, _, _, _ := apiError(t, b); status != 404 || kind != KindNotFound {
			t.Errorf("alice %s %s: %d %s", rt.method, rt.path, status, b)
		}
	}
	if status, b := e.do(context.Background(), "GET", processesPath(pa.ID), atok, nil); status != 200 || strings.Contains(string(b), bp.ID) {
		t.Errorf("alice's list: %d %s", status, b)
	}
	if status, p := getProc(t, e, btok, pb.ID, bp.ID); status != 200 || p.State != api.ProcessRunning {
		t.Errorf("bob's process after alice's attempts: %d %+v", status, p)
	}
}

// TestProcessHost drives a real (confined) host project's background
// processes: output replayed from 0 and followed to the end, TERM to a
// whole tree, DELETE killing a tree, the ring's overflow, the outcome
// kept and then forgotten.
func TestProcessHost(t *testing.T) {
	requireRoot(t)
	e := newEnv(t, envOpts{app: AppOptions{ProcessRetention: 2 * time.Second}})
	alice, tok := e.account("alice")
	p := e.hostProject("web", alice)
	testProcesses(t, e, tok, p.ID)
}

// TestProcessManaged is TestProcessHost in a managed machine.
func TestProcessManaged(t *testing.T) {
	e := newManagedEnvWith(t, AppOptions{ProcessRetention: 2 * time.Second})
	alice, tok := e.account("alice")
	p := e.managedProject("box", alice)
	testProcesses(t, e, tok, p.ID)
}

func testProcesses(t *testing.T, e *env, tok string, id int64) {
	// Output from offset 0, followed until the end.
	pr := startProc(t, e, tok, id, map[string]any{"argv": []string{"sh", "-c", "echo a; echo oops >&2; sleep 0.5; echo b"}})
	_, lines := outputLines(t, e, tok, id, pr.ID, "from=0")
	last := lines[len(lines)-1]
	if joined(lines, "stdout") != "a\nb\n" || joined(lines, "stderr") != "oops\n" || last["state"] != api.ProcessExited ||
		last["offset"] != float64(9) || last["exit"].(map[string]any)["code"] != float64(0) {
		t.Fatalf("followed output: %v", lines)
	}
	// Replayed from an offset, as base64.
	_, lines = outputLines(t, e, tok, id, pr.ID, "from=7&follow=0&encoding=base64")
	if len(lines) != 2 || lines[0]["offset"] != float64(7) || lines[0]["data"] != "Ygo=" {
		t.Fatalf("from 7: %v", lines)
	}
	ended := awaitEnd(t, e, tok, id, pr.ID)
	if ended.Exit == nil || ended.Exit.Code == nil || *ended.Exit.Code != 0 || ended.Ended == nil || ended.Output.StdoutBytes != 4 || ended.Output.StderrBytes != 5 {
		t.Fatalf("ended: %+v", ended)
	}

	// TERM reaches the whole tree, not only the shell.
	mark := marker()
	tree := startProc(t, e, tok, id, map[string]any{"argv": []string{"sh", "-c", "sleep " + mark + " & sleep " + mark + "; echo never"}})
	var pids map[int]bool
	testenv.WaitFor(t, 5*time.Second, "the tree in /proc", func() bool { pids = treePids(t, mark); return len(alive(pids)) >= 3 })
	status, b := e.do(context.Background(), "POST", processesPath(id)+"/"+tree.ID+"/signal", tok, map[string]string{"signal": "TERM"})
	if status != 200 {
		t.Fatalf("signal: %d %s", status, b)
	}
	ended = awaitEnd(t, e, tok, id, tree.ID)
	if ended.State != api.ProcessExited || ended.Exit == nil || ended.Exit.Signal == nil || *ended.Exit.Signal != "SIGTERM" {
		t.Fatalf("after TERM: %+v", ended)
	}
	testenv.WaitFor(t, 5*time.Second, "the tree to end", func() bool { return len(alive(pids)) == 0 })
	if status, b := e.do(context.Background(), "POST", processesPath(id)+"/"+tree.ID+"/signal", tok, map[string]string{"signal": "TERM"}); status != 409 {
		t.Errorf("signal an ended process: %d %s", status, b)
	}
	if status, b := e.do(context.Background(), "POST", processesPath(id)+"/"+tree.ID+"/signal", tok, map[string]string{"signal": "NOPE"}); status != 400 {
		t.Errorf("unknown signal: %d %s", status, b)
	}

	// DELETE kills a tree and forgets it.
	mark = marker()
	tree = startProc(t, e, tok, id, map[string]any{"argv": []string{"sh", "-c", "trap '' TERM; sleep " + mark + " & sleep " + mark}})
	testenv.WaitFor(t, 5*time.Second, "the tree in /proc", func() bool { pids = treePids(t, mark); return len(alive(pids)) >= 3 })
	status, b = e.do(context.Background(), "DELETE", processesPath(id)+"/"+tree.ID, tok, nil)
	var killed api.Process
	if err := json.Unmarshal(b, &killed); status != 200 || err != nil || killed.State != api.ProcessKilled || killed.Error == nil || killed.Error.Kind != string(sandbox.KindAbort) {
		t.Fatalf("delete: %d %s", status, b)
	}
	testenv.WaitFor(t, 5*time.Second, "the tree to end", func() bool { return len(alive(pids)) == 0 })
	if status, _ := getProc(t, e, tok, id, tree.ID); status != 404 {
		t.Errorf("deleted process: %d", status)
	}

	// KILL kills the tree like DELETE, but keeps the process.
	mark = marker()
	tree = startProc(t, e, tok, id, map[string]any{"argv": []string{"sh", "-c", "sleep " + mark + " & sleep " + mark}})
	testenv.WaitFor(t, 5*time.Second, "the tree in /proc", func() bool { pids = treePids(t, mark); return len(alive(pids)) >= 3 })
	if status, b := e.do(context.Background(), "POST", processesPath(id)+"/"+tree.ID+"/signal", tok, map[string]string{"signal": "kill"}); status != 200 {
		t.Fatalf("signal KILL: %d %s", status, b)
	}
	if ended = awaitEnd(t, e, tok, id, tree.ID); ended.State != api.ProcessKilled {
		t.Fatalf("after KILL: %+v", ended)
	}
	testenv.WaitFor(t, 5*time.Second, "the tree to end", func() bool { return len(alive(pids)) == 0 })

	// The ring keeps the newest bytes and says where they start.
	over := startProc(t, e, tok, id, map[string]any{"argv": []string{"sh", "-c", "head -c 5000 /dev/zero | tr '\\0' x; printf END"}, "outputBuffer": 1024})
	awaitEnd(t, e, tok, id, over.ID)
	h, lines := outputLines(t, e, tok, id, over.ID, "from=0&follow=0")
	out := joined(lines, "stdout")
	if h.Get("Corral-Output-Start") != "3979" || lines[0]["offset"] != float64(3979) || len(out) != 1024 || !strings.HasSuffix(out, "xEND") {
		t.Fatalf("overflowed output: start %s, %v", h.Get("Corral-Output-Start"), lines[0])
	}
	_, info := getProc(t, e, tok, id, over.ID)
	if info.Output.Start != 3979 || info.Output.End != 5003 || info.Output.StdoutBytes != 5003 || info.Output.BufferBytes != 1024 {
		t.Errorf("output: %+v", info.Output)
	}

	// The list shows them; ended ones are forgotten after the retention.
	status, b = e.do(context.Background(), "GET", processesPath(id), tok, nil)
	var list struct{ Processes []api.Process }
	if err := json.Unmarshal(b, &list); status != 200 || err != nil || len(list.Processes) == 0 || list.Processes[len(list.Processes)-1].ID != over.ID {
		t.Fatalf("list: %d %s", status, b)
	}
	testenv.WaitFor(t, 5*time.Second, "ended processes to be forgotten", func() bool {
		s, _ := getProc(t, e, tok, id, over.ID)
		return s == 404
	})

	// The lifetime bound ends a process, reported as a timeout.
	mark = marker()
	lt := startProc(t, e, tok, id, map[string]any{"argv": []string{"sleep", mark}, "lifetime": 1})
	testenv.WaitFor(t, 5*time.Second, "the process in /proc", func() bool { pids = treePids(t, mark); return len(alive(pids)) >= 1 })
	ended = awaitEnd(t, e, tok, id, lt.ID)
	if ended.State != api.ProcessTimedOut || ended.Error == nil || ended.Error.Kind != string(sandbox.KindTimeout) {
		t.Fatalf("lifetime: %+v", ended)
	}
	testenv.WaitFor(t, 5*time.Second, "the process to end", func() bool { return len(alive(pids)) == 0 })
	if n := e.liveLeases(); n != 0 {
		t.Errorf("%d leases live after every process ended", n)
	}
}

// TestProcessFollowWebSocket: the output over a WebSocket, and a client
// going away changes nothing for the process.
func TestProcessFollowWebSocket(t *testing.T) {
	requireRoot(t)
	e := newEnv(t, envOpts{})
	alice, tok := e.account("alice")
	p := e.hostProject("web", alice)
	pr := startProc(t, e, tok, p.ID, map[string]any{"argv": []string{"sh", "-c", "echo one; sleep 1; echo two"}, "lifetime": 30})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	dial := func() *websocket.Conn {
		c, _, err := websocket.Dial(ctx, "ws://corral"+processesPath(p.ID)+"/"+pr.ID+"/output", &websocket.DialOptions{
			HTTPClient: e.http, HTTPHeader: http.Header{"Authorization": {"Bearer " + tok}},
		})
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	c := dial()
	_, msg, err := c.Read(ctx)
	if err != nil || !strings.Contains(string(msg), `"data":"one\n"`) {
		t.Fatalf("first message: %s %v", msg, err)
	}
	c.CloseNow() // the client goes away
	c = dial()
	defer c.CloseNow()
	var all []string
	for {
		_, msg, err := c.Read(ctx)
		if err != nil {
			if websocket.CloseStatus(err) != websocket.StatusNormalClosure {
				t.Fatalf("read: %v", err)
			}
			break
		}
		all = append(all, string(msg))
	}
	if len(all) < 2 || !strings.Contains(strings.Join(all, ""), `"two\n"`) || !strings.Contains(all[len(all)-1], `"state":"exited"`) {
		t.Fatalf("messages: %q", all)
	}
}

// TestProcessAdmission: a project and an account may run only so many
// background processes (429 "busy"); an ended one frees its place.
func TestProcessAdmission(t *testing.T) {
	requireRoot(t)
	e := newEnv(t, envOpts{app: AppOptions{MaxProcessesPerProject: 2, MaxProcessesPerAccount: 3}})
	alice, tok := e.account("alice")
	p1 := e.hostProject("one", alice)
	p2 := e.hostProject("two", alice)
	sleep := map[string]any{"argv": []string{"sleep", "30"}}
	a := startProc(t, e, tok, p1.ID, sleep)
	startProc(t, e, tok, p1.ID, sleep)
	status, b := e.do(context.Background(), "POST", processesPath(p1.ID), tok, sleep)
	if kind, _, _, _ := apiError(t, b); status != 429 || kind != KindBusy {
		t.Fatalf("third in a project: %d %s", status, b)
	}
	startProc(t, e, tok, p2.ID, sleep)
	status, b = e.do(context.Background(), "POST", processesPath(p2.ID), tok, sleep)
	if kind, _, _, _ := apiError(t, b); status != 429 || kind != KindBusy {
		t.Fatalf("fourth of an account: %d %s", status, b)
	}
	if status, _ := e.do(context.Background(), "DELETE", processesPath(p1.ID)+"/"+a.ID, tok, nil); status != 200 {
		t.Fatalf("delete: %d", status)
	}
	startProc(t, e, tok, p2.ID, sleep)
}

// TestProcessDaemonStopInterrupts: a daemon that stops ends its
// processes, and the journal says "interrupted".
func TestProcessDaemonStopInterrupts(t *testing.T) {
	requireRoot(t)
	e := newEnv(t, envOpts{})
	alice, tok := e.account("alice")
	p := e.hostProject("web", alice)
	mark := marker()
	pr := startProc(t, e, tok, p.ID, map[string]any{"argv": []string{"sleep", mark}})
	var pids map[int]bool
	testenv.WaitFor(t, 5*time.Second, "the process in /proc", func() bool { pids = treePids(t, mark); return len(alive(pids)) >= 1 })
	// Its live lease keeps its project.
	if status, b := e.do(context.Background(), "DELETE", fmt.Sprintf("/v1/projects/%d", p.ID), tok, nil); status != 409 {
		t.Errorf("delete the project of a running process: %d %s", status, b)
	}
	if err := e.app.Close(); err != nil {
		t.Fatal(err)
	}
	// Killed (SIGKILL is delivered asynchronously: await the exits).
	testenv.WaitFor(t, 5*time.Second, "the process tree to end", func() bool { return len(alive(pids)) == 0 })
	entries, err := e.st.ListJournal(context.Background(), store.JournalFilter{Lease: pr.LeaseID})
	if err != nil || len(entries) != 1 {
		t.Fatalf("journal: %v %v", entries, err)
	}
	if j := entries[0]; j.LeaseKind != "process" || j.End.Outcome != store.OutcomeInterrupted || j.Argv[1] != mark {
		t.Fatalf("journal entry: %+v", j)
	}
}

// TestProcessServesSite: a background python3 -m http.server in a managed
// machine serves a Site with no client attached; its log replays from
// offset 0; DELETE removes its whole tree.
func TestProcessServesSite(t *testing.T) {
	e := newManagedEnv(t)
	alice, tok := e.account("alice")
	p := e.managedProject("box", alice)
	if err := os.WriteFile(filepath.Join(p.Root, "index.html"), []byte("<h1>background</h1>\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	mark := marker()
	srv := startProc(t, e, tok, p.ID, map[string]any{"argv": []string{"sh", "-c", "python3 -m http.server 8000 --bind 127.0.0.1; : " + mark}})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if status, body := e.do(ctx, "PUT", fmt.Sprintf("/v1/projects/%d/sites/app", p.ID), tok, map[string]int{"port": 8000}); status != 200 {
		t.Fatalf("publish: %d %s", status, body)
	}
	var status int
	var body []byte
	for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		status, body = e.do(ctx, "GET", "/sites/app/index.html", tok, nil)
		if status != http.StatusBadGateway || time.Now().After(deadline) {
			break
		}
	}
	if status != 200 || string(body) != "<h1>background</h1>\n" {
		t.Fatalf("site: %d %s", status, body)
	}
	var lines []map[string]any
	testenv.WaitFor(t, 5*time.Second, "the request in the server's log", func() bool {
		_, lines = outputLines(t, e, tok, p.ID, srv.ID, "from=0&follow=0")
		return strings.Contains(joined(lines, "stderr"), `"GET /index.html HTTP/1.1" 200`)
	})
	if lines[0]["offset"] != float64(0) {
		t.Errorf("replay from 0 starts at %v", lines[0]["offset"])
	}
	pids := treePids(t, mark)
	if len(alive(pids)) < 2 { // sh and python3
		t.Fatalf("tree: %v", pids)
	}
	if status, b := e.do(ctx, "DELETE", processesPath(p.ID)+"/"+srv.ID, tok, nil); status != 200 {
		t.Fatalf("delete: %d %s", status, b)
	}
	testenv.WaitFor(t, 5*time.Second, "the server's tree to end", func() bool { return len(alive(pids)) == 0 })
	status, _ = e.do(ctx, "GET", "/sites/app/index.html", tok, nil)
	if status != http.StatusBadGateway {
		t.Errorf("site after delete: %d", status)
	}
}

// TestProcessStartFailure: a program that cannot be started is a 422
// "start" and leaves no process, no lease and no place taken.
func TestProcessStartFailure(t *testing.T) {
	requireRoot(t)
	e := newEnv(t, envOpts{app: AppOptions{MaxProcessesPerProject: 1}})
	alice, tok := e.account("alice")
	p := e.hostProject("web", alice)
	for range 2 {
		status, b := e.do(context.Background(), "POST", processesPath(p.ID), tok, map[string]any{"argv": []string{"/no/such/program"}})
		if kind, _, _, _ := apiError(t, b); status != 422 || kind != string(sandbox.KindStart) {
			t.Fatalf("missing program: %d %s", status, b)
		}
	}
	if n := e.liveLeases(); n != 0 {
		t.Errorf("%d leases live", n)
	}
	status, b := e.do(context.Background(), "GET", processesPath(p.ID), tok, nil)
	if status != 200 || string(b) != `{"processes":[]}`+"\n" && string(b) != `{"processes":[]}` {
		t.Errorf("list: %d %s", status, b)
	}
	startProc(t, e, tok, p.ID, map[string]any{"argv": []string{"true"}})
}

// TestProcessLeaseLost: a process whose lease can no longer be kept alive
// is killed and reported interrupted (kind transport): nothing outlives
// its lease.
func TestProcessLeaseLost(t *testing.T) {
	fake := &sandboxtest.Provider{Dir: t.TempDir()}
	e := newEnv(t, envOpts{fake: fake}) // heartbeats every 100 ms
	alice, tok := e.account("alice")
	p := e.hostProject("web", alice)
	pr := startProc(t, e, tok, p.ID, map[string]any{"argv": []string{"sleep", "30"}})
	boom := errors.New("lease expired")
	fake.LastLease().HeartbeatErr.Store(&boom)
	ended := awaitEnd(t, e, tok, p.ID, pr.ID)
	if ended.State != api.ProcessInterrupted || ended.Error == nil || ended.Error.Kind != string(sandbox.KindTransport) || !strings.Contains(ended.Error.Message, "lease expired") {
		t.Fatalf("after the lease was lost: %+v", ended)
	}
}
