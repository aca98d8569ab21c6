package guest

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestLookPath(t *testing.T) {
	dir := t.TempDir()
	exe := filepath.Join(dir, "prog")
	if err := os.WriteFile(exe, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "data"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(dir, "sub"), 0o755); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		file, path, want, err string
	}{
		{"prog", "/nonexistent:" + dir, exe, ""},
		{"data", dir, "", "not found"},
		{"sub", dir, "", "not found"},
		{"nope", dir, "", "not found"},
		{"./rel/x", "", "./rel/x", ""},
		{"/abs/x", "", "/abs/x", ""},
	}
	for _, tt := range tests {
		got, err := lookPath(tt.file, tt.path)
		if got != tt.want || (err == nil) != (tt.err == "") || err != nil && !strings.Contains(err.Error(), tt.err) {
			t.Errorf("lookPath(%q, %q) = %q, %v", tt.file, tt.path, got, err)
		}
	}
}

func TestEnvPath(t *testing.T) {
	if got := envPath([]string{"PATH=/a", "HOME=/h", "PATH=/b"}); got != "/b" {
		t.Errorf("last PATH wins like getenv of a later assignment: %q", got)
	}
	if got := envPath([]string{"HOME=/h"}); got != "" {
		t.Errorf("no PATH: %q", got)
	}
}
