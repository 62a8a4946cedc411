//go:build linux

package guest

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/denhq/den/agent"
	"github.com/denhq/den/internal/fsutil"
)

// newIdentity reseeds the RNG first (everything after must differ between
// forks), then writes a new machine-id and sets the hostname.
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
	if s.freeze.isFrozen() {
		return agent.IdentityReply{}, errors.New("identity: filesystems are frozen")
	}
	if err := s.sys.Reseed(req.Entropy); err != nil {
		return agent.IdentityReply{}, fmt.Errorf("identity: %w", err)
	}
	id := req.MachineID
	if id == "" {
		var b [16]byte
		if _, err := rand.Read(b[:]); err != nil {
			return agent.IdentityReply{}, fmt.Errorf("identity: machine id: %w", err)
		}
		id = hex.EncodeToString(b[:])
	}
	etc := s.sys.EtcDir
	if err := fsutil.WriteFileAtomic(filepath.Join(etc, "machine-id"), []byte(id+"\n"), 0o444); err != nil {
		return agent.IdentityReply{}, fmt.Errorf("identity: %w", err)
	}
	// D-Bus keeps its own copy on older systems.
	if dbus := filepath.Join(etc, "../var/lib/dbus/machine-id"); etc == "/etc" {
		if st, err := os.Lstat(dbus); err == nil && st.Mode().IsRegular() {
			if err := fsutil.WriteFileAtomic(dbus, []byte(id+"\n"), 0o444); err != nil {
				s.log.Warn("new identity", "err", err)
			}
		}
	}
	host := hostname()
	if req.Hostname != "" {
		if err := s.setHostname(req.Hostname); err != nil {
			return agent.IdentityReply{}, fmt.Errorf("identity: %w", err)
		}
		host = req.Hostname
	}
	s.log.Info("new identity", "hostname", host, "machine_id", id)
	return agent.IdentityReply{Hostname: host, MachineID: id}, nil
}

// setHostname sets the kernel hostname and writes etc/hostname, and
// renames the old name in etc/hosts.
func (s *Server) setHostname(name string) error {
	old := hostname()
	if err := s.sys.SetHostname(name); err != nil {
		return fmt.Errorf("set hostname: %w", err)
	}
	etc := s.sys.EtcDir
	if err := fsutil.WriteFileAtomic(filepath.Join(etc, "hostname"), []byte(name+"\n"), 0o644); err != nil {
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
		fs := strings.Fields(l)
		if len(fs) < 2 || strings.HasPrefix(fs[0], "#") {
			continue
		}
		for j := 1; j < len(fs); j++ {
			if fs[j] == old || strings.HasPrefix(fs[j], old+".") {
				fs[j] = name + strings.TrimPrefix(fs[j], old)
				changed = true
			}
		}
		lines[i] = strings.Join(fs, "\t")
	}
	if changed {
		if err := fsutil.WriteFileAtomic(hostsPath, []byte(strings.Join(lines, "\n")), 0o644); err != nil {
			return fmt.Errorf("set hostname: %w", err)
		}
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
