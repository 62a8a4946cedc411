// Package api is den's HTTP+JSON API over the daemon's unix socket: the
// wire types and the Go client that the CLI uses and that agent frameworks
// can import. docs/api.md describes the endpoints; openapi.yaml (OpenAPI,
// in openapi.go) describes them for generating clients.
package api

import (
	"errors"
	"time"
)

// DefaultSocket is where the daemon listens unless told otherwise; the
// CLI also reads $DEN_SOCKET.
const DefaultSocket = "/run/den/den.sock"

// Defaults the daemon gives a VM created without them (the zero fields of
// CreateRequest). They mirror machine's DefaultCPUs, DefaultMemory,
// DefaultDisk and DefaultIdleTimeout, which are the ones applied; these
// are for clients to show.
const (
	DefaultCPUs        = 1
	DefaultMemory      = 512 << 20
	DefaultDisk        = 4 << 30
	DefaultIdleTimeout = 10 * time.Minute
)

// VM is a VM as the API shows it.
type VM struct {
	Name  string `json:"name"`
	Owner string `json:"owner"`
	// Cgroup is the running VMM's cgroup (nil: not running, or no
	// cgroups).
	Cgroup      *Cgroup `json:"cgroup,omitempty"`
	State       string  `json:"state"` // creating, running, stopped, sleeping, lost, deleting
	Reason      string  `json:"reason,omitempty"`
	Image       string  `json:"image"`
	CPUs        int     `json:"cpus"`
	MemoryBytes int64   `json:"memory_bytes"`
	DiskBytes   int64   `json:"disk_bytes"`
	DiskUsed    int64   `json:"disk_used_bytes"`
	// DiskUsedPending: the disk's use is being measured, and
	// disk_used_bytes is the last figure (0: none yet); a listing waits
	// only so long for the measures.
	DiskUsedPending bool   `json:"disk_used_pending,omitempty"`
	VMM             string `json:"vmm"`
	Accel           string `json:"accel"`
	PID             int    `json:"pid,omitempty"`
	// Host is the cluster host the VM runs on (none on a host of its
	// own).
	Host        string    `json:"host,omitempty"`
	IdleTimeout string    `json:"idle_timeout"`
	CreatedAt   time.Time `json:"created_at"`
	LastActive  time.Time `json:"last_active"`
	// Operation is what holds the VM now (checkpoint, sleep, restore
	// cp-3...), for OperationFor ("12s"); empty when nothing does.
	Operation    string `json:"operation,omitempty"`
	OperationFor string `json:"operation_for,omitempty"`
	// Generation counts the writes of the VM's record.
	Generation int64 `json:"generation"`
	// Network is how the VM reaches the network ("tap", "user" or
	// "none"), IP its address with prefix, Egress its egress policy.
	Network string `json:"network,omitempty"`
	IP      string `json:"ip,omitempty"`
	Egress  string `json:"egress,omitempty"`
}

// CreateRequest asks for a new VM. Zero fields take the daemon's defaults.
type CreateRequest struct {
	Name        string `json:"name"`
	Owner       string `json:"owner,omitempty"`
	Image       string `json:"image,omitempty"`
	CPUs        int    `json:"cpus,omitempty"`
	MemoryBytes int64  `json:"memory_bytes,omitempty"`
	DiskBytes   int64  `json:"disk_bytes,omitempty"`
	// IdleTimeout is a Go duration ("10m"); "0" never sleeps.
	IdleTimeout string `json:"idle_timeout,omitempty"`
	// Cold boots instead of restoring the image's warm base snapshot.
	Cold bool `json:"cold,omitempty"`
	// Egress is the VM's egress policy: allow-all, deny-all,
	// allow:LIST (CIDRs and domain names) or deny:LIST (CIDRs, then
	// optionally ;allow:LIST); empty takes the daemon's
	// default.
	Egress string `json:"egress,omitempty"`
	// OnHostLoss is what a cluster does with the VM when the host that
	// runs it is lost: "wait" (the default: it is recorded stopped, and
	// waits for a person) or "restart" (the host that takes it over
	// boots it from its disk).
	OnHostLoss string `json:"on_host_loss,omitempty"`
}

// Event is one line of a streamed long operation: progress lines, then
// exactly one final line (Done) that carries the result (VM or
// Checkpoint) or Error and its Code. A stream that ends without a final
// line was cut short: the client cannot know how the operation ended.
type Event struct {
	Progress   string      `json:"progress,omitempty"`
	Elapsed    string      `json:"elapsed,omitempty"`
	VM         *VM         `json:"vm,omitempty"`
	Checkpoint *Checkpoint `json:"checkpoint,omitempty"`
	// Verified is the final result of a checkpoint verification.
	Verified []Verification `json:"verified,omitempty"`
	// Diff is the final result of a diff.
	Diff *Diff `json:"diff,omitempty"`
	// PathsRestored is the final result of a paths restore.
	PathsRestored *PathsRestored `json:"paths_restored,omitempty"`
	// Saved is, in a restore's final line, the checkpoint that holds the
	// state before it ("" with no_save).
	Saved string `json:"saved,omitempty"`
	Error string `json:"error,omitempty"`
	Code  string `json:"code,omitempty"`
	// Done marks the final line.
	Done bool `json:"done,omitempty"`
}

