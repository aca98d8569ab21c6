package provider

import (
	"strings"
	"testing"
)

// TestNullInputNotShared: a confined host command of one project sets
// O_NONBLOCK and O_APPEND on its /dev/null input; a command of another
// project must not see them on its own input (a /dev/null shared by all
// host commands carried them across: a channel between tenants, which
// could also make every other command's input nonblocking).
func TestNullInputNotShared(t *testing.T) {
	requireLandlock(t)
	a := newFixture(t, fixtureOpts{})
	b := newFixture(t, fixtureOpts{})
	res, err := a.run(t, "", "perl", "-e", "use Fcntl; my $f = fcntl(STDIN, F_GETFL, 0) or die; fcntl(STDIN, F_SETFL, $f | O_NONBLOCK | O_APPEND) or die qq(setfl: $!); printf(qq(%o\\n), fcntl(STDIN, F_GETFL, 0))")
	if err != nil || res.Code == nil || *res.Code != 0 {
		t.Fatalf("setting the flags: %+v, %v", res, err)
	}
	res, err = b.run(t, "", "sh", "-c", "grep flags /proc/self/fdinfo/0")
	if err != nil || res.Code == nil || *res.Code != 0 {
		t.Fatalf("other project: %+v, %v", res, err)
	}
	var fl int
	for _, line := range strings.Split(res.Stdout, "\n") {
		if v, ok := strings.CutPrefix(line, "flags:"); ok {
			for _, c := range strings.TrimSpace(v) {
				fl = fl*8 + int(c-'0')
			}
		}
	}
	const nonblock, appendFlag = 0o4000, 0o2000
	if fl&(nonblock|appendFlag) != 0 {
		t.Fatalf("the other project's command sees its input's flags set by the first: %o", fl)
	}
}
