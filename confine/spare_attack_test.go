package confine

import (
	"os"
	"sync"
	"testing"

	"golang.org/x/sys/unix"
)

// TestSpareInitNeverShared: commands starting at once, some finding the
// spare init being made and waiting for it (one waiter per spare), never
// get the same init or pid namespace: a tree shared by two commands, of
// two tenants maybe, would let one see, signal or trace the other's
// processes. Each gets an init of its own, alive.
func TestSpareInitNeverShared(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root (pid namespaces)")
	}
	if _, err := Available(); err != nil {
		t.Skip(err)
	}
	const n = 12
	type got struct {
		tree *Tree
		ns   uint64
		err  error
	}
	res := make([]got, n)
	for round := range 3 {
		var wg sync.WaitGroup
		for i := range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				tree, nsfd, err := takeInit("")
				if err != nil {
					res[i] = got{err: err}
					return
				}
				var st unix.Stat_t
				err = unix.Fstat(nsfd, &st)
				unix.Close(nsfd)
				res[i] = got{tree: tree, ns: st.Ino, err: err}
			}()
		}
		wg.Wait()
		pids, nss := map[int]bool{}, map[uint64]bool{}
		for i, r := range res {
			if r.err != nil {
				t.Fatalf("round %d, command %d: %v", round, i, r.err)
			}
			pid := r.tree.init.Pid
			if pids[pid] || nss[r.ns] {
				t.Fatalf("round %d: two commands got init %d / pid namespace %d", round, pid, r.ns)
			}
			pids[pid], nss[r.ns] = true, true
			select {
			case <-r.tree.Done():
				t.Fatalf("round %d: command %d got an init that had exited", round, i)
			default:
			}
		}
		for _, r := range res {
			_ = r.tree.Kill()
			<-r.tree.Done()
		}
	}
}
