package daemon

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/denhq/den/agent"
	"github.com/denhq/den/api"
	"github.com/denhq/den/audit"
	"github.com/denhq/den/idle"
	"github.com/denhq/den/image"
	"github.com/denhq/den/internal/phase"
	"github.com/denhq/den/machine"
	"github.com/denhq/den/secrets"
	"github.com/denhq/den/storage"
	"github.com/denhq/den/users"
)

// Options configures a daemon.
type Options struct {
	// StateDir is den's local state (default /var/lib/den).
	StateDir string
	// Socket is the API's unix socket (default api.DefaultSocket).
	Socket string
	// VolumeConfig is a storage config file (JSON); empty uses the
	// embedded volume under the state dir.
	VolumeConfig string
	// ClusterConfig is a cluster config file (cluster.Config): the
	// registry is the cluster's PostgreSQL database and the volume its
	// shared one. Empty: one host, with SQLite and VolumeConfig's volume.
	ClusterConfig string
	// HostName is this host's name in the registry's host records
	// (default: the machine's hostname; a cluster config's host), and
	// HostAddress where other hosts reach it (a cluster config's).
	HostName, HostAddress string
	// Lease is how long a heartbeat keeps the host alive (default
	// DefaultLease).
	Lease time.Duration
	// Images is the guest image directory.
	Images image.Dir
	// DefaultImage is the root filesystem of VMs created without one.
	DefaultImage string
	// VMM forces a VMM; empty chooses.
	VMM string
	// Version is den's version, reported by /v1/info.
	Version string
	// QEMUStreamRAM and RestoreCopy are comparison knobs for den bench
	// (see machine.Config).
	QEMUStreamRAM, RestoreCopy bool
	// NoDigests: snapshots without digests (den bench compares).
	NoDigests bool
	// MemoryFiles: snapshots' memory in files of their own, not by
	// content (den bench compares); CollectGrace: how long the memory
	// store keeps unreferenced packs.
	MemoryFiles  bool
	CollectGrace time.Duration
	// RAMDir: where guest RAM files go ("": a tmpfs in the state dir).
	RAMDir string
	// MemoryCopies bounds the local copies of snapshots' memory (see
	// machine.Config).
	MemoryCopies int64
	// ActivityCap bounds each VM's activity record (0: the default);
	// ActivityPull is how often running VMs' guest records are read (see
	// machine.Config).
	ActivityCap  int64
	ActivityPull time.Duration
	// IdleCheck is how often the idle monitor looks at the VMs
	// (default 5 s).
	IdleCheck time.Duration
	// MaxWakes bounds the VMs woken or booted at once (0: the default;
	// see machine.Config).
	MaxWakes int
	// SSHListen is the SSH gateway's address (host:port); "" or "off"
	// runs no gateway.
	SSHListen string
	// Memory is the memory budget and the pressure watcher.
	Memory machine.MemoryConfig
	// Network is how VMs reach the network (TAP and egress).
	Network machine.NetworkConfig
	// HTTPListen serves each VM's HTTP port at a URL (host:port; ""
	// or "off": none); HTTPDomain routes "<vm>.<domain>" by Host
	// header; TLSCert and TLSKey make it HTTPS.
	HTTPListen, HTTPDomain string
	TLSCert, TLSKey        string
	// Den runs a den command line for the SSH gateway's den@ verbs, in
	// this process, with client (the API as the key's user); nil: den@
	// verbs are off. cmd/den gives its own command line.
	Den func(ctx context.Context, client *api.Client, args []string, stdin io.Reader, stdout, stderr io.Writer) int
	// APIListen serves the API over TLS on a TCP address too (""
	// or "off": none), for callers with a bearer token (den tokens);
	// APITLSCert and APITLSKey are its certificate (default: one the
	// daemon makes, self-signed, in the state dir).
	APIListen, APITLSCert, APITLSKey string
	// E2BListen serves E2B's API (its control plane and envd) on a TCP
	// address ("" or "off": none): HTTP on loopback, else TLS with
	// APITLSCert and APITLSKey (or the self-signed certificate).
	E2BListen string
	// E2BDomain is the domain of sandboxes' host names (PORT-ID.DOMAIN,
	// sandbox.getHost); "": localhost:PORT for a loopback listener.
	E2BDomain string
	// SecretsCA is a PEM file of authorities den trusts, besides the
	// system's, for the hosts of HTTPS secrets ("": the system's only).
	SecretsCA string
	// VMUser is the unprivileged user VMMs run as (machine.Config.VMUser:
	// made when missing; "-": VMMs run as root).
	VMUser string
	// AdminGroup's members administer den through the socket, as root
	// does (DefaultAdminGroup when empty).
	AdminGroup string
	// Ready, if set, is called once the API socket accepts requests.
	Ready  func()
	Logger *slog.Logger
}

