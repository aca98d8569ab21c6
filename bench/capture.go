package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime"
	"runtime/debug"
	"strconv"
	"syscall"
	"time"

	"github.com/corral-sandbox/corral/sandbox"
	"github.com/corral-sandbox/corral/store"
)

// captureRow is the throughput of one way to capture a command's output.
type captureRow struct {
	name    string
	mbps    []float64 // one per sample, 10^6 bytes per second
	skip    string
	failure error
}

const captureBlock = 64 << 10

// producer writes size zero bytes to stdout in 64 KiB writes.
func producer(size int64) []string {
	return []string{"dd", "if=/dev/zero", "bs=" + strconv.Itoa(captureBlock),
		"count=" + strconv.FormatInt(size/captureBlock, 10), "status=none"}
}

// bareCapture runs the producer on the host with its stdout on a
// socketpair and copies the near end to io.Discard (into, nil) or reads it
// into into (a buffer of the final size): the transport alone, and the
// transport plus the memory a returned result must touch.
func bareCapture(size int64, into []byte) (time.Duration, error) {
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		return 0, err
	}
	near, far := os.NewFile(uintptr(fds[0]), "near"), os.NewFile(uintptr(fds[1]), "far")
	defer near.Close()
	argv := producer(size)
	t0 := time.Now()
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stdout = far
	err = cmd.Start()
	far.Close()
	if err != nil {
		return 0, err
	}
	var n int64
	var cerr error
	if into == nil {
		n, cerr = io.CopyBuffer(io.Discard, near, make([]byte, captureBlock))
	} else {
		var m int
		m, cerr = io.ReadFull(near, into)
		n = int64(m)
		if cerr == nil {
			var one [1]byte
			if k, _ := near.Read(one[:]); k > 0 {
				cerr = errors.New("more output than expected")
			}
		}
	}
	werr := cmd.Wait()
	d := time.Since(t0)
	if err := errors.Join(cerr, werr); err != nil {
		return 0, err
	}
	if n != size {
		return 0, fmt.Errorf("copied %d of %d bytes", n, size)
	}
	return d, nil
}

// corralCapture runs the producer in project p through RunCommand with a
// stdout limit above size: the whole result, decoded and sanitized.
func corralCapture(ctx context.Context, cr *corral, p store.Project, actor sandbox.Actor, size int64) (time.Duration, error) {
	t0 := time.Now()
	res, err := cr.ctl.RunCommand(ctx, input(p, producer(size)...), &actor, &sandbox.RunOptions{
		Timeout:     5 * time.Minute,
		OutputLimit: sandbox.OutputLimit{Stdout: size + 1<<20},
	})
	d := time.Since(t0)
	if err != nil {
		return 0, err
	}
	if res.Code == nil || *res.Code != 0 || int64(len(res.Stdout)) != size {
		return 0, fmt.Errorf("captured %d of %d bytes, code %v", len(res.Stdout), size, res.Code)
	}
	return d, nil
}

// Capture row names.
const (
	capBare    = "bare socketpair copy (dd → io.Discard): the floor"
	capBareBuf = "bare socketpair read into a buffer of the final size (fresh memory)"
	capManaged = "corral managed RunCommand (dd, limit > size)"
	capHost    = "corral host RunCommand, direct (dd, limit > size)"
)

// measureCapture alternates the bare copies and the captures, one sample
// of each per round.
func measureCapture(ctx context.Context, cr *corral, workerSkip string, size int64, samples int) []captureRow {
	rows := []captureRow{{name: capBare}, {name: capBareBuf}, {name: capManaged, skip: workerSkip}, {name: capHost}}
	mbps := func(d time.Duration) float64 { return float64(size) / d.Seconds() / 1e6 }
	runs := []func() (time.Duration, error){
		func() (time.Duration, error) { return bareCapture(size, nil) },
		func() (time.Duration, error) { return bareCapture(size, make([]byte, size)) },
		func() (time.Duration, error) { return corralCapture(ctx, cr, cr.managed, cr.alice, size) },
		func() (time.Duration, error) { return corralCapture(ctx, cr, cr.host, cr.bob, size) },
	}
	for range samples {
		for i, run := range runs {
			if rows[i].skip != "" {
				continue
			}
			if d, err := run(); err != nil {
				rows[i].failure = err
			} else {
				rows[i].mbps = append(rows[i].mbps, mbps(d))
			}
			// Give the gigabyte back before the next sample.
			runtime.GC()
			debug.FreeOSMemory()
		}
	}
	return rows
}
