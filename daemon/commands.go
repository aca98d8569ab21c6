package daemon

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"io"
	"mime"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/corral-sandbox/corral/api"
	"github.com/corral-sandbox/corral/internal/utf8tail"

	"github.com/corral-sandbox/corral/sandbox"
	"github.com/corral-sandbox/corral/store"
)

// projectRef is the sandbox's name of a store project.
func projectRef(p store.Project) sandbox.ProjectRef {
	return sandbox.ProjectRef{Kind: sandbox.ProjectKind(p.Kind), ProjectID: p.ID}
}

// runCommand serves POST /v1/projects/{id}/commands: one bounded command,
// run by core's RunCommand as the token's account (with no extra roots).
// The request's context is the command's: a client that goes away aborts
// the command (recorded as 499).
//
// With "Accept: application/x-ndjson" the answer is streamed: once the
// command is about to start, the status 200 and the media type
// application/x-ndjson are sent, then one JSON object per line: {"stdout":S}
// or {"stderr":S} for each chunk of output as it arrives (in order within a
// stream), and last exactly one pinned result object or pinned error object
// (an error after the start, such as a timeout, is that last line under the
// status 200). Failures before the start (a bad request, 401, 403, a
// refused preparation) are the ordinary error answers with their statuses.
func (a *App) runCommand(w http.ResponseWriter, r *http.Request) error {
	acct, proj, _, err := a.projectMember(r)
	if err != nil {
		return err
	}
	var req api.CommandRequest
	// The body may carry MaxStdin bytes of input (as base64) beyond
	// MaxBody; everything else stays under MaxBody.
	limit := a.opts.MaxBody + int64(base64.StdEncoding.EncodedLen(int(a.opts.MaxStdin)))
	// A body that may be larger than MaxBody is held in memory about
	// twice (the JSON text, then the decoded stdin): reserve that before
	// reading it, so that concurrent uploads stay within the budget.
	if n := r.ContentLength; n < 0 || n > a.opts.MaxBody {
		if n < 0 || n > limit {
			n = limit
		}
		ctl, err := a.core.Sandbox()
		if err != nil {
			return err
		}
		input, err := ctl.Admit(r.Context(), sandbox.Admission{Kind: sandbox.AdmitInput, Account: acct.ID, Bytes: 2 * n})
		if err != nil {
			return err
		}
		defer input.Release()
	}
	body := &countingBody{ReadCloser: r.Body}
	r.Body = body
	if err := a.decodeBodyLimit(w, r, &req, limit); err != nil {
		return err
	}
	if body.n-int64(base64.StdEncoding.EncodedLen(len(req.Stdin))) > a.opts.MaxBody {
		return apiErr(http.StatusRequestEntityTooLarge, KindRequestTooLarge, "request body is larger than %d bytes", a.opts.MaxBody)
	}
	if req.LeaseKind == "" {
		req.LeaseKind = sandbox.LeaseTerminal
	}
	if req.TimeoutMs < 0 {
		return apiErr(http.StatusBadRequest, KindInvalid, "timeoutMs must not be negative")
	}
	timeout := time.Duration(req.TimeoutMs) * time.Millisecond
	if timeout > a.opts.MaxTimeout || req.TimeoutMs > int64(a.opts.MaxTimeout/time.Millisecond) {
		return apiErr(http.StatusBadRequest, KindInvalid, "timeoutMs must not exceed %d", a.opts.MaxTimeout.Milliseconds())
	}
	l := req.OutputLimit
	if l.Stdout > a.opts.MaxOutput || l.Stderr > a.opts.MaxOutput || l.Combined > a.opts.MaxOutput {
		return apiErr(http.StatusBadRequest, KindInvalid, "output limits must not exceed %d bytes", a.opts.MaxOutput)
	}
	binary := false
	switch req.Encoding {
	case "":
	case api.EncodingBase64:
		binary = true
	default:
		return apiErr(http.StatusBadRequest, KindInvalid, "encoding %q is not supported (only %q)", req.Encoding, api.EncodingBase64)
	}
	// The JSON decoder decoded stdin's base64 (a malformed one is a 400
	// of the body), within the body's limit.
	stdin := req.Stdin
	if int64(len(stdin)) > a.opts.MaxStdin {
		return apiErr(http.StatusRequestEntityTooLarge, KindRequestTooLarge, "stdin is larger than %d bytes", a.opts.MaxStdin)
	}
	req.Stdin = nil
	ctl, err := a.core.Sandbox()
	if err != nil {
		return err
	}
	// The command's output stays in memory until its response (with
	// NDJSON, the whole stream) is written: reserve it (429 over the
	// budget) until then, not only while it runs.
	ticket, err := ctl.Admit(r.Context(), sandbox.Admission{Kind: sandbox.AdmitCommand, Account: acct.ID, Bytes: reservedBytes(l)})
	if err != nil {
		return err
	}
	defer ticket.Release()
	// Registered like a session: the command ends when the token is
	// revoked or the member removed (403, see commandEnded).
	cctx, untrack := a.trackSession(sandbox.WithTicket(r.Context(), ticket), r, proj.ID)
	defer untrack()
	in := sandbox.ExecInput{Command: req.Command, Cwd: req.Cwd, User: req.User, LeaseKind: req.LeaseKind, Project: projectRef(proj), Env: req.Env}
	opts := &sandbox.RunOptions{Timeout: timeout, OutputLimit: l, RawOutput: binary}
	if len(stdin) > 0 {
		opts.Stdin = bytes.NewReader(stdin)
	}
	if !acceptsNDJSON(r) {
		res, err := ctl.RunCommand(cctx, in, &sandbox.Actor{AccountUserID: acct.ID}, opts)
		if err != nil {
			// Written here, while the partial output is still reserved.
			err = commandEnded(cctx, encodeError(err, binary))
			a.writeFailure(w, r, err)
			return err
		}
		writeJSON(w, http.StatusOK, encodeResult(res, binary))
		return nil
	}

	ctx, cancel := context.WithCancel(cctx)
	defer cancel()
	st := &ndjsonStream{w: w, rc: http.NewResponseController(w), binary: binary, broken: cancel}
	opts.OnStart = func(sandbox.StartInfo) error {
		if timeout == 0 {
			timeout = sandbox.DefaultTimeout
		}
		st.begin(time.Now().Add(timeout + ndjsonWriteGrace))
		return nil
	}
	opts.OnOutput = st.chunk
	res, err := ctl.RunCommand(ctx, in, &sandbox.Actor{AccountUserID: acct.ID}, opts)
	if !st.begun() {
		// Nothing was streamed: the ordinary answer.
		if err != nil {
			err = commandEnded(cctx, encodeError(err, binary))
			a.writeFailure(w, r, err)
			return err
		}
		writeJSON(w, http.StatusOK, encodeResult(res, binary))
		return nil
	}
	st.flushHeld()
	if err != nil {
		ae := toAPIError(commandEnded(cctx, encodeError(err, binary)))
		st.line(ae.streamer())
		return ae // for the log and metrics; the status 200 was sent
	}
	st.line(encodeResult(res, binary))
	return nil
}

