package sandbox

import (
	"strings"
	"unicode/utf8"
)

// decode makes captured text valid: valid UTF-8 is kept as is (NUL bytes
// and newlines included, and without a copy) and every byte of an invalid
// sequence becomes U+FFFD.
func decode(s string) string {
	if utf8.ValidString(s) {
		return s
	}
	b := []byte(s)
	var sb strings.Builder
	sb.Grow(len(b) + 16)
	for len(b) > 0 {
		r, size := utf8.DecodeRune(b)
		if r == utf8.RuneError && size <= 1 {
			sb.WriteRune(utf8.RuneError)
			b = b[1:]
			continue
		}
		sb.Write(b[:size])
		b = b[size:]
	}
	return sb.String()
}

// render decodes s and applies the provider's sanitizer.
func render(s string, sanitize func(string) string) string {
	s = decode(s)
	if sanitize != nil {
		s = sanitize(s)
	}
	return s
}
