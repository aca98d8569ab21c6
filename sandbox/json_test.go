package sandbox

import (
	"encoding/json"
	"errors"
	"testing"
)

func TestCommandErrorJSONRoundTrip(t *testing.T) {
	ce := &CommandError{Kind: KindOverflow, Message: "too much", Stdout: "out\x00", Stderr: "err", Cause: errors.New("hidden")}
	b, err := json.Marshal(ce)
	if err != nil {
		t.Fatal(err)
	}
	if want := `{"error":{"kind":"overflow","message":"too much","stdout":"out\u0000","stderr":"err"}}`; string(b) != want {
		t.Fatalf("json.Marshal(CommandError) = %s, want %s", b, want)
	}
	var back CommandError
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	if back.Kind != ce.Kind || back.Message != ce.Message || back.Stdout != ce.Stdout || back.Stderr != ce.Stderr || back.Cause != nil {
		t.Fatalf("round trip: %+v", back)
	}
	if err := json.Unmarshal([]byte(`{"error":{"message":"x"}}`), &back); err == nil {
		t.Fatal("a body without a kind decoded")
	}
}
