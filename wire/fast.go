package wire

import (
	"bytes"
	"maps"
	"slices"
	"strconv"
)

// Every command crosses the protocol in five frames, each encoded once and
// decoded once, and encoding/json (reflection, and in Decode a map of the
// members first) cost about 5 µs of CPU per command to encode them and 20
// µs to decode them. appendFrame and decodeFast handle the common case by
// hand: frames whose strings are plain printable ASCII, which are most.
//
// appendFrame writes exactly the bytes Encode's general path would (the
// members in struct order, map keys sorted, omitempty honoured), or
// reports false when a string needs escaping. decodeFast parses a frame
// and accepts its result only if appendFrame gives back the very same
// bytes: a frame Encode itself could have made, whose decoding by the
// general path is that same message. Anything else — escapes, other
// spacing or order, unknown members, a bad descriptor count — takes the
// general path, which decides and reports exactly as before.

// plain reports whether s is encoded by encoding/json as itself between
// quotes: printable ASCII other than '"', '\\' and the HTML-escaped '<',
// '>' and '&'.
func plain[T string | []byte](s T) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c < 0x20 || c > 0x7e || c == '"' || c == '\\' || c == '<' || c == '>' || c == '&' {
			return false
		}
	}
	return true
}

// frameWriter appends members to a frame; ok turns false at the first
// string that is not plain.
type frameWriter struct {
	b  []byte
	ok bool
}

func (w *frameWriter) raw(s string) { w.b = append(w.b, s...) }

func (w *frameWriter) str(s string) {
	if !plain(s) {
		w.ok = false
		return
	}
	w.b = append(w.b, '"')
	w.b = append(w.b, s...)
	w.b = append(w.b, '"')
}

func (w *frameWriter) int(v int64) { w.b = strconv.AppendInt(w.b, v, 10) }

// member writes ,"key": and then the value through the caller.
func (w *frameWriter) member(key string) {
	w.b = append(w.b, ',', '"')
	w.b = append(w.b, key...)
	w.b = append(w.b, '"', ':')
}

func (w *frameWriter) project(p Project) {
	w.raw(`{"id":`)
	w.int(p.ID)
	w.raw(`,"workspace":`)
	w.str(p.Workspace)
	w.raw("}")
}

// appendFrame appends the frame of m, a validated message (pointer or
// value), to b. It reports false, with b's contents unspecified, when a
// string of m needs escaping or m's type is not handled here.
func appendFrame(b []byte, m Message) ([]byte, bool) {
	w := frameWriter{b: b, ok: true}
	t := m.Type()
	w.raw(`{"type":"`)
	w.raw(t)
	w.raw(`"`)
	if n := typeFDs(t); n > 0 {
		w.raw(`,"fds":`)
		w.int(int64(n))
	}
	switch m := pointerTo(m).(type) {
	case *Hello:
		w.member("protocol")
		w.int(int64(m.Protocol))
		if m.Worker != "" {
			w.member("worker")
			w.str(m.Worker)
		}
	case *Error:
		if m.ID != "" {
			w.member("id")
			w.str(m.ID)
		}
		w.member("code")
		w.str(m.Code)
		w.member("message")
		w.str(m.Message)
	case *Ping:
		if m.ID != "" {
			w.member("id")
			w.str(m.ID)
		}
	case *Pong:
		if m.ID != "" {
			w.member("id")
			w.str(m.ID)
		}
	case *ExecStart:
		w.member("id")
		w.str(m.ID)
		w.member("project")
		w.project(m.Project)
		w.member("account")
		w.int(m.Account)
		w.member("lease")
		w.str(m.Lease)
		w.member("argv")
		if m.Argv == nil {
			w.raw("null")
		} else {
			w.raw("[")
			for i, a := range m.Argv {
				if i > 0 {
					w.raw(",")
				}
				w.str(a)
			}
			w.raw("]")
		}
		w.member("cwd")
		w.str(m.Cwd)
		if len(m.Env) > 0 {
			w.member("env")
			w.raw("{")
			for i, k := range slices.Sorted(maps.Keys(m.Env)) {
				if i > 0 {
					w.raw(",")
				}
				w.str(k)
				w.raw(":")
				w.str(m.Env[k])
			}
			w.raw("}")
		}
	case *ExecAccepted:
		w.member("id")
		w.str(m.ID)
	case *ExecRejected:
		w.member("id")
		w.str(m.ID)
		w.member("code")
		w.str(m.Code)
		w.member("message")
		w.str(m.Message)
	case *ExecAttach:
		w.member("id")
		w.str(m.ID)
	case *ExecStarted:
		w.member("id")
		w.str(m.ID)
	case *ExecExit:
		w.member("id")
		w.str(m.ID)
		if m.Code != nil {
			w.member("code")
			w.int(int64(*m.Code))
		}
		if m.Signal != "" {
			w.member("signal")
			w.str(m.Signal)
		}
		if m.NotStarted {
			w.member("notStarted")
			w.raw("true")
		}
		if m.Message != "" {
			w.member("message")
			w.str(m.Message)
		}
	case *ExecCancel:
		w.member("id")
		w.str(m.ID)
	case *NetDial:
		w.member("id")
		w.str(m.ID)
		w.member("project")
		w.project(m.Project)
		w.member("port")
		w.int(int64(m.Port))
	case *NetDialed:
		w.member("id")
		w.str(m.ID)
	default:
		return nil, false
	}
	w.raw("}")
	return w.b, w.ok
}

