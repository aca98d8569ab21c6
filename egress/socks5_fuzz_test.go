package egress

import (
	"io"
	"net"
	"testing"
	"time"
)

// FuzzSOCKS5 feeds arbitrary bytes to the SOCKS5 server as a machine's
// program would: it never panics, answers within its bounds, and reaches
// only what the policy allows (nothing here: the fake resolver knows no
// name and the floor is closed), so no connection is ever journaled as
// allowed. `go test ./egress -fuzz FuzzSOCKS5` runs the campaign.
func FuzzSOCKS5(f *testing.F) {
	for _, s := range [][]byte{
		{5, 1, 0, 5, 1, 0, 1, 127, 0, 0, 1, 0, 80},
		{5, 1, 0, 5, 1, 0, 3, 7, 'u', 'p', '.', 't', 'e', 's', 't', 0, 80},
		{5, 1, 0, 5, 1, 0, 4, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 187},
		{5, 1, 0, 5, 2, 0, 1, 1, 1, 1, 1, 0, 80},
		{5, 1, 2}, {4, 1, 0, 80, 1, 2, 3, 4, 0}, {5, 255}, {5, 1, 0, 5, 1, 0, 3, 0, 0, 0}, {},
	} {
		f.Add(s)
	}
	floor, _ := NewFloor(nil, false)
	allowed := make(chan Record, 1)
	s, err := NewService(Options{Floor: floor, Resolver: fakeResolver{}, DialTimeout: time.Second,
		Audit: func(r Record) {
			if r.Verdict == VerdictAllowed {
				select {
				case allowed <- r:
				default:
				}
			}
		}})
	if err != nil {
		f.Fatal(err)
	}
	m, err := s.NewMachine(1, 1, Policy{Mode: ModeProxy, Allow: []string{"up.test", "*.test"}})
	if err != nil {
		f.Fatal(err)
	}
	defer m.Close()
	f.Fuzz(func(t *testing.T, in []byte) {
		client, server := net.Pipe()
		done := make(chan struct{})
		go func() { m.socks(server); close(done) }()
		client.SetDeadline(time.Now().Add(5 * time.Second))
		go func() { client.Write(in); client.(interface{ Close() error }).Close() }()
		io.Copy(io.Discard, client)
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Fatal("the SOCKS5 server did not finish")
		}
		select {
		case r := <-allowed:
			t.Fatalf("allowed: %+v", r)
		default:
		}
	})
}
