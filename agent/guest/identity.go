//go:build linux

package guest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/denhq/den/agent"
	"github.com/denhq/den/internal/atomicfile"
	gossh "golang.org/x/crypto/ssh"
	"golang.org/x/sys/unix"
)

// A guest's identity is its hostname, machine-id, SSH host keys and random
// state: every VM, forks included, must have its own. A running fork gets
// one from the NewIdentity control request; a cold boot gets one when the
// kernel command line's den.identity (a token new for every VM) differs
// from the token recorded in IdentityPath. The initramfs
// (image/init-initramfs.sh) does that before the root's init starts, with
// the same steps as ApplyBootIdentity, which the agent runs when it is init
// and the initramfs did not.

// IdentityPath records the den.identity the guest's identity was made for.
const IdentityPath = "/etc/den/identity"

// ErrReadOnlyRoot says a new identity cannot be written: the root
// filesystem is read-only.
var ErrReadOnlyRoot = errors.New("read-only root filesystem")

// sshKeygenTimeout bounds regenerating OpenSSH's host keys (RSA under TCG
// takes seconds).
const sshKeygenTimeout = 2 * time.Minute

// ReadIdentityToken returns the token recorded in root's etc/den/identity,
// or "" if there is none.
func ReadIdentityToken(root string) string {
	data, err := os.ReadFile(filepath.Join(root, IdentityPath))
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(data))
}

// ValidIdentityToken says whether s is a den.identity token: 32 lowercase
// hex digits.
func ValidIdentityToken(s string) bool { return validMachineID(s) }

// ApplyBootIdentity gives the root filesystem at root (the guest's "/"
// when it boots) a new identity unless token, the boot's den.identity, is
// the one recorded in etc/den/identity: hostname (etc/hostname, and the
// old name renamed in etc/hosts; empty or invalid keeps it), a new machine-id
// (etc/machine-id, and var/lib/dbus/machine-id when it is a file of its
// own), the agent's SSH host key removed (the agent makes a new one when
// it starts), OpenSSH's host keys removed (regenerated with ssh-keygen -A
// when an OpenSSH server is installed), and systemd's saved random seed
// removed. The token is recorded last, and only when every step worked:
// a failed step is tried again at the next boot. It reports whether it
// made a new identity; it does not set the kernel's hostname.
//
// It must run before anything in the guest reads the old identity: in the
// initramfs, or by the agent as init before it serves.
func ApplyBootIdentity(ctx context.Context, root, token, hostname string) (bool, error) {
	if !ValidIdentityToken(token) {
		return false, fmt.Errorf("boot identity: invalid den.identity %q (want 32 lowercase hex digits)", token)
	}
	if !validHostname(hostname) {
		hostname = "" // as the initramfs does: the rest of the identity matters more
	}
	if ReadIdentityToken(root) == token {
		return false, nil
	}
	etc := filepath.Join(root, "etc")
	if err := unix.Access(etc, unix.W_OK); errors.Is(err, unix.EROFS) {
		return false, fmt.Errorf("boot identity: %w", ErrReadOnlyRoot)
	}
	var errs []error
	if hostname != "" {
		old := ""
		if data, err := os.ReadFile(filepath.Join(etc, "hostname")); err == nil {
			old, _, _ = strings.Cut(strings.TrimSpace(string(data)), "\n")
		}
		if err := writeHostnameFiles(etc, old, hostname); err != nil {
			errs = append(errs, err)
		}
	}
	if _, err := writeMachineID(etc, ""); err != nil {
		errs = append(errs, err)
	}
	if err := removeGlob(filepath.Join(etc, "den"), filepath.Base(HostKeyPath)+"*"); err != nil {
		errs = append(errs, err)
	}
	kctx, cancel := context.WithTimeout(ctx, sshKeygenTimeout)
	defer cancel()
	if err := resetSSHHostKeys(kctx, root); err != nil {
		errs = append(errs, err)
	}
	if err := removeRandomSeed(root); err != nil {
		errs = append(errs, err)
	}
	if len(errs) == 0 {
		errs = append(errs, syncRoot(root)) // the identity is on disk before its token
	}
	if err := errors.Join(errs...); err != nil {
		return true, fmt.Errorf("boot identity: %w (token not recorded: the next boot tries again)", err)
	}
	if err := writeIdentityToken(root, token); err != nil {
		return true, fmt.Errorf("boot identity: %w", err)
	}
	if err := syncRoot(root); err != nil {
		return true, fmt.Errorf("boot identity: %w", err)
	}
	return true, nil
}