// Run runs the daemon until ctx ends. VMs keep running when it returns:
// the next daemon adopts them.
func Run(ctx context.Context, o Options) error {
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.StateDir == "" {
		o.StateDir = "/var/lib/den"
	}
	if o.Socket == "" {
		o.Socket = api.DefaultSocket
	}
	state := machine.StateDir(o.StateDir)
	// The start's steps are timed (startStep), and logged once it
	// serves.
	started := phase.New()
	sctx := phase.With(ctx, started)
	// What the start takes is undone, last first, when Run returns; a
	// refused start also takes down what it mounted (refused is true
	// until the daemon serves).
	var undo cleanup
	defer undo.run()
	refused := true
	var m *machine.Manager
	noneRunning := func() bool { return m == nil || m.Running() == 0 }

	unlockState, err := machine.LockStateDir(state)
	if err != nil {
		return fmt.Errorf("daemon: %w", err)
	}
	undo.push(unlockState)
	// The checks that can refuse the start come before anything is
	// mounted.
	if err := o.Images.Check(); err != nil {
		return fmt.Errorf("daemon: %w (build them with `make image`)", err)
	}
	if err := machine.CheckNetwork(state, o.Network); err != nil {
		return fmt.Errorf("daemon: %w", err)
	}
	if err := machine.CheckVMUserReach(state, o.VMUser, o.Logger); err != nil {
		return fmt.Errorf("daemon: %w", err)
	}
	vcfg := storage.Config{StateDir: state.VolumeState()}
	endStep := phase.Begin(sctx, startStep+"registry")
	db, clusterHost, err := openRegistry(sctx, &o, state, &vcfg)
	endStep()
	if err != nil {
		return fmt.Errorf("daemon: %w", err)
	}
	undo.push(func() { _ = db.Close() }) // after the manager's Close
	if o.HostName == "" {
		o.HostName = defaultHostName()
	}
	if o.Lease <= 0 {
		o.Lease = DefaultLease
	}
	if clusterHost != nil {
		// A refused start gives the lease back, so that a host that
		// cannot start does not keep the others out.
		undo.push(func() {
			if refused {
				clusterHost.leave(db)
			}
		})
	}
	// The lease is renewed from now on: the start may take longer than
	// the fence's deadline.
	beat, err := startHeart(ctx, db, o.Lease, clusterHost, o.Logger)
	if err != nil {
		return fmt.Errorf("daemon: %w", err)
	}
	undo.push(beat.close)
	if o.VolumeConfig != "" {
		c, err := storage.LoadConfig(o.VolumeConfig)
		if err != nil {
			return fmt.Errorf("daemon: %w", err)
		}
		vcfg = c
	}
	o.Logger.Info("den: opening volume", "state", vcfg.StateDir)
	endStep = phase.Begin(sctx, startStep+"volume")
	vol, err := storage.Open(sctx, vcfg)
	endStep()
	if err != nil {
		return fmt.Errorf("daemon: %w", err)
	}
	undo.push(func() { _ = vol.Close() })
	if !vol.Adopted() {
		undo.push(func() {
			if !refused || !noneRunning() {
				return
			}
			uctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			if err := vol.Unmount(uctx); err != nil {
				o.Logger.Warn("den: refused start: unmount the volume", "err", err)
			}
		})
	}

	if mounted, err := storage.IsMountPoint(state.RAM()); err == nil && !mounted {
		// The Manager may mount a tmpfs for guest RAM.
		undo.push(func() {
			if now, _ := storage.IsMountPoint(state.RAM()); now && refused && noneRunning() {
				if err := unix.Unmount(state.RAM(), 0); err != nil {
					o.Logger.Warn("den: refused start: unmount the guest RAM tmpfs", "err", err)
				}
			}
		})
	}
	var agentKey string
	if clusterHost != nil {
		if agentKey, err = clusterAgentKey(ctx, vol); err != nil {
			return fmt.Errorf("daemon: %w", err)
		}
	}
	secretStore, err := secrets.Open(state.Secrets(), state.SecretsKey())
	if err != nil {
		return fmt.Errorf("daemon: %w", err)
	}
	keyAgents := &keyAgents{store: secretStore, log: o.Logger}
	roots, err := secretRoots(o.SecretsCA)
	if err != nil {
		return fmt.Errorf("daemon: %w", err)
	}
	interceptor := secretStore.NewInterceptor(secrets.InterceptorConfig{VM: keyAgents.vmRef, Roots: roots, Note: keyAgents.usedHTTPS, Logger: o.Logger})
	undo.push(interceptor.Close)
	o.Network.HTTPS = interceptor
	var leases machine.Leases
	if clusterHost != nil {
		leases = clusterHost
	}
	// A wake here reads the memory of a VM another host put to sleep from
	// that host's local copy (peers, made once the Manager is).
	var peerMemory atomic.Pointer[peers]
	var fetchMemory func(context.Context, string, machine.MemoryRequest) (io.ReadCloser, error)
	if clusterHost != nil && clusterHost.cred != nil {
		fetchMemory = func(ctx context.Context, host string, req machine.MemoryRequest) (io.ReadCloser, error) {
			p := peerMemory.Load()
			if p == nil {
				return nil, errors.New("the cluster's peers are not reached yet")
			}
			return p.fetchMemory(ctx, host, req)
		}
	}
	endStep = phase.Begin(sctx, startStep+"vms")
	m, err = machine.New(sctx, machine.Config{
		Leases: leases, FetchMemory: fetchMemory,
		OnAgent: keyAgents.onAgent,
		State:   state, HostName: o.HostName, Volume: vol, Registry: db, AgentKey: agentKey, Images: o.Images, DefaultImage: o.DefaultImage, VMM: o.VMM, Logger: o.Logger,
		QEMUStreamRAM: o.QEMUStreamRAM, RestoreCopy: o.RestoreCopy, NoDigests: o.NoDigests, MemoryFiles: o.MemoryFiles, CollectGrace: o.CollectGrace, RAMDir: o.RAMDir, MemoryCopies: o.MemoryCopies,
		RecordCap: o.ActivityCap, RecordPull: o.ActivityPull,
		Memory: o.Memory, Network: o.Network, VMUser: o.VMUser, MaxWakes: o.MaxWakes,
	})
	endStep()
	if err != nil {
		return fmt.Errorf("daemon: %w", err)
	}
	undo.push(func() { _ = m.Close() })
	keyAgents.m.Store(m)
	if err := beat.attach(ctx, m, hostSelf(o.HostName, o.HostAddress, o.Version, m.Host())); err != nil {
		return fmt.Errorf("daemon: host record: %w", err)
	}

	hostKey, err := agent.LoadOrCreateHostKey(state.GatewayKey())
	if err != nil {
		return fmt.Errorf("daemon: %w", err)
	}
	keys := users.Keys{Store: db}
	auditLog, err := audit.Open(state.Audit(), audit.Options{})
	if err != nil {
		return fmt.Errorf("daemon: %w", err)
	}
	undo.push(func() { _ = auditLog.Close() })
	keyAgents.audit.Store(auditLog)
	inproc := newInProcess()
	undo.push(func() { _ = inproc.Close() })
	var sessions URLSessions = m
	var fwd *peers
	if clusterHost != nil && clusterHost.cred != nil {
		fwd = newPeers(clusterHost.cred, db, clusterHost, o.Lease, m, o.Logger)
		fwd.mem = m.LocalMemory()
		peerMemory.Store(fwd)
		sessions = peerSessions{URLSessions: m, records: m, p: fwd, self: o.HostName}
	}
	gw, err := startGateway(o, sessions, keys, hostKey, inproc, auditLog)
	if err != nil {
		return fmt.Errorf("daemon: ssh gateway: %w", err)
	}
	undo.push(gw.close)
	here := m.Host()
	info := api.DaemonInfo{Version: o.Version, VMM: here.VMM, Accel: here.Accel, AccelNote: here.AccelNote,
		StateDir: state.Path(), Volume: vol.Root(), Network: here.Network, GuestRAM: here.GuestRAM, Gateway: gw.addr, GatewayFingerprint: gw.fingerprint}
	web, err := startIngress(o, sessions)
	if err != nil {
		return fmt.Errorf("daemon: http: %w", err)
	}
	undo.push(web.close)
	info.HTTP, info.HTTPDomain = web.url, o.HTTPDomain
	apiSrv := NewServer(m, keys, info, hostKey, o.Logger)
	apiSrv.web = web
	apiSrv.audit = auditLog
	apiSrv.secrets = secretStore
	apiSrv.keyAgents = keyAgents
	apiSrv.hosts = &hostsView{store: db, backend: db.Backend(), self: o.HostName, lease: o.Lease}
	apiSrv.tokens = users.Tokens{Store: db}
	apiSrv.bearer = tokenCaller(apiSrv.tokens)
	apiSrv.inproc = inproc
	apiSrv.sessions = sessions
	if fwd != nil {
		apiSrv.peers = fwd
		closePeers, err := fwd.listen(apiSrv, o.HostAddress)
		if err != nil {
			return fmt.Errorf("daemon: %w", err)
		}
		undo.push(closePeers)
	}
	if o.AdminGroup == "" {
		o.AdminGroup = DefaultAdminGroup
	}
	limited := NewHTTPServer(apiSrv, &Identities{AdminGroup: o.AdminGroup}, o.Logger)
	undo.push(limited.Close)
	srv := limited.Server
	apiLn, err := listenAPI(o, state, limited)
	if err != nil {
		return fmt.Errorf("daemon: %w", err)
	}
	undo.push(apiLn.close)
	info.API, info.APIFingerprint = apiLn.addr, apiLn.fingerprint
	e2bCtx, stopE2B := context.WithCancel(ctx)
	undo.push(stopE2B)
	e2bLn, err := startE2B(e2bCtx, o, state, apiSrv.tokens, inproc, o.Logger)
	if err != nil {
		return fmt.Errorf("daemon: %w", err)
	}
	undo.push(e2bLn.close)
	info.E2B = e2bLn.url()
	apiSrv.info = info

	ln, err := listenUnix(o.Socket)
	if err != nil {
		return fmt.Errorf("daemon: %w", err)
	}
	refused = false
	o.Logger.Info("den: serving", "socket", o.Socket, "vmm", info.VMM, "accel", info.Accel,
		"started_in", started.Total().Round(time.Millisecond), "steps", startSteps(started))
	if o.Ready != nil {
		o.Ready()
	}
	mon := idle.New(m.IdleTarget(), idle.Policy{Interval: o.IdleCheck}, o.Logger)
	monCtx, stopMon := context.WithCancel(ctx)
	undo.push(stopMon)
	go mon.Run(monCtx)
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	go func() { _ = srv.Serve(inproc) }()
	if apiLn.ln != nil {
		o.Logger.Info("den: api listener (tls)", "addr", apiLn.addr, "certificate", apiLn.certFile, "sha256", apiLn.fingerprint)
		go func() { _ = srv.Serve(apiLn.ln) }()
	}
	select {
	case <-ctx.Done():
	case err := <-errc:
		return fmt.Errorf("daemon: serve: %w", err)
	case <-beat.lost:
		_ = srv.Close()
		return fmt.Errorf("daemon: %w", beat.lostErr)
	}
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = srv.Shutdown(sctx)
	_ = os.Remove(o.Socket)
	// Operations in flight finish or roll back before anything closes.
	_ = m.Close()
	beat.close()
	if clusterHost != nil {
		clusterHost.leave(db)
	}
	// Running VMs keep the volume mounted (their disks are on it) and the
	// next daemon adopts both; with none, the volume is unmounted cleanly.
	if n := m.Running(); n > 0 {
		o.Logger.Info("den: stopping; vms keep running and the volume stays mounted", "running", n)
		return nil
	}
	uctx, ucancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer ucancel()
	if err := vol.Unmount(uctx); err != nil {
		return fmt.Errorf("daemon: %w", err)
	}
	return nil
}

