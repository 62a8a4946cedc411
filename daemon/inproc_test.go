package daemon

import (
	"context"
	"testing"

	"github.com/denhq/den/api"
)

// TestInProcessSSH: the SSH upgrade works over an in-process connection,
// as den@ exec uses it.
func TestInProcessSSH(t *testing.T) {
	e := newAPIEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	alice := e.asCaller(Caller{User: "alice", Source: "test"})
	if _, err := alice.CreateVM(ctx, api.CreateRequest{Name: "abox", MemoryBytes: 128 << 20, DiskBytes: imageSize, IdleTimeout: "0", Cold: true}, nil); err != nil {
		t.Fatal(err)
	}
	sc, err := alice.SSH(ctx, "abox")
	if err != nil {
		t.Fatal(err)
	}
	defer sc.Close()
	s, err := sc.NewSession()
	if err != nil {
		t.Fatal(err)
	}
	if out, err := s.CombinedOutput("echo hi"); err != nil || string(out) != "hi\n" {
		t.Fatalf("exec over an in-process connection: %q %v", out, err)
	}
}
