package mcpserver

import (
	"strings"
	"testing"
	"unicode/utf8"
)

func TestHeadTail(t *testing.T) {
	short := "é" + strings.Repeat("x", 8)
	if got, cut := headTail(short, len(short), "stdout", "see"); got != short || cut {
		t.Errorf("short: %q %v", got, cut)
	}
	// Every length of cut, with multi-byte characters at every boundary.
	s := strings.Repeat("aé€𝄞", 50)
	for limit := 2; limit < len(s); limit++ {
		got, cut := headTail(s, limit, "stdout", "READ THE REST")
		if !cut || !utf8.ValidString(got) {
			t.Fatalf("limit %d: cut %v, valid %v", limit, cut, utf8.ValidString(got))
		}
		head, tail, ok := strings.Cut(got, "\n[corral: ")
		marker, tail, ok2 := strings.Cut(tail, "]\n")
		if !ok || !ok2 || !strings.Contains(marker, "READ THE REST") || !strings.Contains(marker, "of stdout") {
			t.Fatalf("limit %d: no marker in %q", limit, got)
		}
		if len(head)+len(tail) > limit || len(head)+len(tail) < limit-2*(utf8.UTFMax-1) ||
			!strings.HasPrefix(s, head) || !strings.HasSuffix(s, tail) {
			t.Fatalf("limit %d: head %q tail %q", limit, head, tail)
		}
	}
}

func TestSize(t *testing.T) {
	for n, want := range map[int]string{1 << 20: "1 MiB", 32 << 10: "32 KiB", 1000: "1000 bytes", 1<<20 + 1: "1048577 bytes"} {
		if got := size(n); got != want {
			t.Errorf("size(%d) = %q, want %q", n, got, want)
		}
	}
}

func TestPage(t *testing.T) {
	s := []byte("a€b")
	for limit, want := range []string{"", "a", "a", "a", "a€", "a€b", "a€b"} {
		if got := page(s, limit); string(got) != want {
			t.Errorf("page(%q, %d) = %q, want %q", s, limit, got, want)
		}
	}
}
