package wire

import (
	"slices"
	"strconv"
)

// A hand-written codec for the frames of every command's life: exec-start,
// exec-attach, exec-run, exec-cancel (core → worker) and exec-accepted, exec-started,
// exec-exit (worker → core). It writes and reads the very bytes
// encoding/json does, so the wire is unchanged: it is not a new framing
// and needs no feature.
//
//   - encodeFast writes a frame only when every string in it is printable
//     ASCII that encoding/json writes as is (no '"', '\\', '<', '>', '&'):
//     its output is then byte for byte encodeJSON's (tested, and fuzzed in
//     FuzzFastEncode). Any other message goes through encodeJSON.
//   - decodeFast accepts only frames in that canonical shape — the members
//     in encodeJSON's order, no white space, no escapes, integers without
//     leading zeros — and returns what decodeJSON returns for them (fuzzed
//     in FuzzFastDecode). Any other frame, valid or not, goes through
//     decodeJSON, which alone reports protocol errors.
//
// Measured (wire BenchmarkEncodeTurn/BenchmarkDecodeTurn, the five frames
// of a command): see the commit that added this file.

// plain reports whether encoding/json writes s as is between quotes.
func plain(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c < 0x20 || c > 0x7e || c == '"' || c == '\\' || c == '<' || c == '>' || c == '&' {
			return false
		}
	}
	return true
}

// fastBuf is an encoder that gives up (ok false) on a string it cannot
// write as encoding/json would.
type fastBuf struct {
	b  []byte
	ok bool
}

func (f *fastBuf) raw(s string) { f.b = append(f.b, s...) }

func (f *fastBuf) str(s string) {
	if !plain(s) {
		f.ok = false
		return
	}
	f.b = append(f.b, '"')
	f.b = append(f.b, s...)
	f.b = append(f.b, '"')
}

func (f *fastBuf) int(n int64) { f.b = strconv.AppendInt(f.b, n, 10) }

// encodeFast returns m's frame, or nil when m is not one of the hot
// messages or holds a string encodeJSON would escape. m is a validated
// pointer (Encode's p).
func encodeFast(m Message) []byte {
	f := fastBuf{ok: true}
	switch m := m.(type) {
	case *ExecAccepted:
		f.b = make([]byte, 0, 64)
		f.raw(`{"type":"exec-accepted","id":`)
		f.str(m.ID)
	case *ExecStarted:
		f.b = make([]byte, 0, 64)
		f.raw(`{"type":"exec-started","id":`)
		f.str(m.ID)
	case *ExecCancel:
		f.b = make([]byte, 0, 64)
		f.raw(`{"type":"exec-cancel","id":`)
		f.str(m.ID)
	case *ExecAttach:
		f.b = make([]byte, 0, 64)
		f.raw(`{"type":"exec-attach","fds":3,"id":`)
		f.str(m.ID)
	case *ExecExit:
		if m.NotStarted || m.Message != "" {
			return nil
		}
		f.b = make([]byte, 0, 96)
		f.raw(`{"type":"exec-exit","id":`)
		f.str(m.ID)
		if m.Code != nil {
			f.raw(`,"code":`)
			f.int(int64(*m.Code))
		}
		if m.Signal != "" {
			f.raw(`,"signal":`)
			f.str(m.Signal)
		}
		if m.OOMKilled {
			f.raw(`,"oomKilled":true`)
		}
	case *ExecStart:
		encodeExecStart(&f, `{"type":"exec-start","id":`, m)
	case *ExecRun:
		encodeExecStart(&f, `{"type":"exec-run","fds":3,"id":`, (*ExecStart)(m))
	default:
		return nil
	}
	if !f.ok {
		return nil
	}
	return append(f.b, '}')
}

