package daemon

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"time"

	"github.com/denhq/den/cluster"
	"github.com/denhq/den/fence"
	"github.com/denhq/den/internal/atomicfile"
	"github.com/denhq/den/machine"
	"github.com/denhq/den/peer"
	"github.com/denhq/den/registry"
	"github.com/denhq/den/storage"
)

// hostLease names the lease a host of a cluster holds while its daemon
// lives: its VMs' leases are renewed with it, and the fence stops its
// VMMs when it cannot renew them. A VM name never begins with '@'.
func hostLease(host string) string { return "@host/" + host }

// openRegistry opens the daemon's registry: the cluster's PostgreSQL
// database when o names a cluster config (and then the cluster's volume
// config replaces vcfg), else SQLite in the state dir. With a cluster it
// takes this host's lease, or refuses the start while another daemon
// with this host's name holds it, and starts the fence guard.
func openRegistry(ctx context.Context, o *Options, state machine.StateDir, vcfg *storage.Config) (*registry.DB, *clusterHost, error) {
	if o.ClusterConfig == "" {
		if _, ok, _ := fence.Passed(state.Fence()); ok {
			return nil, nil, fmt.Errorf("this state dir is a cluster host's (%s holds its fence deadline): start it with --cluster, or remove that file once its VMs are stopped", state.Fence())
		}
		db, err := registry.Open(state.DB())
		return db, nil, err
	}
	if o.VolumeConfig != "" {
		return nil, nil, errors.New("cluster: the cluster config names the volume: give --cluster or --volume-config, not both")
	}
	cc, err := cluster.Load(o.ClusterConfig, defaultHostName(), vcfg.StateDir)
	if err != nil {
		return nil, nil, err
	}
	if cc.Host == "localhost" {
		return nil, nil, errors.New("cluster: this machine's hostname does not name it in a cluster: give \"host\" in the cluster config")
	}
	*vcfg = cc.Volume
	o.HostName, o.HostAddress, o.Lease = cc.Host, cc.Address, time.Duration(cc.Lease)
	instance, err := loadInstance(state.Instance())
	if err != nil {
		return nil, nil, fmt.Errorf("cluster: %w", err)
	}
	den, err := os.Executable()
	if err != nil {
		return nil, nil, fmt.Errorf("cluster: %w", err)
	}
	octx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	db, err := registry.OpenPostgres(octx, cc.RegistryDSN())
	if err != nil {
		return nil, nil, fmt.Errorf("cluster: %w", err)
	}
	t0 := fence.Now()
	l, err := db.AcquireLease(octx, hostLease(o.HostName), o.HostName, instance, o.Lease, o.Lease/2)
	if err != nil {
		db.Close()
		return nil, nil, fmt.Errorf("cluster: %w", err)
	}
	db.Fence(l) // from now on the record is written only while the lease is held
	c := &clusterHost{lease: l, ttl: o.Lease, state: state, den: den, log: o.Logger, store: db}
	if cc.Address != "" {
		if c.cred, err = peer.Load(cc.CACert, cc.CAKey, cc.Host); err != nil {
			db.Close()
			return nil, nil, fmt.Errorf("cluster: %w", err)
		}
	}
	if err := c.push(t0); err != nil {
		db.Close()
		return nil, nil, fmt.Errorf("cluster: %w", err)
	}
	if err := c.guard(); err != nil {
		db.Close()
		return nil, nil, fmt.Errorf("cluster: %w", err)
	}
	return db, c, nil
}

// loadInstance reads this state dir's daemon instance id, made once: it
// tells apart daemons that give the same host name.
func loadInstance(path string) (string, error) {
	if b, err := os.ReadFile(path); err == nil && len(strings.TrimSpace(string(b))) == 32 {
		return strings.TrimSpace(string(b)), nil
	}
	var id [16]byte
	if _, err := rand.Read(id[:]); err != nil {
		return "", err
	}
	s := hex.EncodeToString(id[:])
	if err := atomicfile.Replace(path, []byte(s+"\n"), 0o600); err != nil {
		return "", fmt.Errorf("instance id: %w", err)
	}
	return s, nil
}

// clusterHost is what a host of a cluster holds: its host lease, the
// leases of the VMs it runs or works on (taken through it, as
// machine.Leases), and the fence that stops its VMMs if it cannot renew
// them in time.
type clusterHost struct {
	lease registry.Lease
	ttl   time.Duration
	state machine.StateDir
	den   string // this program, to start the fence guard
	log   *slog.Logger
	store registry.LeaseStore
	// cred is this host's certificate for its peers (nil: the cluster
	// config gives no address, and requests are not forwarded).
	cred *peer.Credential
}

