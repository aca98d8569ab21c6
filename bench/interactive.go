package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/coder/websocket"

	"github.com/corral-sandbox/corral/client"
	"github.com/corral-sandbox/corral/daemon"
	"github.com/corral-sandbox/corral/sandbox"
	"github.com/corral-sandbox/corral/store"
)

// Interactive latencies, through the daemon's API (the bench's daemon, as
// alice: confined in the host project):
//
//   - first NDJSON chunk: POST …/commands with Accept: application/x-ndjson
//     of `sh -c 'echo a; sleep 0.01'`, from the request until the first
//     {"stdout":…} chunk arrives (the rest of the answer is then read and
//     not timed);
//   - PTY echo round trip: one terminal session (?tty=1) of `cat`; one
//     byte written, until the terminal's echo of it comes back (the line
//     discipline echoes it as it reaches the terminal, before cat reads).
//
// Each is measured in the managed project (warm machine) and the host
// project. It is an extra phase (see extra.go): -only interactive.

func init() {
	registerPhase(extraPhase{
		name:  "interactive",
		title: "Interactive latency (daemon API)",
		intro: "First NDJSON chunk: `POST …/commands` with `Accept: application/x-ndjson` of `sh -c 'echo a; sleep 0.01'`, from the request until the first `{\"stdout\":…}` chunk arrives. PTY echo: one `?tty=1` WebSocket session of `cat`; one byte written until its terminal echo returns. Host rows are confined (alice is not trusted).",
		run: func(ctx context.Context, env *phaseEnv) []latRow {
			return measureInteractive(ctx, env.cr, env.dmn, env.cfg.n, env.workerSkip)
		},
	})
}

const (
	subjNDJSONManaged = "first NDJSON chunk, POST …/commands, managed (daemon API)"
	subjNDJSONHost    = "first NDJSON chunk, POST …/commands, host, confined (daemon API)"
	subjPTYManaged    = "PTY echo round trip, WebSocket ?tty=1 session, managed"
	subjPTYHost       = "PTY echo round trip, WebSocket ?tty=1 session, host, confined"
)

const (
	// maxNDJSONSamples bounds the NDJSON samples (each runs a command of
	// about 10 ms).
	maxNDJSONSamples = 200
	// maxEchoSamples keeps the echoed bytes within one canonical-mode
	// line (4095 bytes; cat never sees a newline).
	maxEchoSamples = 4000
)

// measureInteractive measures the interactive rows, n samples each after
// a few warm-up ones; managedSkip, if non-empty, is why the managed rows
// cannot run.
func measureInteractive(ctx context.Context, cr *corral, d *daemonProc, n int, managedSkip string) []latRow {
	projects := []struct {
		ndjson, pty string
		p           store.Project
		skip        string
	}{
		{subjNDJSONManaged, subjPTYManaged, cr.managed, managedSkip},
		{subjNDJSONHost, subjPTYHost, cr.host, ""},
	}
	var rows []latRow
	for _, pr := range projects {
		nd := latRow{name: pr.ndjson, skip: pr.skip}
		pt := latRow{name: pr.pty, skip: pr.skip}
		if pr.skip == "" {
			id := pr.p.ID
			sampleRows(&nd, min(n, maxNDJSONSamples), func() (time.Duration, error) { return firstChunk(ctx, d.cl, id) })
			echo, err := openEcho(ctx, d.cl, id)
			if err != nil {
				pt.skip = fmt.Sprintf("terminal session: %v", err)
			} else {
				sampleRows(&pt, min(n, maxEchoSamples), echo.roundTrip)
				echo.close()
			}
		}
		rows = append(rows, nd, pt)
	}
	return rows
}

// sampleRows fills row with n samples of f after three warm-up calls.
func sampleRows(row *latRow, n int, f func() (time.Duration, error)) {
	var samples []time.Duration
	for i := -3; i < n; i++ {
		d, err := f()
		if err != nil {
			row.failures++
			if row.firstErr == nil {
				row.firstErr = err
			}
			if i < 0 {
				row.skip = fmt.Sprintf("warm-up failed: %v", err)
				return
			}
			continue
		}
		if i >= 0 {
			samples = append(samples, d)
		}
	}
	row.st = summarize(samples)
}

// firstChunk times one streamed command until its first output chunk.
func firstChunk(ctx context.Context, cl *client.Client, project int64) (time.Duration, error) {
	var first time.Duration
	t0 := time.Now()
	res, err := cl.StreamCommand(ctx, project, client.CommandRequest{
		Command: sandbox.Command{Type: sandbox.CommandTypeArgv, File: "sh", Args: []string{"-c", "echo a; sleep 0.01"}},
	}, func([]byte) {
		if first == 0 {
			first = time.Since(t0)
		}
	}, nil)
	switch {
	case err != nil:
		return 0, err
	case res.Code == nil || *res.Code != 0:
		return 0, fmt.Errorf("code %v signal %q", res.Code, res.Signal)
	case first == 0:
		return 0, errors.New("no stdout chunk")
	}
	return first, nil
}

// echoSession is a terminal session of cat.
type echoSession struct {
	ctx  context.Context
	conn *websocket.Conn
	n    int
}

func openEcho(ctx context.Context, cl *client.Client, project int64) (*echoSession, error) {
	q := url.Values{"argv": {"cat"}, "tty": {"1"}}
	u := cl.URL("/v1/projects/"+strconv.FormatInt(project, 10)+"/sessions") + "?" + q.Encode()
	u = "ws" + strings.TrimPrefix(u, "http")
	conn, _, err := websocket.Dial(ctx, u, &websocket.DialOptions{HTTPClient: cl.HTTPClient(), HTTPHeader: cl.Header()})
	if err != nil {
		return nil, err
	}
	conn.SetReadLimit(1 << 20)
	// Wait for "started": the terminal exists.
	for {
		typ, data, err := conn.Read(ctx)
		if err != nil {
			conn.CloseNow()
			return nil, err
		}
		if typ == websocket.MessageText && bytes.Contains(data, []byte(`"started"`)) {
			return &echoSession{ctx: ctx, conn: conn}, nil
		}
	}
}

// roundTrip writes one byte and waits for its echo.
func (e *echoSession) roundTrip() (time.Duration, error) {
	e.n++
	b := byte('a' + e.n%26)
	t0 := time.Now()
	if err := e.conn.Write(e.ctx, websocket.MessageBinary, []byte{daemon.StreamStdin, b}); err != nil {
		return 0, err
	}
	for {
		typ, data, err := e.conn.Read(e.ctx)
		if err != nil {
			return 0, err
		}
		if typ == websocket.MessageBinary && len(data) > 1 && data[0] == daemon.StreamStdout && bytes.IndexByte(data[1:], b) >= 0 {
			return time.Since(t0), nil
		}
	}
}

func (e *echoSession) close() { _ = e.conn.Close(websocket.StatusNormalClosure, "done") }
