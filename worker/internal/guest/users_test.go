package guest

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"syscall"
	"testing"

	"github.com/corral-sandbox/corral/worker/internal/ctl"
)

func TestResolveUser(t *testing.T) {
	dir := t.TempDir()
	passwd := "root:x:0:0:root:/root:/bin/sh\n# comment\nbroken\nuser:x:1000:1000::/home/user:/bin/sh\napp:x:2000:3000::/srv/app:/bin/sh\nnohome:x:2001:2001\n"
	group := "root:x:0:\nstaff:x:50:app,user\nusers:x:100:user\napp:x:3000:app\nbig:x:99999:app\n"
	for name, text := range map[string]string{"passwd": passwd, "group": group} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	var err error
	db := &userDB{maxID: 65535}
	if db.passwd, err = readIDFile(filepath.Join(dir, "passwd"), false); err != nil {
		t.Fatal(err)
	}
	if db.group, err = readIDFile(filepath.Join(dir, "group"), true); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		spec     string
		fallback int64
		want     *ctl.Cred
		err      string
	}{
		{"root", -1, &ctl.Cred{UID: 0, GID: 0, Home: "/root"}, ""},
		{"0", -1, &ctl.Cred{UID: 0, GID: 0, Home: "/root"}, ""},
		{"app", -1, &ctl.Cred{UID: 2000, GID: 3000, Groups: []uint32{50}, Home: "/srv/app"}, ""},
		{"user", -1, &ctl.Cred{UID: 1000, GID: 1000, Groups: []uint32{50, 100}, Home: "/home/user"}, ""},
		{"app:staff", -1, &ctl.Cred{UID: 2000, GID: 50, Home: "/srv/app"}, ""},
		{"app:7", -1, &ctl.Cred{UID: 2000, GID: 7, Home: "/srv/app"}, ""},
		{"4242", -1, &ctl.Cred{UID: 4242, GID: 4242, Home: "/"}, ""},
		{"4242", 1000, &ctl.Cred{UID: 4242, GID: 1000, Home: "/"}, ""},
		{"nohome", -1, &ctl.Cred{UID: 2001, GID: 2001, Home: "/"}, ""},
		{"nosuch", -1, nil, "unknown user"},
		{"", -1, nil, "unknown user"},
		{"app:nosuch", -1, nil, "group"},
		{"70000", -1, nil, "not mapped"},
		{"app:70000", -1, nil, "not mapped"},
	}
	for _, tt := range tests {
		got, err := db.resolve(tt.spec, tt.fallback)
		if tt.err != "" {
			if err == nil || !strings.Contains(err.Error(), tt.err) {
				t.Errorf("resolve(%q) = %+v, %v; want an error with %q", tt.spec, got, err, tt.err)
			}
			continue
		}
		if err != nil || !reflect.DeepEqual(got, tt.want) {
			t.Errorf("resolve(%q) = %+v, %v; want %+v", tt.spec, got, err, tt.want)
		}
	}
	// Without /etc/passwd, root is uid 0 all the same.
	empty := &userDB{maxID: 65535}
	if got, err := empty.resolve("root", -1); err != nil || !reflect.DeepEqual(got, &ctl.Cred{Home: "/root"}) {
		t.Errorf("root without passwd: %+v, %v", got, err)
	}
	// A FIFO in place of /etc/passwd does not block the init.
	fifo := filepath.Join(dir, "fifo")
	if err := syscall.Mkfifo(fifo, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := readIDFile(fifo, false); err == nil {
		t.Error("a FIFO was read as a passwd file")
	}
	if e, err := readIDFile(filepath.Join(dir, "missing"), false); e != nil || err != nil {
		t.Errorf("missing file: %v %v", e, err)
	}
}
