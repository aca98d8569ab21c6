package editor

import (
	"errors"
	"reflect"
	"strings"
	"testing"
)

const (
	oidA = "1111111111111111111111111111111111111111"
	oidB = "2222222222222222222222222222222222222222"
	oidC = "3333333333333333333333333333333333333333"
)

func TestParseStatus(t *testing.T) {
	out := strings.Join([]string{
		"# branch.oid " + oidA,
		"# branch.head feature/x",
		"# branch.upstream origin/feature/x",
		"# branch.ab +3 -0",
		"# stash 2",
		"1 .M N... 100644 100644 100644 " + oidA + " " + oidA + " path with spaces.txt",
		"1 A. SC.. 000000 160000 160000 " + strings.Repeat("0", 40) + " " + oidB + " sub",
		"2 R. N... 100644 100644 100644 " + oidA + " " + oidA + " R87 new name", "old name",
		"2 C. N... 100644 100644 100644 " + oidA + " " + oidA + " C50 copy", "orig",
		"u AU N... 000000 100644 100644 100644 " + strings.Repeat("0", 40) + " " + oidB + " " + oidC + " both\nadded",
		"? untracked",
		"! ignored/file",
		"",
	}, "\x00")
	st, err := parseStatus(out, false)
	if err != nil {
		t.Fatal(err)
	}
	three, zero := 3, 0
	wantBranch := &Branch{OID: oidA, Head: "feature/x", Upstream: "origin/feature/x", Ahead: &three, Behind: &zero}
	if !reflect.DeepEqual(st.Branch, wantBranch) {
		t.Errorf("branch %+v", st.Branch)
	}
	want := []Entry{
		{Kind: EntryOrdinary, Path: "path with spaces.txt", Index: ".", Worktree: "M", ModeHead: "100644", ModeIndex: "100644", ModeWorktree: "100644", OIDHead: oidA, OIDIndex: oidA},
		{Kind: EntryOrdinary, Path: "sub", Index: "A", Worktree: ".", Submodule: "SC..", ModeHead: "000000", ModeIndex: "160000", ModeWorktree: "160000", OIDHead: strings.Repeat("0", 40), OIDIndex: oidB},
		{Kind: EntryRenamed, Path: "new name", OrigPath: "old name", Score: 87, Index: "R", Worktree: ".", ModeHead: "100644", ModeIndex: "100644", ModeWorktree: "100644", OIDHead: oidA, OIDIndex: oidA},
		{Kind: EntryCopied, Path: "copy", OrigPath: "orig", Score: 50, Index: "C", Worktree: ".", ModeHead: "100644", ModeIndex: "100644", ModeWorktree: "100644", OIDHead: oidA, OIDIndex: oidA},
		{Kind: EntryUnmerged, Path: "both\nadded", Index: "A", Worktree: "U", ModeWorktree: "100644", Conflicted: true, Conflict: "added by us",
			Stages: []Stage{{Stage: 1, Mode: "000000", OID: strings.Repeat("0", 40)}, {Stage: 2, Mode: "100644", OID: oidB}, {Stage: 3, Mode: "100644", OID: oidC}}},
		{Kind: EntryUntracked, Path: "untracked", Index: "?", Worktree: "?"},
		{Kind: EntryIgnored, Path: "ignored/file", Index: "!", Worktree: "!"},
	}
	if !reflect.DeepEqual(st.Entries, want) {
		t.Errorf("entries\n got %+v\nwant %+v", st.Entries, want)
	}

	// Detached, initial, upstream gone.
	st, err = parseStatus("# branch.oid (initial)\x00# branch.head (detached)\x00# branch.upstream origin/gone\x00", false)
	if err != nil {
		t.Fatal(err)
	}
	if b := st.Branch; !b.Initial || !b.Detached || b.OID != "" || b.Head != "" || b.Ahead != nil || b.Upstream != "origin/gone" {
		t.Errorf("branch %+v", b)
	}
	if st.Entries == nil {
		t.Error("entries of a clean repository are nil")
	}

	// A cut output drops its incomplete last record only when partial.
	cutOut := "? a\x002 R. N... 100644 100644 100644 " + oidA + " " + oidA + " R100 new\x00ol"
	if _, err := parseStatus(cutOut, false); err == nil {
		t.Error("a cut output parsed as complete")
	}
	st, err = parseStatus(cutOut, true)
	if err != nil || len(st.Entries) != 1 || st.Entries[0].Path != "a" {
		t.Errorf("partial: %+v, %v", st, err)
	}

	for _, bad := range []string{
		"1 .M N... 100644\x00",
		"2 R. N... 100644 100644 100644 " + oidA + " " + oidA + " X100 new\x00old\x00",
		"2 R. N... 100644 100644 100644 " + oidA + " " + oidA + " R100 new\x00",
		"# branch.ab 3 4\x00",
		"z what\x00",
		"\x00",
		"?\x00",
	} {
		if _, err := parseStatus(bad, false); err == nil {
			t.Errorf("%q parsed", bad)
		}
	}
}

