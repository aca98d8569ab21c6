package idrange

import (
	"os"
	"path/filepath"
	"sync"
	"testing"
)

func TestClaimStableDistinctAndReclaimed(t *testing.T) {
	reg := filepath.Join(t.TempDir(), "reg", "ids.json")
	a, b := t.TempDir(), t.TempDir()
	ra, err := Claim(reg, a, 3*Align)
	if err != nil {
		t.Fatal(err)
	}
	if ra.Start < Floor || ra.Start%Align != 0 || ra.Size != 3*Align {
		t.Fatalf("claim %+v: want an aligned block of %d above %d", ra, 3*Align, Floor)
	}
	again, err := Claim(reg, a+"/.", 2*Align) // same owner, another spelling, smaller ask
	if err != nil || again != ra {
		t.Fatalf("second claim of the same owner: %+v, %v; want %+v", again, err, ra)
	}
	if _, err := Claim(reg, a, 4*Align); err == nil {
		t.Fatal("a claim larger than the recorded block was granted")
	}
	rb, err := Claim(reg, b, 1)
	if err != nil {
		t.Fatal(err)
	}
	if rb.overlaps(ra) || rb.Size != Align {
		t.Fatalf("b's block %+v overlaps a's %+v or is not one Align", rb, ra)
	}
	// The registry is not readable by other users.
	if st, err := os.Stat(reg); err != nil || st.Mode().Perm() != 0o600 {
		t.Errorf("registry mode: %v %v", st.Mode(), err)
	}
	// A removed owner's block is reclaimed by the next claim.
	if err := os.RemoveAll(a); err != nil {
		t.Fatal(err)
	}
	c := t.TempDir()
	rc, err := Claim(reg, c, Align)
	if err != nil {
		t.Fatal(err)
	}
	if rc.Start != ra.Start {
		t.Errorf("after a's removal c got %+v, want a's freed start %d", rc, ra.Start)
	}
	if err := Release(reg, c); err != nil {
		t.Fatal(err)
	}
	if rd, _ := Claim(reg, t.TempDir(), Align); rd.Start != ra.Start {
		t.Errorf("after release: %+v, want %d again", rd, ra.Start)
	}
	if _, err := Claim(reg, filepath.Join(a, "gone"), Align); err == nil {
		t.Error("a missing owner was granted a block")
	}
}

func TestClaimAvoidsSubordinateIDs(t *testing.T) {
	dir := t.TempDir()
	subuid := filepath.Join(dir, "subuid")
	// A host range right where the first block would go.
	if err := os.WriteFile(subuid, []byte("alice:16777216:100000\nbad line\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	old := subIDFiles
	subIDFiles = []string{subuid, filepath.Join(dir, "missing")}
	t.Cleanup(func() { subIDFiles = old })
	r, err := Claim(filepath.Join(dir, "ids.json"), t.TempDir(), Align)
	if err != nil {
		t.Fatal(err)
	}
	if r.overlaps(Range{Start: 16777216, Size: 100000}) || r.Start%Align != 0 {
		t.Errorf("claim %+v overlaps /etc/subuid's alice range", r)
	}
}

func TestClaimConcurrent(t *testing.T) {
	reg := filepath.Join(t.TempDir(), "ids.json")
	const n = 16
	owners := make([]string, n)
	for i := range owners {
		owners[i] = t.TempDir()
	}
	got := make([]Range, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r, err := Claim(reg, owners[i], 2*Align)
			if err != nil {
				t.Error(err)
			}
			got[i] = r
		}()
	}
	wg.Wait()
	for i := range got {
		for j := range i {
			if got[i].overlaps(got[j]) {
				t.Errorf("concurrent claims overlap: %+v and %+v", got[i], got[j])
			}
		}
	}
}
