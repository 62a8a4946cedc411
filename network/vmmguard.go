package network

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"strings"
)

// The VMM guard: under QEMU's user-mode network (slirp) a guest's
// connection to 10.0.2.2 becomes a connection the QEMU process makes to
// the host's 127.0.0.1, so every service bound to the host's loopback
// (or any of its addresses) would be the guest's to reach. VMMs run as
// their own user: a table of its own drops, on output, that user's
// packets to any local address (fib daddr type local: 127.0.0.0/8, ::1
// and the host's own addresses) except DNS, which slirp forwards to the
// host's resolver.

// guardTable is the name of the guard table of VMM user uid (family
// inet): one per user, shared by the daemons whose VMMs run as it.
func guardTable(uid int) string { return fmt.Sprintf("den_vmm_u%d", uid) }

// guardScript makes the guard table anew for uid, in one transaction.
func guardScript(uid int) string {
	t := guardTable(uid)
	return fmt.Sprintf(`table inet %[1]s {}
delete table inet %[1]s
table inet %[1]s {
	chain output {
		type filter hook output priority filter; policy accept;
		meta skuid %[2]d fib daddr type local meta l4proto { tcp, udp } th dport 53 accept
		meta skuid %[2]d fib daddr type local meta l4proto tcp reject with tcp reset
		meta skuid %[2]d fib daddr type local drop
	}
}
`, t, uid)
}

// ErrNoNft is returned where nft is not installed.
var ErrNoNft = errors.New("nft is not installed: the VMM user's access to host services cannot be cut (apt-get install nftables)")

// GuardVMMUser installs (or renews) the guard table of VMM user uid.
func GuardVMMUser(ctx context.Context, uid int) error {
	if _, err := exec.LookPath("nft"); err != nil {
		return ErrNoNft
	}
	t := table{name: guardTable(uid)}
	if err := t.run(ctx, guardScript(uid)); err != nil {
		return fmt.Errorf("guard the host from vmm user %d: %w", uid, err)
	}
	return nil
}

// VMMGuarded reports whether the guard table of VMM user uid is in
// place, for den doctor; the error says why not.
func VMMGuarded(ctx context.Context, uid int) (bool, error) {
	if _, err := exec.LookPath("nft"); err != nil {
		return false, ErrNoNft
	}
	out, err := table{name: guardTable(uid)}.list(ctx, "table", "inet", guardTable(uid))
	if err != nil {
		return false, fmt.Errorf("vmm guard table %s: %w", guardTable(uid), err)
	}
	return strings.Contains(string(out), "skuid"), nil
}

// RemoveVMMGuard deletes the guard table of VMM user uid.
func RemoveVMMGuard(ctx context.Context, uid int) error {
	t := table{name: guardTable(uid)}
	return t.run(ctx, fmt.Sprintf("table inet %[1]s {}\ndelete table inet %[1]s\n", t.name))
}
