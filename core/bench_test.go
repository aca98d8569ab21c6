package core_test

import (
	"context"
	"testing"

	"github.com/corral-sandbox/corral/internal/testworker"
)

// BenchmarkRunCommandManaged measures RunCommand(managed, true) through a
// real worker, warm machine.
func BenchmarkRunCommandManaged(b *testing.B) {
	w := testworker.Start(b, testworker.Options{})
	e := buildB(b, w)
	ctl, _ := e.core.Sandbox()
	ctx := context.Background()
	in := e.input(e.managed, "true")
	if _, err := ctl.RunCommand(ctx, in, &e.actor, nil); err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, err := ctl.RunCommand(ctx, in, &e.actor, nil); err != nil {
			b.Fatal(err)
		}
	}
}