// newIdentity gives a running guest a new identity. It reseeds the RNG
// first (everything after must differ between forks), then writes a new
// machine-id, sets the hostname, replaces the agent's SSH host key
// (served to new connections at once), removes or regenerates OpenSSH's
// host keys and systemd's saved random seed, and records the token.
func (s *Server) newIdentity(req agent.IdentityRequest) (agent.IdentityReply, error) {
	if len(req.Entropy) < agent.MinEntropy {
		return agent.IdentityReply{}, fmt.Errorf("identity: need at least %d bytes of entropy, got %d", agent.MinEntropy, len(req.Entropy))
	}
	if req.Hostname != "" && !validHostname(req.Hostname) {
		return agent.IdentityReply{}, fmt.Errorf("identity: invalid hostname %q", req.Hostname)
	}
	if req.MachineID != "" && !validMachineID(req.MachineID) {
		return agent.IdentityReply{}, fmt.Errorf("identity: invalid machine id %q (want 32 lowercase hex digits)", req.MachineID)
	}
	if req.Token != "" && !ValidIdentityToken(req.Token) {
		return agent.IdentityReply{}, fmt.Errorf("identity: invalid token %q (want 32 lowercase hex digits)", req.Token)
	}
	var mac net.HardwareAddr
	if req.MAC != "" {
		var err error
		if mac, err = net.ParseMAC(req.MAC); err != nil || len(mac) != 6 {
			return agent.IdentityReply{}, fmt.Errorf("identity: invalid mac %q", req.MAC)
		}
		if s.sys.SetMAC == nil {
			return agent.IdentityReply{}, errors.New("identity: this guest cannot set its mac")
		}
	}
	if req.Net != nil {
		if err := checkNet(*req.Net); err != nil {
			return agent.IdentityReply{}, fmt.Errorf("identity: %w", err)
		}
		if s.sys.SetNet == nil {
			return agent.IdentityReply{}, errors.New("identity: this guest cannot set its network")
		}
	}
	if s.freeze.isFrozen() {
		return agent.IdentityReply{}, errors.New("identity: filesystems are frozen")
	}
	var steps []agent.GuestStep
	last, lastCPU := time.Now(), processCPU()
	step := func(name string) {
		now, cpu := time.Now(), processCPU()
		steps = append(steps, agent.GuestStep{Name: name, MS: ms(now.Sub(last)), CPUMS: ms(cpu - lastCPU)})
		last, lastCPU = now, cpu
	}
	if err := s.sys.Reseed(req.Entropy); err != nil {
		return agent.IdentityReply{}, fmt.Errorf("identity: %w", err)
	}
	step("reseed")
	etc := s.sys.EtcDir
	root := filepath.Dir(etc)
	id, err := writeMachineID(etc, req.MachineID)
	if err != nil {
		return agent.IdentityReply{}, fmt.Errorf("identity: %w", err)
	}
	step("machine-id")
	host := hostname()
	if req.Hostname != "" {
		if err := s.setHostname(req.Hostname); err != nil {
			return agent.IdentityReply{}, fmt.Errorf("identity: %w", err)
		}
		host = req.Hostname
		step("hostname")
	}
	if mac != nil {
		if err := s.sys.SetMAC(primaryInterface, mac); err != nil {
			return agent.IdentityReply{}, fmt.Errorf("identity: %w", err)
		}
		step("mac")
	}
	if req.Net != nil {
		if err := s.sys.SetNet(primaryInterface, *req.Net); err != nil {
			return agent.IdentityReply{}, fmt.Errorf("identity: %w", err)
		}
		step("network")
	}
	key, err := s.rotateHostKey()
	if err != nil {
		return agent.IdentityReply{}, fmt.Errorf("identity: %w", err)
	}
	step("agent host key")
	ctx, cancel := context.WithTimeout(context.Background(), sshKeygenTimeout)
	defer cancel()
	if err := resetSSHHostKeys(ctx, root); err != nil {
		return agent.IdentityReply{}, fmt.Errorf("identity: %w", err)
	}
	if err := removeRandomSeed(root); err != nil {
		return agent.IdentityReply{}, fmt.Errorf("identity: %w", err)
	}
	step("openssh keys, random seed")
	// Written without a sync each, the files are made durable together,
	// before the token that says they are there.
	if err := syncRoot(root); err != nil {
		return agent.IdentityReply{}, fmt.Errorf("identity: %w", err)
	}
	step("sync")
	// The token, after them, is not synced: the guest's writeback, a
	// checkpoint's freeze or a sleep's memory keep it. Lost to a host
	// crash within seconds, it only makes the next cold boot give the VM
	// yet another identity (ApplyBootIdentity), never keep a half-written one;
	// its sync cost a create 20-35 ms under TCG.
	if req.Token != "" {
		if err := writeIdentityToken(root, req.Token); err != nil {
			return agent.IdentityReply{}, fmt.Errorf("identity: %w", err)
		}
		step("token")
	}
	pub := strings.TrimSpace(string(gossh.MarshalAuthorizedKey(key.PublicKey())))
	s.log.Info("new identity", "hostname", host, "machine_id", id, "host_key", gossh.FingerprintSHA256(key.PublicKey()), "token", req.Token)
	return agent.IdentityReply{Hostname: host, MachineID: id, HostKey: pub, Steps: steps}, nil
}

