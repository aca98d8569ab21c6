package client

import (
	"bufio"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"

	"github.com/corral-sandbox/corral/api"
)

// ProcessRequest is the body of a background process's start; see
// api.ProcessRequest for each field's zero value (Lifetime is in seconds:
// zero means the daemon's default, 1 h).
type ProcessRequest = api.ProcessRequest

// Process is a background process as the API shows it. State is
// "running", "exited", "killed", "timedOut", "interrupted" or "failed".
// Exit is set once its main process's end was observed; Error says why it
// was ended ("timeout", "abort") or why its end is unknown ("transport").
type Process = api.Process

// ProcessOutput is what a process wrote (per stream) and what the daemon
// retains of it: offsets [Start, End) of the combined output. Start > 0
// means older output fell off the ring of BufferBytes.
type ProcessOutput = api.ProcessOutput

// ProcessExit is how a process's main process ended: exactly one of Code
// and Signal.
type ProcessExit = api.ProcessExit

// ProcessError says why a process was ended or why its end is unknown.
type ProcessError = api.ProcessError

func processesPath(projectID int64) string {
	return fmt.Sprintf("/v1/projects/%d/processes", projectID)
}

func processPath(projectID int64, id string) string {
	return processesPath(projectID) + "/" + url.PathEscape(id)
}

// StartProcess starts a background process in the project; the daemon
// holds it until it exits, its lifetime ends or it is killed.
func (c *Client) StartProcess(ctx context.Context, projectID int64, req ProcessRequest) (*Process, error) {
	var p Process
	if err := c.Do(ctx, "POST", processesPath(projectID), req, &p); err != nil {
		return nil, err
	}
	return &p, nil
}

// Processes lists the project's background processes (running, and ended
// ones the daemon still keeps), oldest first.
func (c *Client) Processes(ctx context.Context, projectID int64) ([]Process, error) {
	var out struct {
		Processes []Process `json:"processes"`
	}
	if err := c.Do(ctx, "GET", processesPath(projectID), nil, &out); err != nil {
		return nil, err
	}
	return out.Processes, nil
}

// Process returns one background process, with its outcome once ended.
func (c *Client) Process(ctx context.Context, projectID int64, id string) (*Process, error) {
	var p Process
	if err := c.Do(ctx, "GET", processPath(projectID, id), nil, &p); err != nil {
		return nil, err
	}
	return &p, nil
}

// SignalProcess sends a signal ("TERM", "INT", "KILL", …) to the
// process's whole tree. It does not wait for the process to end.
func (c *Client) SignalProcess(ctx context.Context, projectID int64, id, signal string) (*Process, error) {
	var p Process
	if err := c.Do(ctx, "POST", processPath(projectID, id)+"/signal", map[string]string{"signal": signal}, &p); err != nil {
		return nil, err
	}
	return &p, nil
}

// KillProcess kills the process's whole tree, waits for it to end, and has
// the daemon forget it; it returns its last state.
func (c *Client) KillProcess(ctx context.Context, projectID int64, id string) (*Process, error) {
	var p Process
	if err := c.Do(ctx, "DELETE", processPath(projectID, id), nil, &p); err != nil {
		return nil, err
	}
	return &p, nil
}

// OutputOptions select a process's output: from offset From on (an offset
// older than what is retained starts where the retained output starts),
// following new output until the process ends when Follow is set.
type OutputOptions struct {
	From   int64
	Follow bool
}

// OutputChunk is one chunk of a process's output: the exact bytes (the
// client asks for base64) of Stream ("stdout" or "stderr") starting at
// Offset in the combined output.
type OutputChunk struct {
	Stream string
	Offset int64
	Data   []byte
}

// OutputEnd is the last line of an output answer: where a reader
// continues (Offset), and the process's state then (with its outcome once
// ended).
type OutputEnd = api.ProcessOutputEnd

// ProcessOutput reads the process's output, calling fn with each chunk in
// order (from this goroutine; Data is valid only during the call), and
// returns the answer's last line. An error from fn stops the reading and
// is returned. An answer cut before its last line is an error wrapping
// io.ErrUnexpectedEOF. Ending ctx stops following; the process is not
// affected by the reader going away.
func (c *Client) ProcessOutput(ctx context.Context, projectID int64, id string, opts OutputOptions, fn func(OutputChunk) error) (*OutputEnd, error) {
	q := url.Values{"from": {strconv.FormatInt(opts.From, 10)}, "encoding": {"base64"}, "follow": {"0"}}
	if opts.Follow {
		q.Set("follow", "1")
	}
	path := processPath(projectID, id) + "/output?" + q.Encode()
	req, err := http.NewRequestWithContext(ctx, "GET", c.URL(path), nil)
	if err != nil {
		return nil, fmt.Errorf("client: %w", err)
	}
	req.Header = c.Header()
	resp, err := c.http.Do(req)
	if err != nil {
		return nil, fmt.Errorf("client: GET %s: %w", path, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		data, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
		return nil, decodeError(resp.StatusCode, resp.Header, data)
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		var line struct {
			Stream *string `json:"stream"`
			Data   string  `json:"data"`
			api.ProcessOutputEnd
		}
		if err := json.Unmarshal(sc.Bytes(), &line); err != nil {
			return nil, fmt.Errorf("client: output line: %w", err)
		}
		if line.Stream == nil {
			end := line.ProcessOutputEnd
			return &end, nil
		}
		data, err := base64.StdEncoding.DecodeString(line.Data)
		if err != nil {
			return nil, fmt.Errorf("client: output chunk: %w", err)
		}
		if err := fn(OutputChunk{Stream: *line.Stream, Offset: line.Offset, Data: data}); err != nil {
			return nil, err
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("client: output: %w", err)
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	return nil, fmt.Errorf("client: output: the answer ended before its last line: %w", io.ErrUnexpectedEOF)
}

// IsNotFound reports whether err is the API's 404 "notFound" (a process
// the daemon does not know, or no longer keeps).
func IsNotFound(err error) bool {
	var e *Error
	return errors.As(err, &e) && e.Status == http.StatusNotFound
}
