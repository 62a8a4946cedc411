package cloudhypervisor

import (
	"encoding/json"
	"errors"
	"strconv"
	"strings"
	"testing"

	"github.com/denhq/den/vmm"
)

// Every error answer in the transcripts decodes into an *APIError that
// keeps the whole chain, and is classified as an invalid-state refusal
// exactly when it is one.
func TestAPIErrorsFromTranscripts(t *testing.T) {
	invalid := map[string]bool{
		"VM is not created":                        true,
		"VM config is missing":                     true,
		"VM is already created":                    true,
		"InvalidStateTransition(Running, Running)": true,
		"InvalidStateTransition(Paused, Paused)":   true,
		"Trying to snapshot while VM is running":   true,
	}
	n := 0
	for _, file := range []string{mainTranscript, snapTranscript} {
		es, err := loadTranscript(file)
		must(t, "load", err)
		for _, e := range es {
			if e.Status < 400 {
				continue
			}
			n++
			var chain []string
			must(t, "recorded chain", json.Unmarshal(e.RespBody, &chain))
			op := opName(strings.TrimPrefix(e.Path, apiBase))
			err := decodeAPIError(op, e.Status, e.RespBody)
			want := "ch " + op + ": " + strconv.Itoa(e.Status) + ": " + strings.Join(chain, ": ")
			if err.Error() != want {
				t.Errorf("line %d: %q, want %q", e.RecordedAt, err, want)
			}
			wantInvalid := false
			for k := range invalid {
				if strings.Contains(chain[len(chain)-1], k) {
					wantInvalid = true
				}
			}
			if got := errors.Is(err, vmm.ErrInvalidState); got != wantInvalid {
				t.Errorf("line %d: %q: invalid state %v, want %v", e.RecordedAt, err, got, wantInvalid)
			}
		}
	}
	if n < 10 {
		t.Errorf("only %d error answers in the transcripts", n)
	}
}

func TestAPIErrorOddBodies(t *testing.T) {
	if e := decodeAPIError("boot", 500, []byte("  plain text\n")); e.Error() != "ch boot: 500: plain text" {
		t.Errorf("text body: %q", e)
	}
	if e := decodeAPIError("boot", 503, nil); e.Error() != "ch boot: 503: Service Unavailable" {
		t.Errorf("empty body: %q", e)
	}
	if e := decodeAPIError("boot", 500, []byte(`[]`)); e.Error() != "ch boot: 500: []" {
		t.Errorf("empty chain: %q", e)
	}
}
