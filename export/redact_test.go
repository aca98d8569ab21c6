package export

import "testing"

// TestRedactText: export's messages go through corral's redactor, whose
// URL userinfo ends at the last '@' before the host.
func TestRedactText(t *testing.T) {
	raw := "https://bob:p@ss@example.com/x"
	for in, want := range map[string]string{
		"fatal: unable to access '" + raw + "/': 403": "fatal: unable to access 'https://[REDACTED]@example.com/x/': 403",
		"remote: tok3n-0123456789 denied":             "remote: [REDACTED] denied",
		"Authorization: Basic Zm9vOmJhcg==":           "Authorization: [REDACTED]",
	} {
		if got := redactText(in, raw, "tok3n-0123456789"); got != want {
			t.Errorf("redactText(%q) = %q, want %q", in, got, want)
		}
	}
}
