package wire

import "testing"

// turnFrames are the five frames of one command's life, as core sends and
// the worker answers them.
func turnFrames() []Message {
	code := 0
	id := "0b9f6a0e-6a43-4f4e-9e4c-1f2a3b4c5d6e"
	return []Message{
		&ExecStart{ID: id, Project: Project{ID: 12, Workspace: "/srv/corral/projects/12"}, Account: 3,
			Lease: "1c8e7b2d-6a43-4f4e-9e4c-1f2a3b4c5d6f", Argv: []string{"git", "status", "--porcelain=v2"},
			Cwd: "/workspace", Env: map[string]string{"PATH": "/usr/bin:/bin", "HOME": "/home/corral", "LANG": "C.UTF-8"}},
		&ExecAttach{ID: id},
		&ExecAccepted{ID: id},
		&ExecStarted{ID: id},
		&ExecExit{ID: id, Code: &code},
	}
}

// BenchmarkEncodeTurn encodes the five frames of a command.
func BenchmarkEncodeTurn(b *testing.B) {
	ms := turnFrames()
	b.ReportAllocs()
	for b.Loop() {
		for _, m := range ms {
			if _, err := Encode(m); err != nil {
				b.Fatal(err)
			}
		}
	}
}

// BenchmarkDecodeTurn decodes the five frames of a command.
func BenchmarkDecodeTurn(b *testing.B) {
	var frames [][]byte
	var nfds []int
	for _, m := range turnFrames() {
		f, err := Encode(m)
		if err != nil {
			b.Fatal(err)
		}
		frames, nfds = append(frames, f), append(nfds, FDCount(m))
	}
	b.ReportAllocs()
	for b.Loop() {
		for i, f := range frames {
			if _, err := Decode(f, nfds[i]); err != nil {
				b.Fatal(err)
			}
		}
	}
}
