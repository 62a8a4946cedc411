package api

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// serve answers the client's requests with h on a unix socket.
func serve(t *testing.T, h http.HandlerFunc) *Client {
	t.Helper()
	dir, err := os.MkdirTemp("", "den-client-") // short: a unix socket lives in it
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	socket := filepath.Join(dir, "den.sock")
	ln, err := net.Listen("unix", socket)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { srv.Close() })
	return NewClient(socket)
}

// streamOf answers a stream of lines.
func streamOf(lines ...string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/x-ndjson")
		w.WriteHeader(http.StatusOK)
		for _, l := range lines {
			_, _ = io.WriteString(w, l+"\n")
		}
	}
}

func TestStreamResults(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cases := []struct {
		name     string
		h        http.HandlerFunc
		status   int
		code     string
		is       error
		message  string
		progress int // lines passed on
	}{
		{"error before the stream", func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusNotFound)
			_, _ = io.WriteString(w, `{"error":"no vm named \"ghost\": not found","code":"not_found"}`)
		}, 404, "not_found", ErrNotFound, `no vm named "ghost"`, 0},
		{"error that ends the stream", streamOf(`{"progress":"cloning"}`, `{"error":"restore vm \"box\" to cp-1: qemu died","code":"internal","done":true}`),
			500, "internal", ErrDaemon, `qemu died`, 1},
		{"error with a code the client does not know", streamOf(`{"progress":"cloning"}`, `{"error":"over budget","code":"from_the_future","done":true}`),
			500, "from_the_future", ErrDaemon, `over budget`, 1},
		{"a stream cut short", streamOf(`{"progress":"cloning"}`, `{"progress":"restoring"}`),
			500, "internal", ErrDaemon, `ended before its final result`, 2},
		{"an empty stream", streamOf(), 500, "internal", ErrDaemon, `ended before its final result`, 0},
		{"a final line without a vm", streamOf(`{"done":true}`), 500, "internal", ErrDaemon, `has no vm`, 0},
	}
	for _, c := range cases {
		var progress []string
		_, err := serve(t, c.h).Restore(ctx, "box", RestoreRequest{Checkpoint: "cp-1"}, func(ev Event) { progress = append(progress, ev.Progress) })
		var ae *Error
		if !errors.As(err, &ae) || ae.Status != c.status || ae.Code != c.code || !errors.Is(err, c.is) || !strings.Contains(err.Error(), c.message) {
			t.Errorf("%s: %#v, want status %d, code %s, %q", c.name, err, c.status, c.code, c.message)
		}
		if len(progress) != c.progress {
			t.Errorf("%s: progress %q, want %d lines", c.name, progress, c.progress)
		}
	}

	// A final line with the vm is the result.
	vm, err := serve(t, streamOf(`{"progress":"restoring"}`, `{"vm":{"name":"box","state":"running"},"done":true}`)).
		Restore(ctx, "box", RestoreRequest{Checkpoint: "cp-1"}, nil)
	if err != nil || vm.Name != "box" || vm.State != "running" {
		t.Fatalf("restore: %+v %v", vm, err)
	}
}
