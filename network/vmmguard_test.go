package network

import (
	"context"
	"fmt"
	"net"
	"os/exec"
	"syscall"
	"testing"

	"github.com/denhq/den/internal/testutil"
)

// TestVMMGuard: with the guard table in place a process of the VMM user
// cannot connect to a service on the host's loopback; root still can.
func TestVMMGuard(t *testing.T) {
	testutil.NeedRoot(t, "nftables")
	if _, err := exec.LookPath("nft"); err != nil {
		t.Skip("nft is not installed")
	}
	const nobody = 65534
	ctx := context.Background()
	if err := GuardVMMUser(ctx, nobody); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = RemoveVMMGuard(ctx, nobody) })
	if ok, err := VMMGuarded(ctx, nobody); !ok || err != nil {
		t.Fatalf("guarded %v, %v", ok, err)
	}
	// Twice is fine (a daemon restart).
	if err := GuardVMMUser(ctx, nobody); err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	connect := func(uid uint32) error {
		cmd := exec.Command("/bin/bash", "-c", "exec 3<>/dev/tcp/127.0.0.1/"+fmt.Sprint(l.Addr().(*net.TCPAddr).Port))
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uid, Gid: uid}}
		return cmd.Run()
	}
	if err := connect(nobody); err == nil {
		t.Fatal("the vmm user reached the host's loopback")
	}
	if err := connect(0); err != nil {
		t.Fatalf("root cannot reach the loopback: %v", err)
	}
	if err := RemoveVMMGuard(ctx, nobody); err != nil {
		t.Fatal(err)
	}
	if ok, _ := VMMGuarded(ctx, nobody); ok {
		t.Fatal("guard still reported after removal")
	}
}
