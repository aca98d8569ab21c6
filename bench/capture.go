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
// socketpair and copies the near end to io.Discard: the transport alone.
func bareCapture(size int64) (time.Duration, error) {
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
	n, cerr := io.CopyBuffer(io.Discard, near, make([]byte, captureBlock))
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

// managedCapture runs the producer in the warm machine through RunCommand
// with a stdout limit above size: the whole result, decoded and sanitized.
func managedCapture(ctx context.Context, cr *corral, size int64) (time.Duration, error) {
	a := cr.alice
	t0 := time.Now()
	res, err := cr.ctl.RunCommand(ctx, input(cr.managed, producer(size)...), &a, &sandbox.RunOptions{
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

// measureCapture alternates the bare copy and the managed capture.
func measureCapture(ctx context.Context, cr *corral, size int64, samples int) []captureRow {
	bare := captureRow{name: "bare socketpair copy (dd → io.Discard)"}
	managed := captureRow{name: "corral managed RunCommand (dd, limit > size)"}
	if cr == nil || cr.w == nil {
		managed.skip = "no worker"
	}
	mbps := func(d time.Duration) float64 { return float64(size) / d.Seconds() / 1e6 }
	for range samples {
		if d, err := bareCapture(size); err != nil {
			bare.failure = err
		} else {
			bare.mbps = append(bare.mbps, mbps(d))
		}
		if managed.skip == "" {
			if d, err := managedCapture(ctx, cr, size); err != nil {
				managed.failure = err
			} else {
				managed.mbps = append(managed.mbps, mbps(d))
			}
			// Give the gigabyte back before the next sample.
			runtime.GC()
			debug.FreeOSMemory()
		}
	}
	return []captureRow{bare, managed}
}
