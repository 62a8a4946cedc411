package agent

import "time"

// Version of the agent protocol and binary; set at build time with
// -ldflags "-X github.com/denhq/den/agent.Version=...".
var Version = "0.1.0"

const (
	// Port is the vsock port the agent listens on.
	Port = 1024
	// SerialPortName is the name of the virtio-serial port the agent
	// serves (/sys/class/virtio-ports/vport*/name).
	SerialPortName = "org.den.agent"
	// EnvWorkdir, sent in an "env" request, is the working directory of
	// the session's command. The agent does not pass it on.
	EnvWorkdir = "DEN_WORKDIR"
	// EnvKeep, sent in an "env" request with the value 1, keeps the
	// session's command running when its channel or connection ends
	// (the client left, or the VM slept and its connections were reset):
	// no SIGHUP, and its output is read and dropped from then on. The
	// agent does not pass it on.
	EnvKeep = "DEN_KEEP"
	// EnvSession, sent in an "env" request, names the den session (who
	// ran it, through what) the command and its descendants belong to in
	// the activity record. The agent does not pass it on.
	EnvSession = "DEN_SESSION"
	// ExitSetupFailed is the exit status of a session whose command could
	// not be set up (unknown user, missing working directory, exec
	// failure); the reason is on stderr.
	ExitSetupFailed = 126
	// LeaseSocket is the agent's unix socket inside the guest for
	// keep-awake leases.
	LeaseSocket = "/run/den-agent.sock"
	// DefaultUser is the guest account the client logs in as.
	DefaultUser = "root"
)

// Control request names (SSH global requests).
const (
	ReqReady    = "den-ready@den"
	ReqClock    = "den-clock@den"
	ReqFreeze   = "den-freeze@den"
	ReqThaw     = "den-thaw@den"
	ReqIdentity = "den-identity@den"
	ReqActivity = "den-activity@den"
	ReqPoweroff = "den-poweroff@den"
	ReqGrowRoot = "den-growroot@den"
	ReqProcLog  = "den-proclog@den"
	// ReqKeyAgent (no payload) tells the agent that this connection
	// serves den's SSH secrets: the agent carries each connection to its
	// SSH agent socket (KeyAgentSocket) to den over a ChanKeyAgent
	// channel it opens on the newest such connection.
	ReqKeyAgent = "den-keyagent@den"
	// ReqSecrets (SecretsRequest) gives the agent the VM's HTTPS secrets'
	// placeholders, for every session's environment from then on, and
	// the CA den ends their TLS with, for the guest's trust store.
	ReqSecrets = "den-secrets@den"
)

// SecretsRequest is what a guest holds of den's HTTPS secrets.
type SecretsRequest struct {
	// Env are environment variables (NAME=den-secret:SECRET) every new
	// session gets, in place of the ones sent before.
	Env []string `json:"env"`
	// CA, if not empty, is a PEM certificate the guest's trust store
	// gets (in place of an earlier CA of den's).
	CA string `json:"ca,omitempty"`
}

// SecretsReply says where the CA went.
type SecretsReply struct {
	CAFile string `json:"ca_file,omitempty"`
}

// ProcLogRequest asks for the process events the agent recorded after
// sequence number After of its ring (0: from the oldest it holds), at
// most Max of them (0: the agent's own bound).
type ProcLogRequest struct {
	After uint64 `json:"after"`
	Max   int    `json:"max,omitempty"`
	// Record, "on" or "off", switches the record on or off first (until
	// the guest's next boot); "" leaves it as it is.
	Record string `json:"record,omitempty"`
}

// ProcLogReply is a page of the agent's process record.
type ProcLogReply struct {
	// Ring names the agent's record: a new one on every start of the
	// agent (a boot, a restart), the same after a memory snapshot is
	// restored. Sequence numbers count within it from 1.
	Ring string `json:"ring"`
	// Events are those after the request's After, oldest first.
	Events []ProcEvent `json:"events"`
	// Last is the sequence number of the newest event the agent holds
	// (0: none yet).
	Last uint64 `json:"last"`
	// Oldest is the sequence number of the oldest event it still holds:
	// events between After and Oldest were dropped by its bound.
	Oldest uint64 `json:"oldest"`
	// Paused says the record was switched off (ProcLogRequest.Record).
	Paused bool `json:"paused,omitempty"`
	// Off says the agent records nothing (no eBPF or BTF in the guest
	// kernel, or not allowed); Reason says why.
	Off    bool   `json:"off,omitempty"`
	Reason string `json:"reason,omitempty"`
}