// commandEnded is err, the failure of a command whose context is ctx, as
// answered: 403 "forbidden" with the reason and the partial output when
// the session checker ended it (the token was revoked, the account
// deleted, the caller removed from the project).
func commandEnded(ctx context.Context, err error) error {
	se, ok := context.Cause(ctx).(*sessionEnded)
	if !ok {
		return err
	}
	ae := *toAPIError(err)
	ae.Status, ae.Kind, ae.Message = http.StatusForbidden, KindForbidden, "the command was ended: "+se.reason
	return &ae
}

// ndjsonWriteGrace is how much longer than the command's timeout a
// streamed answer may take to write: a client that stops reading does not
// hold the command, and its lease, beyond that.
const ndjsonWriteGrace = 30 * time.Second

// acceptsNDJSON reports whether r asks for a streamed answer.
func acceptsNDJSON(r *http.Request) bool {
	for _, v := range r.Header.Values("Accept") {
		for _, part := range strings.Split(v, ",") {
			if mt, _, err := mime.ParseMediaType(strings.TrimSpace(part)); err == nil && mt == api.MediaNDJSON {
				return true
			}
		}
	}
	return false
}

// encodeResult returns res as it is answered (streamed, without a copy):
// its output base64 when binary.
func encodeResult(res *sandbox.CommandResult, binary bool) jsonStreamer {
	if !binary {
		return res
	}
	return base64Result{res}
}