// processCPU is the CPU time (user and system) the agent has used, 0 if
// it cannot be read.
func processCPU() time.Duration {
	var ru unix.Rusage
	if unix.Getrusage(unix.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// checkNet refuses a network configuration that is not an IPv4 address
// with its prefix, a gateway and a resolver.
func checkNet(c agent.NetConfig) error {
	p, err := netip.ParsePrefix(c.IP)
	if err != nil || !p.Addr().Is4() {
		return fmt.Errorf("invalid network address %q (want ADDR/PREFIX)", c.IP)
	}
	for _, a := range []string{c.GW, c.DNS} {
		if ip, err := netip.ParseAddr(a); err != nil || !ip.Is4() {
			return fmt.Errorf("invalid gateway or resolver %q", a)
		}
	}
	return nil
}

// primaryInterface is the guest's first network interface, the one a
// new identity's MAC and network are for.
const primaryInterface = "eth0"

// setHostname sets the kernel hostname and writes etc/hostname, and
// renames the old name in etc/hosts.
func (s *Server) setHostname(name string) error {
	old := hostname()
	if err := s.sys.SetHostname(name); err != nil {
		return fmt.Errorf("set hostname: %w", err)
	}
	return writeHostnameFiles(s.sys.EtcDir, old, name)
}

// writeHostnameFiles writes name to etc/hostname and renames old (and
// old.domain) to name in etc/hosts.
func writeHostnameFiles(etc, old, name string) error {
	if err := atomicfile.Replace(filepath.Join(etc, "hostname"), []byte(name+"\n"), 0o644); err != nil {
		return fmt.Errorf("set hostname: %w", err)
	}
	hostsPath := filepath.Join(etc, "hosts")
	data, err := os.ReadFile(hostsPath)
	if err != nil || old == "" || old == name {
		return nil
	}
	lines := strings.Split(string(data), "\n")
	changed := false
	for i, l := range lines {
		body, comment, hasComment := strings.Cut(l, "#")
		fs := strings.Fields(body)
		if len(fs) < 2 {
			continue
		}
		lineChanged := false
		for j := 1; j < len(fs); j++ {
			if fs[j] == old || strings.HasPrefix(fs[j], old+".") {
				fs[j] = name + strings.TrimPrefix(fs[j], old)
				lineChanged = true
			}
		}
		if lineChanged {
			lines[i] = strings.Join(fs, "\t")
			if hasComment {
				lines[i] += "\t#" + comment
			}
			changed = true
		}
	}
	if changed {
		if err := atomicfile.Replace(hostsPath, []byte(strings.Join(lines, "\n")), 0o644); err != nil {
			return fmt.Errorf("set hostname: %w", err)
		}
	}
	return nil
}

// writeMachineID writes id (a random one if empty) to etc/machine-id, and
// to var/lib/dbus/machine-id beside etc when that is a file of its own
// (older D-Bus keeps a copy; Debian links it to /etc/machine-id).
func writeMachineID(etc, id string) (string, error) {
	if id == "" {
		var b [16]byte
		if _, err := rand.Read(b[:]); err != nil {
			return "", fmt.Errorf("machine id: %w", err)
		}
		id = hex.EncodeToString(b[:])
	}
	if err := atomicfile.Replace(filepath.Join(etc, "machine-id"), []byte(id+"\n"), 0o444); err != nil {
		return "", fmt.Errorf("machine id: %w", err)
	}
	dbus := filepath.Join(filepath.Dir(etc), "var/lib/dbus/machine-id")
	if st, err := os.Lstat(dbus); err == nil && st.Mode().IsRegular() {
		if err := atomicfile.Replace(dbus, []byte(id+"\n"), 0o444); err != nil {
			return "", fmt.Errorf("machine id: %w", err)
		}
	}
	return id, nil
}

// resetSSHHostKeys removes OpenSSH's host keys (etc/ssh/ssh_host_*_key and
// their .pub) under root; when there were some and an OpenSSH server is
// installed, it makes new ones with the root's ssh-keygen -A, which sshd
// needs to start.
func resetSSHHostKeys(ctx context.Context, root string) error {
	dir := filepath.Join(root, "etc/ssh")
	matches, _ := filepath.Glob(filepath.Join(dir, "ssh_host_*_key*"))
	if len(matches) == 0 {
		return nil
	}
	if err := removeGlob(dir, "ssh_host_*_key*"); err != nil {
		return err
	}
	keygen := filepath.Join(root, "usr/bin/ssh-keygen")
	if _, err := os.Stat(filepath.Join(root, "usr/sbin/sshd")); err != nil {
		return nil
	}
	if _, err := os.Stat(keygen); err != nil {
		return nil
	}
	args := []string{"-A"}
	if filepath.Clean(root) != "/" {
		args = append(args, "-f", root)
	}
	if out, err := exec.CommandContext(ctx, keygen, args...).CombinedOutput(); err != nil {
		return fmt.Errorf("ssh-keygen -A: %w: %s", err, strings.TrimSpace(string(out)))
	}
	return nil
}

// removeRandomSeed removes systemd's saved random seed, which a fork
// would otherwise share with its source.
func removeRandomSeed(root string) error {
	p := filepath.Join(root, "var/lib/systemd/random-seed")
	if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("remove random seed: %w", err)
	}
	return nil
}

// writeIdentityToken records token in root's etc/den/identity.
func writeIdentityToken(root, token string) error {
	p := filepath.Join(root, IdentityPath)
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		return fmt.Errorf("record identity: %w", err)
	}
	if err := atomicfile.Replace(p, []byte(token+"\n"), 0o644); err != nil {
		return fmt.Errorf("record identity: %w", err)
	}
	return nil
}