// Process event kinds.
const (
	ProcExec = "exec"
	ProcExit = "exit"
	ProcFile = "file"
	// ProcConnect: a process connected a socket to an address outside
	// the guest.
	ProcConnect = "connect"
	// ProcLost: the guest's kernel dropped events (a ring the agent
	// reads was full).
	ProcLost = "lost"
)

// ProcEvent is one process started (exec) or ended (exit) in the guest,
// or a file it wrote (file).
type ProcEvent struct {
	Seq  uint64    `json:"seq"`
	Time time.Time `json:"time"`
	Kind string    `json:"kind"`
	PID  int       `json:"pid"`
	PPID int       `json:"ppid,omitempty"`
	UID  int       `json:"uid"`
	// Argv is the command line, cut to a bound (ArgvTruncated then).
	Argv          []string `json:"argv,omitempty"`
	ArgvTruncated bool     `json:"argv_truncated,omitempty"`
	// Session is the den session (EnvSession) the process descends from.
	Session string `json:"session,omitempty"`
	// Exit: the status, or the signal that ended it, and how long it ran
	// since its exec.
	Status   *int          `json:"status,omitempty"`
	Signal   string        `json:"signal,omitempty"`
	Duration time.Duration `json:"duration_ns,omitempty"`
	// File: the file closed after a write, its size then, and how many
	// such closes by the process within a moment the event stands for.
	Path   string `json:"path,omitempty"`
	Bytes  int64  `json:"bytes,omitempty"`
	Writes int    `json:"writes,omitempty"`
	// Connect: the address and port (ip:port), tcp or udp, and the
	// process's name as the kernel knows it.
	Addr  string `json:"addr,omitempty"`
	Proto string `json:"proto,omitempty"`
	Comm  string `json:"comm,omitempty"`
	// Lost: how many kernel records (forks, execs, exits, connections)
	// the guest's full rings refused since the last such event.
	Lost uint64 `json:"lost,omitempty"`
}

// ReadyRequest is the payload of ReqReady. An empty one (from an older
// den) asks for nothing more than ReadyInfo.
type ReadyRequest struct {
	// ClockUnixNano, when set, sets the guest's wall clock as ReqClock
	// does, in the same round trip: after a wake or a restore the guest
	// clock is stale, and every round trip to a guest just restored
	// costs 5-20 ms under TCG.
	ClockUnixNano int64 `json:"clock_unix_nano,omitempty"`
	// Identity, when set, gives the guest a new identity as ReqIdentity
	// does, after the clock, in the same round trip (a create from a
	// warm base, a fork).
	Identity *IdentityRequest `json:"identity,omitempty"`
}

// ReadyInfo is the reply to ReqReady.
type ReadyInfo struct {
	// Version is the agent's version.
	Version string `json:"version"`
	// BootID is /proc/sys/kernel/random/boot_id: it changes on reboot,
	// not on a snapshot restore.
	BootID string `json:"boot_id"`
	// Uptime is the time since the guest kernel booted (CLOCK_BOOTTIME).
	Uptime time.Duration `json:"uptime_ns"`
	// Time is the guest's wall clock when it answered.
	Time time.Time `json:"time"`
	// Hostname is the guest's hostname.
	Hostname string `json:"hostname"`
	// PID1 says the agent runs as init.
	PID1 bool `json:"pid1"`
	// Frozen says filesystems are frozen.
	Frozen bool `json:"frozen,omitempty"`
	// Clock is how a ReadyRequest's clock set the guest clock. It is nil
	// when none was asked, when the clock could not be set (ClockError
	// says why), and from an agent older than ReadyRequest.ClockUnixNano:
	// the caller then sends ReqClock.
	Clock *ClockReply `json:"clock,omitempty"`
	// ClockError is why the asked clock was not set.
	ClockError string `json:"clock_error,omitempty"`
	// Identity is the new identity a ReadyRequest asked for. It is nil
	// when none was asked, when it failed (IdentityError says why), and
	// from an agent older than ReadyRequest.Identity: the caller then
	// sends ReqIdentity.
	Identity *IdentityReply `json:"identity,omitempty"`
	// IdentityError is why the asked identity was not given.
	IdentityError string `json:"identity_error,omitempty"`
}