// ErrorBody is the body of every non-2xx answer.
type ErrorBody struct {
	Error string `json:"error"`
	// Code names the kind: a key of Codes (not_found, exists, invalid,
	// conflict, busy, no_space, internal...).
	Code string `json:"code"`
}

// DaemonInfo describes the daemon and its host.
type DaemonInfo struct {
	Version   string `json:"version"`
	VMM       string `json:"vmm"`
	Accel     string `json:"accel"`
	AccelNote string `json:"accel_note,omitempty"`
	StateDir  string `json:"state_dir"`
	Volume    string `json:"volume"`
	Network   string `json:"network"`
	// GuestRAM says where guest RAM lives (a tmpfs, for QEMU's RAM files).
	GuestRAM string `json:"guest_ram,omitempty"`
	// Gateway is the SSH gateway's address ("" when it is off);
	// GatewayFingerprint its host key's SHA256 fingerprint.
	Gateway            string `json:"gateway,omitempty"`
	GatewayFingerprint string `json:"gateway_fingerprint,omitempty"`
	// Confinement says how VMMs are confined here.
	Confinement *Confinement `json:"confinement,omitempty"`
	// API is the TLS listener's address ("" when off); APIFingerprint
	// the SHA-256 of its certificate (hex).
	API            string `json:"api,omitempty"`
	APIFingerprint string `json:"api_fingerprint,omitempty"`
	// Memory is the memory budget and its use now (host.go).
	Memory *MemoryInfo `json:"memory,omitempty"`
	// HTTP is the base URL of the VMs' HTTP URLs ("" when off);
	// HTTPDomain routes "<vm>.<domain>" there.
	// E2B is the base URL of E2B's API (--e2b-listen), if on.
	E2B        string `json:"e2b,omitempty"`
	HTTP       string `json:"http,omitempty"`
	HTTPDomain string `json:"http_domain,omitempty"`
}

// Confinement is how the daemon confines VMMs (den doctor shows it).
type Confinement struct {
	// User is the unprivileged user VMMs run as ("" : they run as root,
	// and Missing says why).
	User    string `json:"user,omitempty"`
	Missing string `json:"missing,omitempty"`
	// CgroupVersion is 1 or 2 (0: VMMs get no cgroup of their own).
	CgroupVersion int `json:"cgroup_version"`
	// Guarded: the VMM user's packets to the host's own addresses are
	// dropped (QEMU's user-mode network cannot reach host services).
	Guarded bool `json:"guarded"`
}

// Cgroup is a running VM's cgroup: its limits and its use now.
type Cgroup struct {
	Name          string  `json:"name"`
	Version       int     `json:"version"`
	MemoryMax     int64   `json:"memory_max,omitempty"`
	CPUQuota      float64 `json:"cpu_quota,omitempty"`
	PidsMax       int64   `json:"pids_max,omitempty"`
	IOWeight      int     `json:"io_weight,omitempty"`
	MemoryCurrent int64   `json:"memory_current"`
	CPUSeconds    float64 `json:"cpu_seconds"`
	PidsCurrent   int64   `json:"pids_current"`
}

// Errors a client can test for with errors.Is; the daemon maps its
// errors onto HTTP status codes and the client maps them back.
var (
	ErrNotFound = errors.New("not found")
	ErrExists   = errors.New("already exists")
	ErrInvalid  = errors.New("invalid request")
	ErrConflict = errors.New("conflicts with the vm's state")
	ErrNoSpace  = errors.New("no space")
	ErrBusy     = errors.New("vm busy")
	// ErrForbidden: the request is an admin's (the host's sleep and
	// wake, other users' tokens).
	ErrForbidden = errors.New("forbidden")
	// ErrUnauthenticated: the connection proves no den user (an unknown
	// uid, a missing, wrong or revoked token).
	ErrUnauthenticated = errors.New("unauthenticated")
	// ErrDamaged: a checkpoint or a sleeping VM's memory does not match
	// its digests; nothing was restored from it.
	ErrDamaged  = errors.New("snapshot damaged")
	ErrDaemon   = errors.New("daemon error")
	ErrNoDaemon = errors.New("daemon not reachable")
)

// Codes maps ErrorBody.Code to the errors above and their HTTP status.
var Codes = map[string]struct {
	Err    error
	Status int
}{
	"not_found":       {ErrNotFound, 404},
	"exists":          {ErrExists, 409},
	"invalid":         {ErrInvalid, 400},
	"conflict":        {ErrConflict, 409},
	"no_space":        {ErrNoSpace, 507},
	"busy":            {ErrBusy, 409},
	"damaged":         {ErrDamaged, 409},
	"forbidden":       {ErrForbidden, 403},
	"unauthenticated": {ErrUnauthenticated, 401},
	"no_memory":       {ErrNoMemory, 507},
	"internal":        {ErrDaemon, 500},
}

// Error is an error answer of the daemon: a non-2xx answer, or the
// error that ended a stream.
type Error struct {
	// Status is the answer's HTTP status; for the error that ended a
	// stream (which began with 200), the status of its Code.
	Status  int
	Code    string
	Message string
}

func (e *Error) Error() string { return e.Message }

// Unwrap gives the sentinel of e's code, for errors.Is.
func (e *Error) Unwrap() error {
	if c, ok := Codes[e.Code]; ok {
		return c.Err
	}
	return ErrDaemon
}
