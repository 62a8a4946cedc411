package vmm

import "path/filepath"

// RunDir is a VM's runtime directory on a local filesystem: the VMM's
// sockets, PID file and logs. Keep it short: unix socket paths are limited
// to 107 bytes.
type RunDir string

// Path is the directory itself.
func (d RunDir) Path() string { return string(d) }

// Name is the runtime directory's base name: its VM's (runtime) name.
func (d RunDir) Name() string { return filepath.Base(string(d)) }

// APISocket is the VMM's control socket (CH REST API or QEMU QMP).
func (d RunDir) APISocket() string { return filepath.Join(string(d), "api.sock") }

// PIDFile records the VMM process for adoption after a restart.
func (d RunDir) PIDFile() string { return filepath.Join(string(d), "vmm.pid") }

// Log is the VMM process's stdout and stderr.
func (d RunDir) Log() string { return filepath.Join(string(d), "vmm.log") }

// ConsoleLog is the guest's serial console output.
func (d RunDir) ConsoleLog() string { return filepath.Join(string(d), "console.log") }

// VsockSocket is Cloud Hypervisor's hybrid vsock unix socket.
func (d RunDir) VsockSocket() string { return filepath.Join(string(d), "vsock.sock") }

// AgentSocket is the unix socket behind QEMU's virtio-serial agent port.
func (d RunDir) AgentSocket() string { return filepath.Join(string(d), "agent.sock") }

// MemoryFile is the guest RAM backing file of a VMM that keeps memory in
// a file (QEMU's memory-backend-file).
func (d RunDir) MemoryFile() string { return filepath.Join(string(d), "memory") }

// ConfigFile is the VM config the driver was created with (JSON).
func (d RunDir) ConfigFile() string { return filepath.Join(string(d), "config.json") }
