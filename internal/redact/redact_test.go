package redact

import (
	"slices"
	"strings"
	"testing"

	"github.com/corral-sandbox/corral/store"
)

func TestString(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		// URL userinfo, whole, to the last '@' before the host.
		{"https://bob:p@ss@example.com/x", "https://[REDACTED]@example.com/x"},
		{"https://bob:secret@example.com/x", "https://[REDACTED]@example.com/x"},
		{"https://ghp_token@github.com/o/r.git", "https://[REDACTED]@github.com/o/r.git"},
		{"https://x-access-token:t0k@github.com", "https://[REDACTED]@github.com"},
		{"fatal: unable to access 'https://u:p@h/r/': 403", "fatal: unable to access 'https://[REDACTED]@h/r/': 403"},
		{"two https://a:b@h1/x and ssh://c@h2:22/y", "two https://[REDACTED]@h1/x and ssh://[REDACTED]@h2:22/y"},
		{"https://a:b@c@d@host", "https://[REDACTED]@host"},
		{"https://bob:pa?ss#w@host/x", "https://[REDACTED]@host/x"},
		{"https://example.com/a@b", "https://example.com/a@b"},
		{"https://example.com/x", "https://example.com/x"},
		{"mail bob@example.com about ://x@y", "mail bob@example.com about ://x@y"},
		{"git@github.com:org/repo.git", "git@github.com:org/repo.git"},
		// Query strings.
		{"https://h/cb?access_token=abc123&x=1", "https://h/cb?access_token=[REDACTED]&x=1"},
		{"https://h/p?x=1&token=abc#frag", "https://h/p?x=1&token=[REDACTED]#frag"},
		{"GET /api?api_key=K&password=P", "GET /api?api_key=[REDACTED]&password=[REDACTED]"},
		{"https://blob/x?sv=1&sig=AbC%2B", "https://blob/x?sv=1&sig=[REDACTED]"},
		{"https://h/p?tokenless=no", "https://h/p?tokenless=[REDACTED]"},
		{"https://h/p?page=2", "https://h/p?page=2"},
		// Headers and bearer strings.
		{"Authorization: Bearer abc.def-ghi\nnext", "Authorization: [REDACTED]\nnext"},
		{"http.extraHeader=AUTHORIZATION: basic dXNlcjpwYXNz", "http.extraHeader=AUTHORIZATION: [REDACTED]"},
		{"Proxy-Authorization: Basic Zm9v", "Proxy-Authorization: [REDACTED]"},
		{"sent bearer eyJhbGciOi.x.y to h", "sent bearer [REDACTED] to h"},
		// corral tokens.
		{"token corral_AbCdEf0123456789-_xyzXYZ0123456789abcdefghij ok", "token [REDACTED] ok"},
		{"corral_ alone", "corral_ alone"},
		// The editor's cases.
		{"ssh://git:p@ss@host:22/x and http://h/y@z", "ssh://[REDACTED]@host:22/x and http://h/y@z"},
		{"git+https://a:b@h\x00next https://c:d@e", "git+https://[REDACTED]@h\x00next https://[REDACTED]@e"},
		{"mail me@example.com at https://example.com", "mail me@example.com at https://example.com"},
		{"https://[REDACTED]@h", "https://[REDACTED]@h"},
		{"origin/main", "origin/main"},
		{"", ""},
		{"nothing secret here", "nothing secret here"},
	} {
		if got := String(tc.in); got != tc.want {
			t.Errorf("String(%q)\n got %q\nwant %q", tc.in, got, tc.want)
		}
	}
}

func TestKnownSecrets(t *testing.T) {
	r := New("", "s3cr3t", "s3cr3t-longer")
	for _, tc := range []struct{ in, want string }{
		{"push s3cr3t-longer and s3cr3t", "push [REDACTED] and [REDACTED]"},
		{"remote: s3cr3ts3cr3t", "remote: [REDACTED][REDACTED]"},
		{"https://x:s3cr3t@h/r", "https://[REDACTED]@h/r"},
		{"clean", "clean"},
	} {
		if got := r.String(tc.in); got != tc.want {
			t.Errorf("String(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
	var zero Redactor
	if got := zero.String("https://a:b@h"); got != "https://[REDACTED]@h" {
		t.Errorf("zero Redactor: %q", got)
	}
}

func TestArgv(t *testing.T) {
	in := []string{"git", "clone", "https://bob:p@ss@example.com/x", "--token", "abc", "--password=hunter2",
		"API_KEY=k", "-H", "Authorization: Bearer zzz", "plain"}
	want := []string{"git", "clone", "https://[REDACTED]@example.com/x", "--token", "[REDACTED]", "--password=[REDACTED]",
		"API_KEY=[REDACTED]", "-H", "Authorization: [REDACTED]", "plain"}
	orig := slices.Clone(in)
	if got := Argv(in); !slices.Equal(got, want) {
		t.Errorf("Argv\n got %q\nwant %q", got, want)
	}
	if !slices.Equal(in, orig) {
		t.Error("Argv modified its argument")
	}
	if Argv(nil) != nil {
		t.Error("Argv(nil) != nil")
	}
}

func TestTokenPrefixIsStore(t *testing.T) {
	if TokenPrefix != store.TokenPrefix {
		t.Fatalf("redact.TokenPrefix %q != store.TokenPrefix %q", TokenPrefix, store.TokenPrefix)
	}
}

func FuzzString(f *testing.F) {
	f.Add("https://bob:p@ss@example.com/x", "p@ss")
	f.Add("Authorization: Bearer x", "x")
	f.Add("x ssh://a@b@c/d", "")
	f.Fuzz(func(t *testing.T, s, secret string) {
		got := New(secret).String(s)
		if again := New(secret).String(got); again != got && !strings.ContainsAny(secret, "[]") && !strings.Contains(Marker, secret) {
			t.Fatalf("not idempotent on %q: %q then %q", s, got, again)
		}
		if u := userinfo(got); u != got {
			t.Fatalf("%q keeps userinfo: %q", got, u)
		}
		if len(secret) >= 3 && strings.Contains(got, secret) && !strings.Contains(Marker, secret) {
			t.Fatalf("secret %q survives in %q", secret, got)
		}
	})
}
