package egress

import (
	"context"
	"net"
	"syscall"
	"testing"
	"time"

	"github.com/corral-sandbox/corral/machine"
	"github.com/corral-sandbox/corral/store"
)

// noGateway is a Gateway for mode-none sessions, which never reach it.
type noGateway struct{}

func (noGateway) Listen(context.Context, machine.Project, int) (net.Listener, error) {
	return nil, net.ErrClosed
}

func (noGateway) Exec(context.Context, machine.ExecRequest) (*machine.Session, error) {
	return nil, net.ErrClosed
}

// BenchmarkSessionPolicy is a managed command's egress session start, mode
// none (what the bench's commands run under), two ways: reading the policy
// (Session) and under the policy its preparation read with the tenancy
// (SessionPolicy). Each follows a store write, as the command's lease
// insert precedes it. cpu-µs/op is this process's CPU time of the session
// start and its release.
//
//	go test ./egress -run '^$' -bench SessionPolicy -count 5
func BenchmarkSessionPolicy(b *testing.B) {
	ctx := context.Background()
	st, p := projectStore(b)
	l, err := st.CreateLease(ctx, store.NewLease{Project: p.ID, Kind: "terminal", TTL: time.Hour}, time.Now())
	if err != nil {
		b.Fatal(err)
	}
	mg, err := NewManager(ManagerOptions{Store: st, Gateway: noGateway{}, Poll: time.Hour})
	if err != nil {
		b.Fatal(err)
	}
	defer mg.Close()
	mp := machine.Project{ID: p.ID, Workspace: "/p"}
	for _, bc := range []struct {
		name  string
		start func() (map[string]string, func(), error)
	}{
		{"read", func() (map[string]string, func(), error) { return mg.Session(ctx, mp, 1, "lease-1") }},
		{"handed", func() (map[string]string, func(), error) { return mg.SessionPolicy(ctx, mp, 1, "lease-1", "", 1) }},
	} {
		b.Run(bc.name, func(b *testing.B) {
			var cpu time.Duration
			for b.Loop() {
				b.StopTimer()
				if err := st.HeartbeatLease(ctx, l.ID, time.Now()); err != nil {
					b.Fatal(err)
				}
				b.StartTimer()
				c0 := cpuTime()
				env, release, err := bc.start()
				if err != nil || env != nil {
					b.Fatal(env, err)
				}
				release()
				cpu += cpuTime() - c0
			}
			b.ReportMetric(float64(cpu.Microseconds())/float64(b.N), "cpu-µs/op")
		})
	}
}

func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