// listenUnix listens on a unix socket every local user may connect to
// (0666: the daemon learns who each is from the connection), replacing a
// stale socket file but refusing to take over one that a live daemon
// answers on.
func listenUnix(path string) (net.Listener, error) {
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	// The socket is made, then opened to all: in a directory another
	// user may write to, it could be swapped for a link in between
	// (unless the directory is sticky, as /tmp: then only its maker may
	// rename or remove it).
	var st unix.Stat_t
	if err := unix.Stat(dir, &st); err != nil {
		return nil, fmt.Errorf("socket %s: %w", path, err)
	}
	if int(st.Uid) != os.Geteuid() || (st.Mode&0o022 != 0 && st.Mode&unix.S_ISVTX == 0) {
		return nil, fmt.Errorf("socket %s: its directory %s must be the daemon's own, and sticky or writable by it alone (owner %d, mode %04o): choose another --socket", path, dir, st.Uid, st.Mode&0o7777)
	}
	if c, err := net.DialTimeout("unix", path, time.Second); err == nil {
		c.Close()
		return nil, fmt.Errorf("another den daemon is listening on %s", path)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	// Never under a umask of its own: the umask is the process's, and
	// the boot wake already makes VMs' directories (a RAM dir made then
	// without search permission kept its VMM from its RAM file).
	ln, err := net.Listen("unix", path)
	if err != nil {
		return nil, err
	}
	if err := os.Chmod(path, 0o666); err != nil {
		ln.Close()
		return nil, err
	}
	return ln, nil
}

// cleanup is a stack of undo functions: run calls them last first.
type cleanup []func()

func (c *cleanup) push(f func()) { *c = append(*c, f) }

func (c *cleanup) run() {
	for i := len(*c) - 1; i >= 0; i-- {
		(*c)[i]()
	}
	*c = nil
}

// startStep begins the names of the start's steps: those logged when the
// daemon serves, of the steps any part of it timed under the start's
// context.
const startStep = machine.StartStep

// startSteps lists the start's steps and what each took: "registry
// 0.21s, volume 1.3s, ...".
func startSteps(r *phase.Recorder) string {
	var b strings.Builder
	for _, st := range r.Steps() {
		name, ok := strings.CutPrefix(st.Name, startStep)
		if !ok {
			continue
		}
		if b.Len() > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "%s %s", name, st.Took.Round(time.Millisecond))
	}
	return b.String()
}