func TestParseLog(t *testing.T) {
	rec := func(h, p, msg string) string {
		return strings.Join([]string{h, p, "Ada", "ada@example.com", "2024-01-02T03:04:05+00:00", "2024-01-03T00:00:00+01:00", msg}, "\x1f")
	}
	out := rec(oidA, oidB+" "+oidC, "merge it\n\nbody\x1fwith a unit separator\n") + "\x00" +
		rec(oidB, "", "  first\n  line two  \n\n\n\nbody\n") + "\x00"
	cs, err := parseLog(out, false)
	if err != nil {
		t.Fatal(err)
	}
	if len(cs) != 2 {
		t.Fatalf("%d commits", len(cs))
	}
	if c := cs[0]; c.Hash != oidA || !reflect.DeepEqual(c.Parents, []string{oidB, oidC}) || c.Subject != "merge it" ||
		c.Body != "body\x1fwith a unit separator\n" || c.CommitterDate != "2024-01-03T00:00:00+01:00" {
		t.Errorf("merge commit %+v", c)
	}
	if c := cs[1]; c.Subject != "first line two" || c.Body != "body\n" || c.Parents == nil || len(c.Parents) != 0 {
		t.Errorf("root commit %+v", c)
	}
	if cs, err := parseLog(out+rec(oidC, "", "cut"), true); err != nil || len(cs) != 2 {
		t.Errorf("partial: %d, %v", len(cs), err)
	}
	if cs, err := parseLog("", false); err != nil || cs == nil || len(cs) != 0 {
		t.Errorf("empty: %v, %v", cs, err)
	}
	if _, err := parseLog("short\x1frecord\x00", false); err == nil {
		t.Error("short record parsed")
	}
}

func TestCheckInput(t *testing.T) {
	for _, ref := range []string{"HEAD", "main", "HEAD~2", "main..topic", "v1.0^{commit}", "origin/main", "@{-1}", oidA} {
		if err := checkRef("ref", ref); err != nil {
			t.Errorf("%q: %v", ref, err)
		}
	}
	for _, ref := range []string{"", "-x", "--output=/tmp/f", "a b", "a\x00b", "a\nb", strings.Repeat("a", 2000)} {
		if err := checkRef("ref", ref); !errors.Is(err, ErrBadInput) {
			t.Errorf("%q: %v", ref, err)
		}
	}
	for in, want := range map[string]string{"": "", ".": "", "a/b": "a/b", "a//b/": "a/b", "./a/../b": "b", ":(glob)*": ":(glob)*"} {
		if got, err := cleanPath(in); err != nil || got != want {
			t.Errorf("cleanPath(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	for _, p := range []string{"/etc/passwd", "..", "../x", "a/../../x", "-p", "a\x00b"} {
		if _, err := cleanPath(p); !errors.Is(err, ErrBadInput) {
			t.Errorf("cleanPath(%q): %v", p, err)
		}
	}
}

func TestCut(t *testing.T) {
	for _, c := range []struct {
		in   string
		max  int64
		want string
	}{
		{"short", 10, "short"},
		{"line one\nline two\n", 12, "line one\n"},
		{"abcdef", 3, "abc"},
		{"aé", 2, "a"},   // é is two bytes
		{"aéb", 3, "aé"}, // cut right after é
		{"\n" + strings.Repeat("x", 20), 10, "\n" + strings.Repeat("x", 9)},
	} {
		if got := cut(c.in, c.max); got != c.want {
			t.Errorf("cut(%q, %d) = %q, want %q", c.in, c.max, got, c.want)
		}
	}
}

func FuzzParseStatus(f *testing.F) {
	f.Add("# branch.oid "+oidA+"\x00# branch.ab +1 -2\x001 .M N... 100644 100644 100644 "+oidA+" "+oidA+" f\x00", false)
	f.Add("2 R. N... 100644 100644 100644 "+oidA+" "+oidA+" R100 new\x00old\x00? u\x00", true)
	f.Add("u UU N... 100644 100644 100644 100644 "+oidA+" "+oidB+" "+oidC+" c\x00", false)
	f.Fuzz(func(t *testing.T, out string, partial bool) {
		st, err := parseStatus(out, partial)
		if err != nil {
			return
		}
		for _, e := range st.Entries {
			if e.Kind == "" || len(e.Index) != 1 || len(e.Worktree) != 1 {
				t.Fatalf("entry %+v", e)
			}
			if strings.Contains(e.Path, "\x00") || strings.Contains(e.OrigPath, "\x00") {
				t.Fatalf("NUL in a path: %+v", e)
			}
		}
	})
}

func FuzzParseLog(f *testing.F) {
	f.Add(oidA+"\x1f"+oidB+"\x1fa\x1fb\x1fc\x1fd\x1fsubject\n\nbody\n\x00", false)
	f.Add("", true)
	f.Fuzz(func(t *testing.T, out string, partial bool) {
		cs, err := parseLog(out, partial)
		if err != nil {
			return
		}
		for _, c := range cs {
			if c.Parents == nil || strings.Contains(c.Subject, "\n") {
				t.Fatalf("commit %+v", c)
			}
		}
	})
}
