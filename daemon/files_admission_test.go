package daemon

import (
	"context"
	"io"
	"net/http"
	"sync"
	"testing"
	"time"
)

// TestFileCallsBounded is an attack: files API calls had no bound at
// all: one account opening thousands of PUTs whose bodies never end held
// a lease, a goroutine, a descriptor and a 1 MiB copy buffer each in the
// daemon. An account that is not an admin has at most
// MaxAccountFileCalls in flight; beyond, 429; a finished call gives its
// place back.
func TestFileCallsBounded(t *testing.T) {
	requireRoot(t)
	e := newEnv(t, envOpts{})
	mallory, tok := e.account("mallory")
	p := e.hostProject("web", mallory)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer func() { cancel(); wg.Wait() }()
	var writers []*io.PipeWriter
	defer func() {
		for _, w := range writers {
			w.Close()
		}
	}()
	// Slow uploads: each sends 64 KiB, then nothing.
	for i := range MaxAccountFileCalls {
		r, w := io.Pipe()
		writers = append(writers, w)
		wg.Add(1)
		go func() {
			defer wg.Done()
			req, _ := http.NewRequestWithContext(ctx, "PUT", "http://corral"+filesPath(p.ID, "", qp("path", "/workspace/f"+string(rune('a'+i%26))+string(rune('a'+i/26)))), r)
			req.Header.Set("Authorization", "Bearer "+tok)
			if resp, err := e.http.Do(req); err == nil {
				resp.Body.Close()
			}
		}()
		// More than the transport buffers: the request reaches the daemon.
		if _, err := w.Write(make([]byte, 64<<10)); err != nil {
			t.Fatal(err)
		}
	}
	// Once every upload is in flight, the next call is refused.
	inFlight := func() int { return e.app.fileCalls.of(mallory.ID) }
	for deadline := time.Now().Add(10 * time.Second); inFlight() < MaxAccountFileCalls; {
		if time.Now().After(deadline) {
			t.Fatalf("%d uploads in flight, want %d", inFlight(), MaxAccountFileCalls)
		}
		time.Sleep(5 * time.Millisecond)
	}
	if status, _, b := e.rawDo(context.Background(), "GET", filesPath(p.ID, "stat", qp("path", "/workspace")), tok, nil); status != http.StatusTooManyRequests {
		t.Fatalf("call %d beyond the uploads in flight: %d %s, want 429", MaxAccountFileCalls+1, status, b)
	}
	// Finished uploads give their places back.
	for _, w := range writers {
		w.Close()
	}
	writers = nil
	deadline := time.Now().Add(10 * time.Second)
	for {
		status, _, b := e.rawDo(context.Background(), "GET", filesPath(p.ID, "stat", qp("path", "/workspace")), tok, nil)
		if status == http.StatusOK {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("stat after the uploads ended: %d %s", status, b)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
