package daemon

import (
	"context"

	"github.com/denhq/den/activity"
	"io"

	"github.com/denhq/den/checkpoint"
	"github.com/denhq/den/egress"
	"github.com/denhq/den/machine"
	"github.com/denhq/den/memstore"
	"github.com/denhq/den/registry"
)

// Lifecycle is what the API asks of den's VMs. machine.Manager is the
// one den runs; handler tests may give a fake.
type Lifecycle interface {
	Sessions

	// Reads.
	Get(ctx context.Context, name string) (machine.Status, error)
	Brief(ctx context.Context, name string) (machine.Status, error)
	List(ctx context.Context, owner string) ([]machine.Status, error)
	Record(ctx context.Context, name string) (registry.VM, error)
	Logs(ctx context.Context, name string, w io.Writer) error
	Checkpoints(ctx context.Context, name string) ([]registry.Checkpoint, string, error)
	NetStatus(ctx context.Context, name string) (machine.NetStatus, error)
	URL(ctx context.Context, name string) (machine.URLSettings, error)
	StorageUsage(ctx context.Context, owner string) (machine.StorageReport, error)
	GetSchedule(ctx context.Context, name string) (*machine.Schedule, error)

	// Operations.
	Create(ctx context.Context, o machine.CreateOptions, progress machine.Progress) (registry.VM, error)
	Remove(ctx context.Context, name string, force bool) error
	Sleep(ctx context.Context, name string, force bool) error
	Wake(ctx context.Context, name string) error
	Resize(ctx context.Context, name string, diskBytes int64) (registry.VM, error)
	Checkpoint(ctx context.Context, name string, o machine.CheckpointOptions, progress machine.Progress) (registry.Checkpoint, error)
	DeleteCheckpoint(ctx context.Context, name, id string) error
	VerifyCheckpoint(ctx context.Context, name, id string, progress machine.Progress) ([]checkpoint.FileResult, error)
	Restore(ctx context.Context, name, id string, o machine.RestoreOptions, progress machine.Progress) (saved string, err error)
	Fork(ctx context.Context, src, id, name string, progress machine.Progress) (registry.VM, error)
	Diff(ctx context.Context, o machine.DiffOptions, progress machine.Progress) (machine.DiffResult, error)
	Activity(ctx context.Context, name string, f activity.Filter) ([]activity.Entry, error)
	SetActivityRecord(ctx context.Context, name string, on bool, who string) (bool, error)
	RestorePaths(ctx context.Context, o machine.RestorePathsOptions, progress machine.Progress) (machine.RestorePathsResult, error)
	SetEgress(ctx context.Context, name string, p egress.Policy) error
	SetURL(ctx context.Context, name string, c machine.URLChange) (machine.URLSettings, error)
	SetSchedule(ctx context.Context, name string, s *machine.Schedule) (*machine.Schedule, error)
	SleepAll(ctx context.Context, o machine.HostOptions, report func(machine.HostResult)) ([]machine.HostResult, error)
	WakeAll(ctx context.Context, o machine.HostOptions, report func(machine.HostResult)) ([]machine.HostResult, error)
	CollectGarbage(ctx context.Context, dryRun bool) (memstore.Collected, error)

	// The host, for den info.
	Memory(ctx context.Context) machine.MemoryStatus
	Confinement() (user string, cgroupVersion int, missing string)
	VMMGuard(ctx context.Context) (bool, error)
}

// Sessions opens sessions into VMs (waking them): what the SSH gateway
// and the VMs' URLs need.
type Sessions interface {
	Open(ctx context.Context, name, owner string) (*machine.Session, error)
}

// URLSessions is Sessions with the URL settings a request to a VM's URL
// is checked against.
type URLSessions interface {
	Sessions
	URLTarget(ctx context.Context, name string) (machine.URLSettings, error)
}

var (
	_ Lifecycle   = (*machine.Manager)(nil)
	_ URLSessions = (*machine.Manager)(nil)
)
