package registry

import (
	"context"
	"fmt"
	"time"
)

// Host is a daemon's record: what it is and what it holds, as of its last
// heartbeat. Several hosts share one PostgreSQL registry; an embedded
// SQLite registry holds its one host.
type Host struct {
	Name    string `json:"name"`
	Address string `json:"address,omitempty"` // where peers reach it
	Version string `json:"version"`
	VMM     string `json:"vmm"`
	// CPUModel is the host CPU's model name; CPUs its count.
	CPUModel string `json:"cpu_model"`
	CPUs     int    `json:"cpus"`
	// MemoryBudgetBytes is the guest memory the host commits at most (-1:
	// no budget); MemoryFreeBytes what is left of it.
	MemoryBudgetBytes int64 `json:"memory_budget_bytes"`
	MemoryFreeBytes   int64 `json:"memory_free_bytes"`
	// Running and Sleeping count the host's VMs.
	Running  int `json:"running"`
	Sleeping int `json:"sleeping"`
	// Compat is what the host's VMMs and CPU can restore, as the machine
	// package records it (JSON): placement compares a memory snapshot's
	// record with it.
	Compat string `json:"compat,omitempty"`
	// Draining hosts admit no new VMs (den hosts drain).
	Draining  bool      `json:"draining,omitempty"`
	StartedAt time.Time `json:"started_at"`
	// Heartbeat is the database's clock at the host's last heartbeat:
	// hosts' own clocks never decide liveness.
	Heartbeat time.Time `json:"heartbeat"`
}

// HostStore keeps the hosts' records.
type HostStore interface {
	// Heartbeat records h (all but Draining, which stays as it is) with
	// the database's time as its heartbeat.
	Heartbeat(ctx context.Context, h Host) error
	// ListHosts returns the hosts ordered by name, and the database's
	// time now, to judge their heartbeats' age by.
	ListHosts(ctx context.Context) ([]Host, time.Time, error)
	// SetDraining marks a host draining or not; ErrNotFound when there is
	// no host of that name.
	SetDraining(ctx context.Context, name string, draining bool) (Host, error)
}

const hostColumns = `name, address, version, vmm, cpu_model, cpus, memory_budget, memory_free, running, sleeping, draining, started_at, compat, heartbeat_at`

func scanHost(s scanner) (Host, error) {
	var h Host
	var started, beat int64
	err := s.Scan(&h.Name, &h.Address, &h.Version, &h.VMM, &h.CPUModel, &h.CPUs, &h.MemoryBudgetBytes, &h.MemoryFreeBytes,
		&h.Running, &h.Sleeping, &h.Draining, &started, &h.Compat, &beat)
	h.StartedAt = time.UnixMilli(started).UTC()
	h.Heartbeat = time.UnixMilli(beat).UTC()
	return h, err
}

// Heartbeat implements HostStore.
func (d *DB) Heartbeat(ctx context.Context, h Host) error {
	if err := checkHostName(h.Name); err != nil {
		return err
	}
	now := d.meta.d.now
	_, err := d.meta.ExecContext(ctx, `INSERT INTO hosts (`+hostColumns+`) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,`+now+`)
		ON CONFLICT (name) DO UPDATE SET address = excluded.address, version = excluded.version, vmm = excluded.vmm,
		cpu_model = excluded.cpu_model, cpus = excluded.cpus, memory_budget = excluded.memory_budget,
		memory_free = excluded.memory_free, running = excluded.running, sleeping = excluded.sleeping,
		started_at = excluded.started_at, compat = excluded.compat, heartbeat_at = excluded.heartbeat_at`,
		h.Name, h.Address, h.Version, h.VMM, h.CPUModel, h.CPUs, h.MemoryBudgetBytes, h.MemoryFreeBytes,
		h.Running, h.Sleeping, false, h.StartedAt.UnixMilli(), h.Compat)
	if err != nil {
		return fmt.Errorf("heartbeat of host %q: %w", h.Name, err)
	}
	return nil
}

// ListHosts implements HostStore.
func (d *DB) ListHosts(ctx context.Context) ([]Host, time.Time, error) {
	var now int64
	if err := d.meta.QueryRowContext(ctx, `SELECT `+d.meta.d.now).Scan(&now); err != nil {
		return nil, time.Time{}, fmt.Errorf("list hosts: %w", err)
	}
	rows, err := d.meta.QueryContext(ctx, `SELECT `+hostColumns+` FROM hosts ORDER BY name`)
	if err != nil {
		return nil, time.Time{}, fmt.Errorf("list hosts: %w", err)
	}
	hosts, err := collect(rows, scanHost)
	if err != nil {
		return nil, time.Time{}, fmt.Errorf("list hosts: %w", err)
	}
	return hosts, time.UnixMilli(now).UTC(), nil
}

// SetDraining implements HostStore.
func (d *DB) SetDraining(ctx context.Context, name string, draining bool) (Host, error) {
	res, err := d.meta.ExecContext(ctx, `UPDATE hosts SET draining = ? WHERE name = ?`, draining, name)
	if err != nil {
		return Host{}, fmt.Errorf("drain host %q: %w", name, err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return Host{}, fmt.Errorf("host %q: %w", name, ErrNotFound)
	}
	h, err := scanHost(d.meta.QueryRowContext(ctx, `SELECT `+hostColumns+` FROM hosts WHERE name = ?`, name))
	if err != nil {
		return Host{}, fmt.Errorf("drain host %q: %w", name, err)
	}
	return h, nil
}