// removeGlob removes the files in dir that match pattern.
func removeGlob(dir, pattern string) error {
	matches, err := filepath.Glob(filepath.Join(dir, pattern))
	if err != nil {
		return fmt.Errorf("remove %s: %w", filepath.Join(dir, pattern), err)
	}
	var errs []error
	for _, m := range matches {
		if err := os.Remove(m); err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("remove %s: %w", filepath.Join(dir, pattern), errors.Join(errs...))
	}
	return nil
}

// syncRoot makes what was written under root durable: its filesystem is
// synced once, rather than each file and directory (every sync is a
// flush of the VM's disk, some 20 ms through the volume here).
func syncRoot(root string) error {
	f, err := os.Open(root)
	if err != nil {
		return fmt.Errorf("sync %s: %w", root, err)
	}
	defer f.Close()
	if err := unix.Syncfs(int(f.Fd())); err != nil {
		return fmt.Errorf("sync %s: %w", root, err)
	}
	return nil
}

func validHostname(h string) bool {
	if len(h) == 0 || len(h) > 64 {
		return false
	}
	for _, label := range strings.Split(h, ".") {
		if label == "" || len(label) > 63 || label[0] == '-' || label[len(label)-1] == '-' {
			return false
		}
		for _, r := range label {
			if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-') {
				return false
			}
		}
	}
	return true
}

func validMachineID(id string) bool {
	if len(id) != 32 {
		return false
	}
	for _, r := range id {
		if !strings.ContainsRune("0123456789abcdef", r) {
			return false
		}
	}
	return true
}
