package utf8tail

import (
	"testing"
	"unicode/utf8"
)

func TestIncomplete(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want int
	}{
		{"", 0}, {"a", 0}, {"é", 0}, {"\xc3", 1}, {"a\xe2\x82", 2}, {"\xe2", 1}, {"€", 0},
		{"\xf0\x9d\x84", 3}, {"𝄞", 0}, {"\x82\x82\x82", 0}, {"\xff", 0}, {"\xc0", 0}, {"\xf5\x80", 0},
	} {
		if got := Incomplete([]byte(tc.in)); got != tc.want {
			t.Errorf("Incomplete(%q) = %d, want %d", tc.in, got, tc.want)
		}
		if n := len(tc.in) - Incomplete([]byte(tc.in)); utf8.ValidString(tc.in) && !utf8.ValidString(tc.in[:n]) {
			t.Errorf("%q: cut inside a complete sequence", tc.in)
		}
	}
}