// encodeExecStart writes an exec-start's members after head (the type,
// and the descriptor count of an exec-run, up to "id":).
func encodeExecStart(f *fastBuf, head string, m *ExecStart) {
	n := 256 + len(m.Project.Workspace) + len(m.Project.Image) + len(m.Cwd) + len(m.User)
	for _, a := range m.Argv {
		n += len(a) + 3
	}
	for k, v := range m.Env {
		n += len(k) + len(v) + 6
	}
	f.b = make([]byte, 0, n)
	f.raw(head)
	f.str(m.ID)
	f.raw(`,"project":{"id":`)
	f.int(m.Project.ID)
	f.raw(`,"workspace":`)
	f.str(m.Project.Workspace)
	if m.Project.Image != "" {
		f.raw(`,"image":`)
		f.str(m.Project.Image)
	}
	if l := m.Project.Limits; l != nil {
		f.raw(`,"limits":{`)
		first := true
		for _, kv := range [...]struct {
			k string
			v int64
		}{{"memory", l.Memory}, {"pids", l.Pids}, {"cpuMillis", l.CPU}, {"disk", l.Disk}, {"tmp", l.Tmp}} {
			if kv.v == 0 {
				continue
			}
			if !first {
				f.raw(",")
			}
			first = false
			f.raw(`"` + kv.k + `":`)
			f.int(kv.v)
		}
		f.raw("}")
	}
	f.raw(`},"account":`)
	f.int(m.Account)
	f.raw(`,"lease":`)
	f.str(m.Lease)
	f.raw(`,"argv":`)
	if m.Argv == nil {
		f.raw("null")
	} else {
		f.raw("[")
		for i, a := range m.Argv {
			if i > 0 {
				f.raw(",")
			}
			f.str(a)
		}
		f.raw("]")
	}
	f.raw(`,"cwd":`)
	f.str(m.Cwd)
	if len(m.Env) > 0 {
		keys := make([]string, 0, len(m.Env))
		for k := range m.Env {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		f.raw(`,"env":{`)
		for i, k := range keys {
			if i > 0 {
				f.raw(",")
			}
			f.str(k)
			f.raw(":")
			f.str(m.Env[k])
		}
		f.raw("}")
	}
	if m.User != "" {
		f.raw(`,"user":`)
		f.str(m.User)
	}
	if t := m.TTY; t != nil {
		f.raw(`,"tty":{"rows":`)
		f.int(int64(t.Rows))
		f.raw(`,"cols":`)
		f.int(int64(t.Cols))
		f.raw("}")
	}
}

// fastReader reads a canonical frame; any surprise clears ok.
type fastReader struct {
	b  []byte
	ok bool
}

// lit consumes s.
func (r *fastReader) lit(s string) {
	if !r.ok || len(r.b) < len(s) || string(r.b[:len(s)]) != s {
		r.ok = false
		return
	}
	r.b = r.b[len(s):]
}

// peek reports whether the rest starts with s (and consumes it if so).
func (r *fastReader) peek(s string) bool {
	if r.ok && len(r.b) >= len(s) && string(r.b[:len(s)]) == s {
		r.b = r.b[len(s):]
		return true
	}
	return false
}

// str reads a string of plain characters.
func (r *fastReader) str() string {
	if !r.ok || len(r.b) == 0 || r.b[0] != '"' {
		r.ok = false
		return ""
	}
	for i := 1; i < len(r.b); i++ {
		c := r.b[i]
		switch {
		case c == '"':
			s := string(r.b[1:i])
			r.b = r.b[i+1:]
			return s
		case c < 0x20 || c > 0x7e || c == '\\':
			r.ok = false
			return ""
		}
	}
	r.ok = false
	return ""
}

// int reads a JSON integer of at most 18 digits (no overflow of an
// int64, hence none of the Go type it is read into if it fits: checked by
// the caller) without leading zeros, exponent or fraction.
func (r *fastReader) int() int64 {
	if !r.ok {
		return 0
	}
	i, neg := 0, false
	if i < len(r.b) && r.b[i] == '-' {
		neg, i = true, 1
	}
	start := i
	var n int64
	for i < len(r.b) && r.b[i] >= '0' && r.b[i] <= '9' && i-start < 19 {
		n = n*10 + int64(r.b[i]-'0')
		i++
	}
	digits := i - start
	if digits == 0 || digits > 18 || (digits > 1 && r.b[start] == '0') {
		r.ok = false
		return 0
	}
	if i < len(r.b) && (r.b[i] == '.' || r.b[i] == 'e' || r.b[i] == 'E' || (r.b[i] >= '0' && r.b[i] <= '9')) {
		r.ok = false
		return 0
	}
	r.b = r.b[i:]
	if neg {
		n = -n
	}
	return n
}

// end consumes the final '}' and requires nothing after it.
func (r *fastReader) end() bool {
	r.lit("}")
	return r.ok && len(r.b) == 0
}

// idOnly reads `"id":"X"}`.
func (r *fastReader) idOnly() (string, bool) {
	r.lit(`"id":`)
	id := r.str()
	return id, r.end() && id != ""
}

// decodeFast returns the message of a canonical hot frame that arrived
// with nfds descriptors, or nil when b is anything else (decodeJSON then
// decides).
func decodeFast(b []byte, nfds int) Message {
	r := fastReader{b: b, ok: true}
	r.lit(`{"type":"exec-`)
	if !r.ok {
		return nil
	}
	switch {
	case r.peek(`started",`):
		if id, ok := r.idOnly(); ok && nfds == 0 {
			return &ExecStarted{ID: id}
		}
	case r.peek(`accepted",`):
		if id, ok := r.idOnly(); ok && nfds == 0 {
			return &ExecAccepted{ID: id}
		}
	case r.peek(`cancel",`):
		if id, ok := r.idOnly(); ok && nfds == 0 {
			return &ExecCancel{ID: id}
		}
	case r.peek(`attach","fds":3,`):
		if id, ok := r.idOnly(); ok && nfds == 3 {
			return &ExecAttach{ID: id}
		}
	case r.peek(`exit",`):
		if nfds != 0 {
			return nil
		}
		return decodeExecExit(&r)
	case r.peek(`start",`):
		if nfds != 0 {
			return nil
		}
		if m := decodeExecStart(&r); m != nil {
			return m
		}
	case r.peek(`run","fds":3,`):
		if nfds != 3 {
			return nil
		}
		if m := decodeExecStart(&r); m != nil {
			return (*ExecRun)(m)
		}
	}
	return nil
}

func decodeExecExit(r *fastReader) Message {
	m := &ExecExit{}
	r.lit(`"id":`)
	m.ID = r.str()
	if r.peek(`,"code":`) {
		n := r.int()
		if int64(int(n)) != n {
			return nil
		}
		c := int(n)
		m.Code = &c
	}
	if r.peek(`,"signal":`) {
		m.Signal = r.str()
		if m.Signal == "" {
			return nil
		}
	}
	if r.peek(`,"oomKilled":true`) {
		m.OOMKilled = true
	}
	if !r.end() || validate(m) != nil {
		return nil
	}
	return m
}

// decodeExecStart reads an exec-start's members (also exec-run's); nil
// when they are not in canonical shape.
func decodeExecStart(r *fastReader) *ExecStart {
	m := &ExecStart{}
	r.lit(`"id":`)
	m.ID = r.str()
	r.lit(`,"project":{"id":`)
	m.Project.ID = r.int()
	r.lit(`,"workspace":`)
	m.Project.Workspace = r.str()
	if r.peek(`,"image":`) {
		if m.Project.Image = r.str(); m.Project.Image == "" {
			return nil
		}
	}
	if r.peek(`,"limits":{`) {
		l := &Limits{}
		first := true
		for _, f := range [...]struct {
			k string
			v *int64
		}{{"memory", &l.Memory}, {"pids", &l.Pids}, {"cpuMillis", &l.CPU}, {"disk", &l.Disk}, {"tmp", &l.Tmp}} {
			sep := `,"`
			if first {
				sep = `"`
			}
			if r.peek(sep + f.k + `":`) {
				if *f.v = r.int(); *f.v == 0 {
					return nil
				}
				first = false
			}
		}
		r.lit("}")
		m.Project.Limits = l
	}
	r.lit(`},"account":`)
	m.Account = r.int()
	r.lit(`,"lease":`)
	m.Lease = r.str()
	r.lit(`,"argv":[`)
	m.Argv = []string{}
	if !r.peek("]") {
		for r.ok {
			m.Argv = append(m.Argv, r.str())
			if r.peek("]") {
				break
			}
			r.lit(",")
		}
	}
	r.lit(`,"cwd":`)
	m.Cwd = r.str()
	if r.peek(`,"env":{`) {
		m.Env = make(map[string]string, 8)
		prev := ""
		for r.ok {
			k := r.str()
			r.lit(":")
			v := r.str()
			if len(m.Env) > 0 && k <= prev {
				return nil // not encoding/json's sorted, unique keys
			}
			m.Env[k], prev = v, k
			if r.peek("}") {
				break
			}
			r.lit(",")
		}
	}
	if r.peek(`,"user":`) {
		if m.User = r.str(); m.User == "" {
			return nil
		}
	}
	if r.peek(`,"tty":{"rows":`) {
		t := &TTY{}
		rows := r.int()
		r.lit(`,"cols":`)
		cols := r.int()
		r.lit("}")
		if rows < 0 || rows > 0xffff || cols < 0 || cols > 0xffff {
			return nil
		}
		t.Rows, t.Cols = uint16(rows), uint16(cols)
		m.TTY = t
	}
	if !r.end() || validate(m) != nil {
		return nil
	}
	return m
}
