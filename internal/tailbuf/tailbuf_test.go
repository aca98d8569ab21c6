package tailbuf

import "testing"

func TestKeepsTheEnd(t *testing.T) {
	b := &Buffer{Max: 5}
	for _, s := range []string{"abc", "defg", "h"} {
		if n, err := b.Write([]byte(s)); n != len(s) || err != nil {
			t.Fatalf("Write(%q) = %d, %v", s, n, err)
		}
	}
	if got := b.String(); got != "defgh" {
		t.Fatalf("kept %q, want %q", got, "defgh")
	}
	var all Buffer
	all.Write([]byte("0123456789"))
	if got := all.String(); got != "0123456789" {
		t.Fatalf("zero Buffer kept %q", got)
	}
}
