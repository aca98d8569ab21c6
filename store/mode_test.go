package store

import (
	"context"
	"os"
	"path/filepath"
	"syscall"
	"testing"
)

// TestFileModesIgnoreUmask opens a new database under umask 022 (which
// would leave it 0644) and an old one left 0644: the database, -wal and
// -shm are 0600 while it is open.
func TestFileModesIgnoreUmask(t *testing.T) {
	old := syscall.Umask(0o022)
	defer syscall.Umask(old)
	check := func(t *testing.T, db string) {
		t.Helper()
		for _, p := range []string{db, db + "-wal", db + "-shm"} {
			st, err := os.Stat(p)
			if err != nil {
				t.Fatal(err)
			}
			if st.Mode().Perm() != 0o600 {
				t.Errorf("%s: mode %v, want 0600", filepath.Base(p), st.Mode().Perm())
			}
		}
	}
	ctx := context.Background()
	t.Run("new", func(t *testing.T) {
		db := filepath.Join(t.TempDir(), "corral.db")
		s, err := openSQLite(ctx, db, Options{Migrate: true})
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		if _, err := s.CreateAccount(ctx, "alice"); err != nil {
			t.Fatal(err)
		}
		check(t, db)
	})
	t.Run("existing 0644", func(t *testing.T) {
		db := filepath.Join(t.TempDir(), "corral.db")
		s, err := openSQLite(ctx, db, Options{Migrate: true})
		if err != nil {
			t.Fatal(err)
		}
		s.Close()
		if err := os.Chmod(db, 0o644); err != nil {
			t.Fatal(err)
		}
		s, err = openSQLite(ctx, db, Options{})
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		check(t, db)
	})
}
