// Package utf8tail finds where a chunk of a byte stream stops in the
// middle of a UTF-8 sequence, so that a reader decoding the stream chunk by
// chunk holds those bytes back for the next chunk instead of replacing a
// character cut in two.
package utf8tail

import "unicode/utf8"

// Incomplete returns how many bytes at p's end begin a UTF-8 sequence that
// p ends before it is complete (0 to 3): bytes a later chunk may complete.
// A byte that can never begin a valid sequence is not held back.
func Incomplete(p []byte) int {
	for i := len(p) - 1; i >= 0 && i > len(p)-utf8.UTFMax; i-- {
		if utf8.RuneStart(p[i]) {
			if !utf8.FullRune(p[i:]) {
				return len(p) - i
			}
			return 0
		}
	}
	return 0
}