// ClockRequest sets the guest's wall clock.
type ClockRequest struct {
	UnixNano int64 `json:"unix_nano"`
}

// ClockReply says what the clock read before it was set.
type ClockReply struct {
	// Previous is the guest time just before the step.
	Previous time.Time `json:"previous"`
	// Step is the new time minus Previous.
	Step time.Duration `json:"step_ns"`
}

// FreezeRequest freezes the guest's filesystems until a thaw, or Timeout.
type FreezeRequest struct {
	TimeoutMS int64 `json:"timeout_ms"`
}

// FreezeReply lists the mount points frozen.
type FreezeReply struct {
	Frozen []string `json:"frozen"`
	// Until is when the agent thaws them by itself.
	Until time.Time `json:"until"`
}

// ThawReply lists the mount points thawed.
type ThawReply struct {
	Thawed []string `json:"thawed"`
}

// IdentityRequest gives a forked guest a new identity.
type IdentityRequest struct {
	// Hostname to set; empty keeps the current one.
	Hostname string `json:"hostname,omitempty"`
	// Entropy is random bytes from the host (at least MinEntropy) mixed
	// into the guest's kernel RNG, which is then reseeded.
	Entropy []byte `json:"entropy"`
	// MachineID, 32 lowercase hex digits, or empty for a random one.
	MachineID string `json:"machine_id,omitempty"`
	// Token is the VM's den.identity (32 lowercase hex digits), written
	// to /etc/den/identity so that a later cold boot with the same
	// den.identity keeps this identity; empty leaves the file alone (a
	// cold boot then makes yet another identity).
	Token string `json:"token,omitempty"`
	// MAC, when set, is the fork's own hardware address for the guest's
	// first network interface (the device state restored from its
	// source's memory holds the source's).
	MAC string `json:"mac,omitempty"`
	// Net, when set, is the VM's own network configuration for that
	// interface: the source's addresses are replaced by it (a fork and a
	// create from a warm base run with their source's until then).
	Net *NetConfig `json:"net,omitempty"`
}

// NetConfig is a guest's static network configuration, as den.ip=,
// den.gw= and den.dns= give it on the kernel command line.
type NetConfig struct {
	// IP is the address with its prefix ("10.200.0.6/30").
	IP string `json:"ip"`
	// GW is the default gateway, DNS the resolver.
	GW  string `json:"gw"`
	DNS string `json:"dns"`
}

// MinEntropy is the least number of random bytes in an IdentityRequest.
const MinEntropy = 32

// IdentityReply is the guest's new identity.
type IdentityReply struct {
	Hostname  string `json:"hostname"`
	MachineID string `json:"machine_id"`
	// HostKey is the agent's new SSH host key (authorized_keys format):
	// new connections see it; open ones keep the old.
	HostKey string `json:"host_key,omitempty"`
	// Steps is how long each step took in the guest, in order, for the
	// host's trace of the operation (den bench --breakdown).
	Steps []GuestStep `json:"steps,omitempty"`
}

// GuestStep is one timed step of a request in the guest.
type GuestStep struct {
	Name string  `json:"name"`
	MS   float64 `json:"ms"`
	// CPUMS is the agent's own CPU time (user and system) in the step:
	// close to MS when the step is the guest's own work, not a wait.
	CPUMS float64 `json:"cpu_ms,omitempty"`
}

