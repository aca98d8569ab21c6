package egress

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"
)

// The benchmarks run the proxies on host loopback (a machine's listener is
// a listener like any other) against a raw TCP upstream that sends
// benchDownload bytes per connection.
//
//	go test ./egress -run '^$' -bench . -benchtime 3x

const benchDownload = 1 << 30

// sink is an upstream that writes n bytes to every connection.
func sink(b *testing.B, n int64) string {
	b.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { ln.Close() })
	buf := make([]byte, 256<<10)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				for left := n; left > 0; {
					k := min(left, int64(len(buf)))
					if _, err := c.Write(buf[:k]); err != nil {
						return
					}
					left -= k
				}
			}()
		}
	}()
	return ln.Addr().String()
}

func benchMachine(b *testing.B) (httpAddr, socksAddr string) {
	b.Helper()
	floor, _ := NewFloor([]string{"127.0.0.0/8"}, false)
	s, err := NewService(Options{Floor: floor, MaxConns: 1024})
	if err != nil {
		b.Fatal(err)
	}
	m, err := s.NewMachine(1, 1, Policy{Mode: ModeProxy, Allow: []string{"127.0.0.0/8"}})
	if err != nil {
		b.Fatal(err)
	}
	hl, _ := net.Listen("tcp", "127.0.0.1:0")
	sl, _ := net.Listen("tcp", "127.0.0.1:0")
	go m.ServeHTTP(hl)
	go m.ServeSOCKS5(sl)
	b.Cleanup(func() { m.Close() })
	return hl.Addr().String(), sl.Addr().String()
}

// tunnel opens a CONNECT tunnel to target through proxy.
func tunnel(b *testing.B, proxy, target string) (net.Conn, io.Reader) {
	c, err := net.Dial("tcp", proxy)
	if err != nil {
		b.Fatal(err)
	}
	fmt.Fprintf(c, "CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n", target, target)
	br := bufio.NewReaderSize(c, 64<<10)
	resp, err := http.ReadResponse(br, nil)
	if err != nil || resp.StatusCode != 200 {
		b.Fatalf("CONNECT: %v %v", resp, err)
	}
	return c, br
}

func socksTunnel(b *testing.B, proxy, target string) net.Conn {
	c, err := net.Dial("tcp", proxy)
	if err != nil {
		b.Fatal(err)
	}
	host, port, _ := net.SplitHostPort(target)
	var p int
	fmt.Sscan(port, &p)
	ip := net.ParseIP(host).To4()
	c.Write([]byte{5, 1, 0})
	req := append([]byte{5, 1, 0, 1}, ip...)
	req = append(req, byte(p>>8), byte(p))
	c.Write(req)
	var rep [12]byte
	if _, err := io.ReadFull(c, rep[:12]); err != nil || rep[3] != 0 {
		b.Fatalf("SOCKS5: %v %v", rep, err)
	}
	return c
}

func download(b *testing.B, r io.Reader) {
	n, err := io.Copy(io.Discard, r)
	if err != nil || n != benchDownload {
		b.Fatalf("read %d, %v", n, err)
	}
}

// BenchmarkDownload: a 1 GiB download straight from the upstream, through
// a CONNECT tunnel and through SOCKS5 (MB/s compare).
func BenchmarkDownload(b *testing.B) {
	up := sink(b, benchDownload)
	hp, sp := benchMachine(b)
	b.Run("direct", func(b *testing.B) {
		b.SetBytes(benchDownload)
		for b.Loop() {
			c, err := net.Dial("tcp", up)
			if err != nil {
				b.Fatal(err)
			}
			download(b, c)
			c.Close()
		}
	})
	b.Run("connect", func(b *testing.B) {
		b.SetBytes(benchDownload)
		for b.Loop() {
			c, r := tunnel(b, hp, up)
			download(b, r)
			c.Close()
		}
	})
	b.Run("socks5", func(b *testing.B) {
		b.SetBytes(benchDownload)
		for b.Loop() {
			c := socksTunnel(b, sp, up)
			download(b, c)
			c.Close()
		}
	})
}

// BenchmarkSetup: from dial to the first upstream byte, direct and through
// the proxies (the policy check, a resolution-free address, the dial, the
// proxy protocol); reports the process CPU per connection.
func BenchmarkSetup(b *testing.B) {
	up := sink(b, 1)
	hp, sp := benchMachine(b)
	first := func(b *testing.B, r io.Reader) {
		var one [1]byte
		if _, err := io.ReadFull(r, one[:]); err != nil {
			b.Fatal(err)
		}
	}
	cpu := func(b *testing.B, f func()) {
		var r0, r1 syscall.Rusage
		syscall.Getrusage(syscall.RUSAGE_SELF, &r0)
		n := 0
		for b.Loop() {
			f()
			n++
		}
		syscall.Getrusage(syscall.RUSAGE_SELF, &r1)
		used := time.Duration(r1.Utime.Nano()+r1.Stime.Nano()-r0.Utime.Nano()-r0.Stime.Nano()) * time.Nanosecond
		b.ReportMetric(float64(used.Microseconds())/float64(n), "cpu-µs/conn")
	}
	b.Run("direct", func(b *testing.B) {
		cpu(b, func() {
			c, err := net.Dial("tcp", up)
			if err != nil {
				b.Fatal(err)
			}
			first(b, c)
			c.Close()
		})
	})
	b.Run("connect", func(b *testing.B) {
		cpu(b, func() {
			c, r := tunnel(b, hp, up)
			first(b, r)
			c.Close()
		})
	})
	b.Run("socks5", func(b *testing.B) {
		cpu(b, func() {
			c := socksTunnel(b, sp, up)
			first(b, c)
			c.Close()
		})
	})
	b.Run("policy-check", func(b *testing.B) {
		rules, _ := Policy{Mode: ModeProxy, Allow: strings.Split("pypi.org,*.pythonhosted.org,github.com:443,*.githubusercontent.com,registry.npmjs.org,10.0.0.0/8", ","),
			Deny: []string{"evil.pythonhosted.org"}}.Compile()
		for b.Loop() {
			if v := rules.CheckName("files.pythonhosted.org", 443); !v.Allowed {
				b.Fatal(v)
			}
		}
	})
}
