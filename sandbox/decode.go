package sandbox

import (
	"strings"
	"unicode/utf8"
)

// decode turns captured bytes into a string: valid UTF-8 is kept as is
// (NUL bytes and newlines included) and every byte of an invalid sequence
// becomes U+FFFD.
func decode(b []byte) string {
	if utf8.Valid(b) {
		return string(b)
	}
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

// render decodes b and applies the provider's sanitizer.
func render(b []byte, sanitize func(string) string) string {
	s := decode(b)
	if sanitize != nil {
		s = sanitize(s)
	}
	return s
}
