package client

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
)

// ProcessOutput asks for base64 from the offset, decodes chunks to bytes,
// returns the last line, and reports an answer cut before it.
func TestProcessOutput(t *testing.T) {
	var query string
	body := `{"stream":"stdout","offset":5,"data":"//4="}` + "\n" + `{"stream":"stderr","offset":7,"data":"ZQ=="}` + "\n"
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		query = r.URL.RawQuery
		if r.URL.Path != "/v1/projects/3/processes/proc_x/output" {
			w.WriteHeader(404)
			_, _ = io.WriteString(w, `{"error":{"kind":"notFound","message":"no","stdout":"","stderr":""}}`)
			return
		}
		w.Header().Set("Content-Type", "application/x-ndjson")
		_, _ = io.WriteString(w, body)
	}))
	defer srv.Close()
	c, err := New(srv.URL, "t")
	if err != nil {
		t.Fatal(err)
	}
	var got []OutputChunk
	collect := func(ch OutputChunk) error { got = append(got, ch); return nil }
	if _, err := c.ProcessOutput(context.Background(), 3, "proc_x", OutputOptions{From: 5, Follow: true}, collect); !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Fatalf("cut answer: %v", err)
	}
	if query != "encoding=base64&follow=1&from=5" || len(got) != 2 || string(got[0].Data) != "\xff\xfe" || got[0].Offset != 5 || got[1].Stream != "stderr" || string(got[1].Data) != "e" {
		t.Fatalf("query %q, chunks %+v", query, got)
	}
	body += `{"offset":8,"state":"exited","exit":{"code":0,"signal":null},"error":null}` + "\n"
	end, err := c.ProcessOutput(context.Background(), 3, "proc_x", OutputOptions{}, collect)
	if err != nil || end.Offset != 8 || end.State != "exited" || end.Exit == nil || *end.Exit.Code != 0 || query != "encoding=base64&follow=0&from=0" {
		t.Fatalf("end %+v, %v, query %q", end, err, query)
	}
	if _, err := c.Process(context.Background(), 3, "gone"); !IsNotFound(err) {
		t.Fatalf("unknown process: %v", err)
	}
}