// Activity is what the guest reports for the idle policy. The CPU
// counters are cumulative since boot: the host takes differences.
type Activity struct {
	Time time.Time `json:"time"`
	// CPUBusy is the CPU time spent not idle (not idle, not iowait),
	// summed over all CPUs, from /proc/stat.
	CPUBusy time.Duration `json:"cpu_busy_ns"`
	// CPUTotal is all CPU time, summed over all CPUs.
	CPUTotal time.Duration `json:"cpu_total_ns"`
	// AgentCPU is the CPU time of the agent's own process, which is in
	// CPUBusy: answering the host's activity requests among it (some
	// 100 ms of CPU each in a guest under TCG emulation), so that the
	// idle policy does not take its own probing for the guest's use.
	// Zero from an agent that does not report it.
	AgentCPU time.Duration `json:"agent_cpu_ns,omitempty"`
	// CPUs is the number of CPUs.
	CPUs int `json:"cpus"`
	// Load1 is the one-minute load average.
	Load1 float64 `json:"load1"`
	// ProcsRunning is the number of runnable tasks now.
	ProcsRunning int `json:"procs_running"`
	// Processes is the number of user-space processes (no kernel
	// threads); -1 while unknown (procfs reads hang on a stuck task).
	Processes int `json:"processes"`
	// TCPEstablished counts established TCP connections (IPv4 and IPv6);
	// TCPRemote counts those whose peer is not a loopback address.
	TCPEstablished int `json:"tcp_established"`
	TCPRemote      int `json:"tcp_remote"`
	// Sessions is the number of open SSH sessions on the agent (shell,
	// exec, sftp); Forwards the number of open direct-tcpip channels.
	Sessions int `json:"sessions"`
	Forwards int `json:"forwards"`
	// Leases are the keep-awake leases held in the guest.
	Leases []Lease `json:"leases,omitempty"`
}

// Held says whether a keep-awake lease is in force at t.
func (a Activity) Held(t time.Time) bool {
	for _, l := range a.Leases {
		if l.Until.IsZero() || l.Until.After(t) {
			return true
		}
	}
	return false
}

// Lease is a keep-awake lease taken with `den-agent hold`.
type Lease struct {
	Name string `json:"name"`
	// Until is when it ends; zero means until released.
	Until time.Time `json:"until,omitempty"`
}

// GrowRequest grows the guest's root filesystem to the size of its block
// device.
type GrowRequest struct {
	// MinDeviceBytes, when set, is the device size the host just gave the
	// disk: the agent waits (a few seconds at most) for the guest kernel
	// to see at least that much before it grows, and fails if it does not.
	MinDeviceBytes int64 `json:"min_device_bytes,omitempty"`
}

// GrowReply says what the grow did; OldBytes == NewBytes when the
// filesystem already filled its device.
type GrowReply struct {
	// Device is the root block device ("/dev/vda").
	Device string `json:"device"`
	// DeviceBytes is the device's size as the guest kernel sees it.
	DeviceBytes int64 `json:"device_bytes"`
	// OldBytes and NewBytes are the filesystem's size (block count times
	// block size, from its superblock) before and after. df shows a little
	// less: it leaves out the filesystem's own metadata.
	OldBytes int64 `json:"old_bytes"`
	NewBytes int64 `json:"new_bytes"`
}

// PoweroffRequest stops the guest.
type PoweroffRequest struct {
	Reboot bool `json:"reboot,omitempty"`
}

// WindowSize is a terminal size in characters.
type WindowSize struct {
	Rows int
	Cols int
}

// LeaseRequest is one request on LeaseSocket (one JSON object per line).
type LeaseRequest struct {
	// Op is "hold", "release" or "list".
	Op   string `json:"op"`
	Name string `json:"name,omitempty"`
	// ForMS is the lease duration; 0 holds until released.
	ForMS int64 `json:"for_ms,omitempty"`
}

// LeaseReply answers a LeaseRequest.
type LeaseReply struct {
	Error  string  `json:"error,omitempty"`
	Leases []Lease `json:"leases,omitempty"`
}

// ChanKeyAgent is the channel type the agent opens to den for one
// connection to KeyAgentSocket; on it den speaks the SSH agent protocol.
const ChanKeyAgent = "den-keyagent@den"

// KeyAgentSocket is the guest's SSH agent socket for den's SSH secrets:
// sessions get it as SSH_AUTH_SOCK (one with agent forwarding gets the
// forwarded agent instead).
const KeyAgentSocket = "/run/den-agent/ssh-agent.sock"
