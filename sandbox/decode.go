package sandbox

import (
	"strings"
	"unicode/utf8"
)

// decode makes captured text valid: valid UTF-8 is kept as is (NUL bytes
// and newlines included, and without a copy) and every byte of an invalid
// sequence becomes U+FFFD. Invalid text is copied once, its valid runs in
// bulk.
func decode(s string) string {
	if utf8.ValidString(s) {
		return s
	}
	var sb strings.Builder
	sb.Grow(len(s) + 2*utf8.UTFMax)
	for len(s) > 0 {
		// The valid run up to the next invalid byte.
		i := 0
		for i < len(s) {
			if s[i] < utf8.RuneSelf {
				i++
				continue
			}
			r, size := utf8.DecodeRuneInString(s[i:])
			if r == utf8.RuneError && size == 1 {
				break
			}
			i += size
		}
		sb.WriteString(s[:i])
		if i < len(s) {
			sb.WriteRune(utf8.RuneError)
			i++
		}
		s = s[i:]
	}
	return sb.String()
}

// render decodes s and applies the provider's sanitizer.
func render(s string, sanitizer func(string) string) string {
	return sanitize(decode(s), sanitizer)
}

// sanitize applies the provider's sanitizer, if any.
func sanitize(s string, sanitizer func(string) string) string {
	if sanitizer != nil {
		s = sanitizer(s)
	}
	return s
}