// base64Result streams a result with its output base64.
type base64Result struct{ *sandbox.CommandResult }

func (r base64Result) WriteJSON(w io.Writer, escapeHTML bool) error {
	return r.WriteJSONBase64(w, escapeHTML)
}

// encodeError returns err as it is answered: with its partial output
// base64 when binary (see APIError.Base64).
func encodeError(err error, binary bool) error {
	if !binary {
		return err
	}
	ae := *toAPIError(err)
	ae.Base64 = true
	return &ae
}

// ndjsonStream writes a streamed command answer. Its methods are safe for
// the two output readers' concurrent calls.
type ndjsonStream struct {
	w      http.ResponseWriter
	rc     *http.ResponseController
	binary bool
	broken func() // called once when the client cannot be written to

	mu      sync.Mutex
	started bool
	failed  bool
	held    [3][]byte // per sandbox.Stream: an incomplete UTF-8 sequence (text only)
}

// begin sends the status and headers; writes must end by deadline.
func (s *ndjsonStream) begin(deadline time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.started = true
	_ = s.rc.SetWriteDeadline(deadline)
	h := s.w.Header()
	h.Set("Content-Type", api.MediaNDJSON)
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Cache-Control", "no-store")
	s.w.WriteHeader(http.StatusOK)
	s.flushLocked()
}

func (s *ndjsonStream) begun() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.started
}

// chunk writes one chunk of stream st (sandbox.RunOptions.OnOutput).
func (s *ndjsonStream) chunk(st sandbox.Stream, p []byte) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.started || s.failed {
		return
	}
	if s.binary {
		s.writeChunkLocked(st, base64.StdEncoding.EncodeToString(p))
		return
	}
	// A multi-byte character split between chunks is sent whole with the
	// next one.
	buf := append(s.held[st], p...)
	keep := utf8tail.Incomplete(buf)
	text := string(buf[:len(buf)-keep])
	s.held[st] = append(s.held[st][:0:0], buf[len(buf)-keep:]...)
	if text != "" {
		s.writeChunkLocked(st, text)
	}
}

// flushHeld writes what the streams held back; they have ended.
func (s *ndjsonStream) flushHeld() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, st := range []sandbox.Stream{sandbox.Stdout, sandbox.Stderr} {
		if len(s.held[st]) > 0 && !s.failed {
			s.writeChunkLocked(st, string(s.held[st]))
		}
		s.held[st] = nil
	}
}

func (s *ndjsonStream) writeChunkLocked(st sandbox.Stream, v string) {
	// json.Marshal makes invalid UTF-8 U+FFFD, as the result's decoding
	// does.
	b, _ := json.Marshal(map[string]string{st.String(): v})
	s.writeLocked(b)
}

// line writes the last line: v's pinned JSON, streamed without a copy of
// the output (as writeJSON writes it).
func (s *ndjsonStream) line(v jsonStreamer) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.failed {
		return
	}
	if v.WriteJSON(s.w, true) != nil {
		s.failLocked()
		return
	}
	s.writeLocked(nil)
}

func (s *ndjsonStream) writeLocked(b []byte) {
	if _, err := s.w.Write(append(b, '\n')); err != nil {
		s.failLocked()
		return
	}
	s.flushLocked()
}

func (s *ndjsonStream) flushLocked() {
	if err := s.rc.Flush(); err != nil {
		s.failLocked()
	}
}

// failLocked gives up on a client that cannot be written to, and aborts
// the command.
func (s *ndjsonStream) failLocked() {
	if !s.failed {
		s.failed = true
		s.broken()
	}
}

// countingBody counts the bytes read from a request body.
type countingBody struct {
	io.ReadCloser
	n int64
}

func (b *countingBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	b.n += int64(n)
	return n, err
}

// reservedBytes is what a command with limit l reserves: its limits with
// sandbox's defaults (1 MiB per stream) applied.
func reservedBytes(l sandbox.OutputLimit) int64 {
	if l.Combined > 0 {
		return l.Combined
	}
	n := int64(0)
	for _, v := range []int64{l.Stdout, l.Stderr} {
		if v == 0 {
			v = sandbox.DefaultStreamLimit
		}
		n += v
	}
	return n
}
