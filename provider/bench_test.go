package provider

import (
	"context"
	"os/exec"
	"testing"
)

// BenchmarkRunCommandHost measures RunCommand(host, `true`) end to end:
// preparation (store lookups, cwd resolution, lease acquisition in SQLite),
// the start (through the confinement helper, or directly), capture, and the
// lease release. Compare with BenchmarkBareExec.
func BenchmarkRunCommandHost(b *testing.B) {
	for _, bc := range []struct {
		name    string
		trusted bool
	}{{"confined", false}, {"direct", true}} {
		b.Run(bc.name, func(b *testing.B) {
			if !bc.trusted {
				requireLandlock(b)
			}
			f := newFixture(b, fixtureOpts{trusted: bc.trusted})
			ctx := context.Background()
			in := f.input("", "true")
			a := f.actor
			b.ReportAllocs()
			for b.Loop() {
				res, err := f.ctrl.RunCommand(ctx, in, &a, nil)
				if err != nil || *res.Code != 0 {
					b.Fatalf("%+v, %v", res, err)
				}
			}
		})
	}
}

// BenchmarkBareExec is the floor: exec.Command("true").Run().
func BenchmarkBareExec(b *testing.B) {
	b.ReportAllocs()
	for b.Loop() {
		if err := exec.Command("true").Run(); err != nil {
			b.Fatal(err)
		}
	}
}
