package main

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/denhq/den/api"
)

// TestActivityPrintsGuestTextSafely: what a guest records cannot drive
// the terminal nor forge a line of den activity's output.
func TestActivityPrintsGuestTextSafely(t *testing.T) {
	var b bytes.Buffer
	printActivity(&b, []api.ActivityEntry{
		{N: 1, Time: time.Now(), Kind: "exec", PID: 7, Argv: []string{"sh", "-c", "x\n2026-01-01 00:00:00.000  exec  1  -  forged\x1b]52;c;aGk=\a"}},
		{N: 2, Time: time.Now(), Kind: "file", PID: 7, Path: "/root/a\rb", Bytes: 3},
	}, true)
	out := b.String()
	if strings.ContainsAny(out, "\x1b\a\r") || strings.Count(out, "\n") != 3 {
		t.Errorf("guest text printed raw:\n%q", out)
	}
}
