package mcpserver

import (
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/corral-sandbox/corral/internal/utf8tail"
)

// The tools' limits, in one place; each tool's description quotes those it
// applies. Bounds of the account (commands and processes at once, machine
// limits, the daemon's own caps) apply besides: the tools call the same
// API.
const (
	// DefaultRunTimeout and MaxRunTimeout bound run_command.
	DefaultRunTimeout = time.Minute
	MaxRunTimeout     = 10 * time.Minute
	// RunOutputLimit is what run_command lets a command write to each
	// stream; writing more ends it (an "overflow" error with the output
	// so far).
	RunOutputLimit = 1 << 20
	// ResultText is the most text of one stream (run_command), of a file
	// page (read_file) or of process output (read_process_output) a
	// result carries by default; MaxResultText is the most a call may
	// ask for with max_bytes.
	ResultText    = 32 << 10
	MaxResultText = 256 << 10
	// MaxWrite is the most write_file writes (decoded), and the most
	// stdin run_command sends.
	MaxWrite = 1 << 20
	// DefaultListEntries and MaxListEntries bound list_files.
	DefaultListEntries = 500
	MaxListEntries     = 5000
	// MaxWait bounds how long read_process_output waits for output.
	MaxWait = 30 * time.Second
	// MaxRequest is the most bytes of one HTTP request to the daemon's
	// MCP handler (enough for MaxWrite bytes in base64).
	MaxRequest = 2 << 20
)

// PageArgs say which page of a file or of output to read.
type PageArgs struct {
	Offset   int64 `json:"offset,omitempty" jsonschema:"the offset of the first byte to read, in bytes from the start (default 0); pass the next_offset of the previous read to continue"`
	MaxBytes int   `json:"max_bytes,omitempty" jsonschema:"the most bytes to return"`
}

// Page is where a page of a file or of output lies, and how to read on.
type Page struct {
	Offset     int64  `json:"offset" jsonschema:"the offset of the page's first byte"`
	NextOffset int64  `json:"next_offset" jsonschema:"the offset to read from next"`
	More       bool   `json:"more" jsonschema:"more is there to read after next_offset"`
	Note       string `json:"note,omitempty" jsonschema:"how to read what was not returned"`
}

// size writes n bytes as a person would: "32 KiB", "1 MiB".
func size(n int) string {
	switch {
	case n >= 1<<20 && n%(1<<20) == 0:
		return fmt.Sprintf("%d MiB", n>>20)
	case n >= 1<<10 && n%(1<<10) == 0:
		return fmt.Sprintf("%d KiB", n>>10)
	}
	return fmt.Sprintf("%d bytes", n)
}

// pageSize returns the page a call asked for with max_bytes (0: the
// default).
func pageSize(maxBytes int) (int, error) {
	switch {
	case maxBytes == 0:
		return ResultText, nil
	case maxBytes < 0 || maxBytes > MaxResultText:
		return 0, fmt.Errorf("max_bytes %d is not between 1 and %d", maxBytes, MaxResultText)
	}
	return maxBytes, nil
}

// headTail returns s whole if it has at most limit bytes; otherwise its
// first and last limit/2 bytes (cut at character boundaries) around a
// marker that says how many bytes were cut, where, and how to read them
// (readRest).
func headTail(s string, limit int, what, readRest string) (string, bool) {
	if len(s) <= limit {
		return s, false
	}
	h := limit / 2
	h -= utf8tail.Incomplete([]byte(s[:h]))
	t := len(s) - (limit - limit/2)
	for t < len(s) && !utf8.RuneStart(s[t]) {
		t++
	}
	var b strings.Builder
	b.Grow(h + len(s) - t + 200)
	b.WriteString(s[:h])
	fmt.Fprintf(&b, "\n[corral: %d bytes of %s cut here (bytes %d to %d of %d); %s]\n", t-h, what, h, t, len(s), readRest)
	b.WriteString(s[t:])
	return b.String(), true
}

// page returns the longest prefix of p of at most limit bytes that does not
// end inside a UTF-8 character (unless the character is longer than
// limit).
func page(p []byte, limit int) []byte {
	if len(p) <= limit {
		return p
	}
	q := p[:limit]
	if n := utf8tail.Incomplete(q); n < len(q) {
		q = q[:len(q)-n]
	}
	return q
}
