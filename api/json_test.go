package api

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"strings"
	"testing"
)

// pinnedBody is the pinned error body as encoding/json writes it.
type pinnedBody struct {
	Error struct {
		Kind    string `json:"kind"`
		Message string `json:"message"`
		Stdout  string `json:"stdout"`
		Stderr  string `json:"stderr"`
		Reason  string `json:"reason,omitempty"`
	} `json:"error"`
}

func stdlibJSON(t testing.TB, v any, escapeHTML bool) []byte {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(escapeHTML)
	if err := enc.Encode(v); err != nil {
		t.Fatal(err)
	}
	return bytes.TrimSuffix(buf.Bytes(), []byte("\n"))
}

// checkJSONCompatible asserts that the streamed forms are what
// encoding/json writes, with and without HTML escaping.
func checkJSONCompatible(t testing.TB, s string) {
	var want pinnedBody
	want.Error.Kind, want.Error.Message, want.Error.Stdout, want.Error.Stderr = "overflow", s, s+"x", "<"+s
	body := ErrorBody{Kind: "overflow", Message: s, Stdout: s + "x", Stderr: "<" + s}
	code := 3
	res := CommandResult{Stdout: s, Stderr: s, Code: &code}
	for _, html := range []bool{true, false} {
		var got bytes.Buffer
		if err := body.WriteJSON(&got, html); err != nil {
			t.Fatal(err)
		}
		if w := stdlibJSON(t, want, html); !bytes.Equal(got.Bytes(), w) {
			t.Fatalf("error body (html %v) of %q:\n got %s\nwant %s", html, s, got.Bytes(), w)
		}
	}
	// CommandResult.MarshalJSON escapes HTML whatever the encoder says.
	var got bytes.Buffer
	if err := res.WriteJSON(&got, true); err != nil {
		t.Fatal(err)
	}
	for _, html := range []bool{true, false} {
		if w := stdlibJSON(t, res, html); !bytes.Equal(got.Bytes(), w) {
			t.Fatalf("result (html %v) of %q:\n got %s\nwant %s", html, s, got.Bytes(), w)
		}
	}
	// The base64 forms are the plain forms of base64 copies.
	b64 := func(s string) string { return base64.StdEncoding.EncodeToString([]byte(s)) }
	body64 := body
	body64.Stdout, body64.Stderr = b64(body.Stdout), b64(body.Stderr)
	res64 := res
	res64.Stdout, res64.Stderr = b64(res.Stdout), b64(res.Stderr)
	for _, html := range []bool{true, false} {
		var got, want bytes.Buffer
		_ = body.WriteJSONBase64(&got, html)
		_ = body64.WriteJSON(&want, html)
		if !bytes.Equal(got.Bytes(), want.Bytes()) {
			t.Fatalf("base64 error body (html %v) of %q:\n got %s\nwant %s", html, s, got.Bytes(), want.Bytes())
		}
		got.Reset()
		want.Reset()
		_ = res.WriteJSONBase64(&got, html)
		_ = res64.WriteJSON(&want, html)
		if !bytes.Equal(got.Bytes(), want.Bytes()) {
			t.Fatalf("base64 result (html %v) of %q:\n got %s\nwant %s", html, s, got.Bytes(), want.Bytes())
		}
	}
}

func TestJSONMatchesEncodingJSON(t *testing.T) {
	for _, s := range []string{
		"", "plain", "\x00\x01\x1f\x7f", "\b\f\n\r\t\"\\/", "<a href='x'>&amp;</a>",
		"\u2028\u2029", "é漢字🙂", "\xff\xfe bad \xc3", "mixed \x00 <\u2028> \xe2\x80",
		strings.Repeat("\xffab<", 3000) + "c",
	} {
		checkJSONCompatible(t, s)
	}
	for _, sig := range []CommandResult{{Signal: "SIGKILL"}, {Signal: "SIGKILL", OOMKilled: true}, {Code: new(int), OOMKilled: true}} {
		var got bytes.Buffer
		_ = sig.WriteJSON(&got, true)
		if w := stdlibJSON(t, sig, true); !bytes.Equal(got.Bytes(), w) {
			t.Fatalf("signal result: got %s want %s", got.Bytes(), w)
		}
	}
}

func FuzzJSONMatchesEncodingJSON(f *testing.F) {
	f.Add("a\x00<\u2028\xff")
	f.Fuzz(func(t *testing.T, s string) { checkJSONCompatible(t, s) })
}
