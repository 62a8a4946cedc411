//go:build linux

package sysinit

import (
	"errors"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

var errSkip = errors.New("skip")

// TestConfigureNetwork configures lo in a new network namespace, entered
// by one locked thread that dies with its goroutine.
func TestConfigureNetwork(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("needs root for a network namespace")
	}
	resolv := filepath.Join(t.TempDir(), "resolv.conf")
	errc := make(chan error, 1)
	var addrs, routes string
	go func() {
		runtime.LockOSThread() // never unlocked: the thread is discarded
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			errc <- errors.Join(errSkip, err)
			return
		}
		err := ConfigureNetwork(slog.New(slog.DiscardHandler), NetConfig{
			Interface: "lo", IP: "10.77.0.2/24", GW: "10.77.0.1",
			DNS: []string{"10.77.0.53"}, ResolvConf: resolv,
		})
		if ifi, e := net.InterfaceByName("lo"); e == nil {
			as, _ := ifi.Addrs()
			for _, a := range as {
				addrs += a.String() + " "
			}
			if ifi.Flags&net.FlagUp == 0 {
				err = errors.Join(err, errors.New("lo is not up"))
			}
		}
		data, _ := os.ReadFile("/proc/thread-self/net/route")
		routes = string(data)
		errc <- err
	}()
	err := <-errc
	if errors.Is(err, errSkip) {
		t.Skipf("no network namespace: %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(addrs, "10.77.0.2/24") {
		t.Errorf("addresses %q", addrs)
	}
	// Default route (destination 0) via 10.77.0.1, little-endian hex.
	if !strings.Contains(routes, "\t00000000\t01004D0A\t") {
		t.Errorf("no default route via 10.77.0.1:\n%s", routes)
	}
	if data, _ := os.ReadFile(resolv); string(data) != "nameserver 10.77.0.53\n" {
		t.Errorf("resolv.conf %q", data)
	}
}