var _ machine.Leases = (*clusterHost)(nil)

// Acquire implements machine.Leases. A VM's lease is taken from a host
// that let it lapse only a grace of half the lease after it expired:
// that host's fence stopped its VMM at half the lease after its last
// renewal began, so the grace leaves the kill time to complete.
func (c *clusterHost) Acquire(ctx context.Context, vm string) (registry.Lease, error) {
	return c.store.AcquireLease(ctx, vm, c.lease.Host, c.lease.Instance, c.ttl, c.ttl/2)
}

// Release implements machine.Leases.
func (c *clusterHost) Release(ctx context.Context, l registry.Lease) error {
	return c.store.ReleaseLease(ctx, l)
}

// Get implements machine.Leases.
func (c *clusterHost) Get(ctx context.Context, vm string) (registry.Lease, error) {
	return c.store.GetLease(ctx, vm)
}

// Lapsed implements machine.Leases.
func (c *clusterHost) Lapsed(ctx context.Context) ([]registry.Lease, error) {
	return c.store.ExpiredLeases(ctx, c.ttl/2)
}

// Mine implements machine.Leases.
func (c *clusterHost) Mine(ctx context.Context) ([]registry.Lease, error) {
	return c.store.HostLeases(ctx, c.lease.Host)
}

// Every implements machine.Leases: a third of the lease.
func (c *clusterHost) Every() time.Duration { return c.ttl / 3 }

// push tells the fence guard the VMMs may run until half the lease after
// t0, when the renewal that succeeded began.
func (c *clusterHost) push(t0 int64) error {
	return fence.Push(c.state.Fence(), c.lease.Host, t0+int64(c.ttl/2))
}

// guard starts the fence guard unless one runs, and waits (bounded) until
// it holds its lock: no VMM starts unguarded.
func (c *clusterHost) guard() error {
	if fence.Running(c.state.FenceLock()) {
		return nil
	}
	logf, err := os.OpenFile(c.state.FenceLog(), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return fmt.Errorf("start fence guard: %w", err)
	}
	defer logf.Close()
	cmd := exec.Command(c.den, "fence", "--state-dir", c.state.Path())
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true} // it outlives the daemon
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start fence guard: %w", err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	deadline := time.After(10 * time.Second)
	for !fence.Running(c.state.FenceLock()) {
		select {
		case err := <-exited:
			return fmt.Errorf("start fence guard: it exited: %v (see %s)", err, c.state.FenceLog())
		case <-deadline:
			return errors.New("start fence guard: it did not take its lock within 10s")
		case <-time.After(20 * time.Millisecond):
		}
	}
	c.log.Info("den: fence guard running", "pid", cmd.Process.Pid, "log", c.state.FenceLog())
	return nil
}

// fenceNow stops this host's VMMs at once, and has the guard stop any an
// operation in flight starts: the lease is lost.
func (c *clusterHost) fenceNow() {
	if err := fence.Push(c.state.Fence(), c.lease.Host, fence.Now()-1); err != nil {
		c.log.Error("den: fence: push a passed deadline", "err", err)
	}
	if killed, err := fence.KillVMMs(c.state.Runs()); len(killed) > 0 || err != nil {
		c.log.Warn("den: this host's lease is lost: VMMs killed", "vms", killed, "err", err)
	}
}

// leave gives the host's lease back and lifts the fence, when no VMM
// of this host runs; with VMMs running both stay, and the fence stops
// them unless a daemon renews the lease in time.
func (c *clusterHost) leave(store registry.LeaseStore) {
	if running, err := fence.Live(c.state.Runs()); len(running) > 0 || err != nil {
		c.log.Warn("den: stopping with VMs running: the fence guard stops them unless a daemon renews this host's lease within half of it",
			"running", running, "lease", c.ttl, "err", err)
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := store.ReleaseLease(ctx, c.lease); err != nil {
		c.log.Warn("den: release the host's lease", "err", err)
		return
	}
	if err := fence.Lift(c.state.Fence()); err != nil {
		c.log.Warn("den: lift the fence", "err", err)
	}
}

// clusterAgentKey is the path of the agent key the cluster's hosts share
// on the volume: a guest made or last booted on one host lets every host
// in.
func clusterAgentKey(ctx context.Context, vol storage.Volume) (string, error) {
	if err := vol.MkdirAll(ctx, storage.ClusterDir()); err != nil {
		return "", fmt.Errorf("cluster: agent key: %w", err)
	}
	p, err := vol.Path(storage.AgentKey())
	if err != nil {
		return "", fmt.Errorf("cluster: agent key: %w", err)
	}
	return p, nil
}
