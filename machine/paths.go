package machine

import (
	"path/filepath"

	"github.com/denhq/den/vmm"
)

// StateDir is den's local state directory (default /var/lib/den): the
// state database, keys, VM runtime directories and the volume's local
// parts. VM disks and snapshots live on the volume, not here.
type StateDir string

// Path is the directory itself.
func (s StateDir) Path() string { return string(s) }

// DB is the SQLite state database.
func (s StateDir) DB() string { return filepath.Join(string(s), "den.db") }

// HostKey is the daemon's private key, the one guest agents accept.
func (s StateDir) HostKey() string { return filepath.Join(string(s), "keys", "host_ed25519") }

// GatewayKey is the SSH gateway's host key.
func (s StateDir) GatewayKey() string { return filepath.Join(string(s), "keys", "gateway_ed25519") }

// APICert and APIKey are the TLS certificate and key of the API's TCP
// listener when the daemon made them itself (self-signed).
func (s StateDir) APICert() string { return filepath.Join(string(s), "keys", "api.crt") }
func (s StateDir) APIKey() string  { return filepath.Join(string(s), "keys", "api.key") }

// E2BCert and E2BKey are the TLS certificate and key of a non-loopback
// E2B listener when the daemon made them itself (self-signed, with the
// sandboxes' host names).
func (s StateDir) E2BCert() string { return filepath.Join(string(s), "keys", "e2b.crt") }
func (s StateDir) E2BKey() string  { return filepath.Join(string(s), "keys", "e2b.key") }

// MemoryCopies holds local copies of snapshots' memory (memcopy.go), a
// directory per VM.
func (s StateDir) MemoryCopies() string { return filepath.Join(string(s), "memory") }

// Secrets holds den's secrets, encrypted (package secrets), and
// SecretsKey the key they are encrypted with.
func (s StateDir) Secrets() string    { return filepath.Join(string(s), "secrets") }
func (s StateDir) SecretsKey() string { return filepath.Join(string(s), "keys", "secrets.key") }

// Audit is the directory of the audit log.
func (s StateDir) Audit() string { return filepath.Join(string(s), "audit") }

// Runs holds the VMMs' runtime directories.
func (s StateDir) Runs() string { return filepath.Join(string(s), "run") }

// Run is the runtime directory of one VM's VMM (sockets, logs, RAM file).
func (s StateDir) Run(vm string) vmm.RunDir { return vmm.RunDir(filepath.Join(s.Runs(), vm)) }

// DaemonLock is held by the one daemon using this state dir, for its
// whole life.
func (s StateDir) DaemonLock() string { return filepath.Join(string(s), "daemon.lock") }

// Lock is the lock file of one VM.
func (s StateDir) Lock(vm string) string { return filepath.Join(string(s), "locks", vm+".lock") }

// VolumeState holds the volume's local parts: JuiceFS cache, metadata,
// mount point and, for the embedded default, its object store.
func (s StateDir) RAM() string { return filepath.Join(string(s), "ram") }

// VolumeState is where the storage volume keeps its local state.
func (s StateDir) VolumeState() string { return filepath.Join(string(s), "juicefs") }

// Fence is the fence file of a cluster host: the deadline until which
// its VMMs may run without a lease renewal (package fence).
func (s StateDir) Fence() string { return filepath.Join(string(s), "fence.json") }

// FenceLock is held by the fence guard of this state dir.
func (s StateDir) FenceLock() string { return filepath.Join(string(s), "fence.lock") }

// FenceLog is the fence guard's log.
func (s StateDir) FenceLog() string { return filepath.Join(string(s), "fence.log") }

// UsageFile is where an earlier den kept the disks' measured use (the
// registry keeps it now: usage.go); a start removes it.
func (s StateDir) UsageFile() string { return filepath.Join(string(s), "usage.json") }

// Takeover marks a VM whose lease this cluster host took over from a
// lost host while the takeover's work on it is not done: it names that
// host (a crash in the middle leaves it for the next lock of the VM).
func (s StateDir) Takeover(vm string) string { return filepath.Join(string(s), "takeovers", vm) }

// Instance is this state dir's daemon instance id (a cluster tells apart
// daemons that give the same host name by it).
func (s StateDir) Instance() string { return filepath.Join(string(s), "instance") }