// frameScanner reads the JSON of a frame made by appendFrame; ok turns
// false at the first thing it would not have written.
type frameScanner struct {
	b  []byte
	i  int
	ok bool
}

func (s *frameScanner) lit(x string) bool {
	if s.ok && bytes.HasPrefix(s.b[s.i:], []byte(x)) {
		s.i += len(x)
		return true
	}
	return false
}

func (s *frameScanner) expect(x string) {
	if !s.lit(x) {
		s.ok = false
	}
}

// str reads a string without escapes.
func (s *frameScanner) str() string {
	s.expect(`"`)
	if !s.ok {
		return ""
	}
	end := bytes.IndexByte(s.b[s.i:], '"')
	if end < 0 {
		s.ok = false
		return ""
	}
	v := s.b[s.i : s.i+end]
	s.i += end + 1
	if !plain(v) {
		s.ok = false
		return ""
	}
	return string(v)
}

// int reads an integer of at most 18 digits (any int64 appendFrame writes
// in practice; longer ones take the general path). Leading zeros and "-0"
// are read too, and refused by decodeFast's final comparison.
func (s *frameScanner) int() int64 {
	neg := s.lit("-")
	start := s.i
	var v int64
	for s.ok && s.i < len(s.b) && '0' <= s.b[s.i] && s.b[s.i] <= '9' {
		v = v*10 + int64(s.b[s.i]-'0')
		s.i++
	}
	if !s.ok || s.i == start || s.i-start > 18 {
		s.ok = false
		return 0
	}
	if neg {
		v = -v
	}
	return v
}

func (s *frameScanner) project() Project {
	var p Project
	s.expect(`{"id":`)
	p.ID = s.int()
	s.expect(`,"workspace":`)
	p.Workspace = s.str()
	s.expect("}")
	return p
}

// decodeFast decodes b, a frame that arrived with nfds descriptors, when
// it is exactly what appendFrame makes of the message it describes; it
// reports false otherwise, and the general path decides.
func decodeFast(b []byte, nfds int) (Message, bool) {
	s := frameScanner{b: b, ok: true}
	s.expect(`{"type":`)
	t := s.str()
	if !s.ok {
		return nil, false
	}
	m := newMessage(t)
	if m == nil || nfds != typeFDs(t) {
		return nil, false
	}
	if n := typeFDs(t); n > 0 {
		s.expect(`,"fds":`)
		if s.int() != int64(n) {
			return nil, false
		}
	}
	// The members, in the order appendFrame writes them; those it may omit
	// are optional here.
	member := func(key string) bool { return s.lit(`,"` + key + `":`) }
	need := func(key string) {
		if !member(key) {
			s.ok = false
		}
	}
	switch m := m.(type) {
	case *Hello:
		need("protocol")
		m.Protocol = int(s.int())
		if member("worker") {
			m.Worker = s.str()
		}
	case *Error:
		if member("id") {
			m.ID = s.str()
		}
		need("code")
		m.Code = s.str()
		need("message")
		m.Message = s.str()
	case *Ping:
		if member("id") {
			m.ID = s.str()
		}
	case *Pong:
		if member("id") {
			m.ID = s.str()
		}
	case *ExecStart:
		need("id")
		m.ID = s.str()
		need("project")
		m.Project = s.project()
		need("account")
		m.Account = s.int()
		need("lease")
		m.Lease = s.str()
		need("argv")
		if !s.lit("null") {
			s.expect("[")
			m.Argv = []string{}
			for s.ok && !s.lit("]") {
				if len(m.Argv) > 0 {
					s.expect(",")
				}
				m.Argv = append(m.Argv, s.str())
			}
		}
		need("cwd")
		m.Cwd = s.str()
		if member("env") {
			s.expect("{")
			m.Env = make(map[string]string)
			for s.ok && !s.lit("}") {
				if len(m.Env) > 0 {
					s.expect(",")
				}
				k := s.str()
				s.expect(":")
				m.Env[k] = s.str()
			}
		}
	case *ExecAccepted:
		need("id")
		m.ID = s.str()
	case *ExecRejected:
		need("id")
		m.ID = s.str()
		need("code")
		m.Code = s.str()
		need("message")
		m.Message = s.str()
	case *ExecAttach:
		need("id")
		m.ID = s.str()
	case *ExecStarted:
		need("id")
		m.ID = s.str()
	case *ExecExit:
		need("id")
		m.ID = s.str()
		if member("code") {
			c := int(s.int())
			m.Code = &c
		}
		if member("signal") {
			m.Signal = s.str()
		}
		if member("notStarted") {
			s.expect("true")
			m.NotStarted = true
		}
		if member("message") {
			m.Message = s.str()
		}
	case *ExecCancel:
		need("id")
		m.ID = s.str()
	case *NetDial:
		need("id")
		m.ID = s.str()
		need("project")
		m.Project = s.project()
		need("port")
		m.Port = int(s.int())
	case *NetDialed:
		need("id")
		m.ID = s.str()
	default:
		return nil, false
	}
	s.expect("}")
	if !s.ok || s.i != len(b) || validate(m) != nil {
		return nil, false
	}
	// Accept only what appendFrame gives back byte for byte: that rules out
	// duplicate members, out-of-range numbers, unsorted env keys and
	// anything else the general path might read differently.
	var scratch [512]byte
	enc, ok := appendFrame(scratch[:0], m)
	if !ok || !bytes.Equal(enc, b) {
		return nil, false
	}
	return m, true
}
