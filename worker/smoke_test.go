package worker

import "testing"

func TestSmoke(t *testing.T) {
	h := newHarness(t, nil)
	c := h.dial(t)
	p := h.project(t, 1)
	r := h.run(t, c, p, "sh", "-c", "id; hostname; ls -l /proc/self/fd; cat /proc/net/dev; touch /x; echo hi > /workspace/f; ls -la /workspace /home/corral; mount")
	t.Log(r)
}
