package registry

import (
	"context"
	"time"
)

// DefaultOwner owns VMs and keys created without a user.
const DefaultOwner = "default"

// Store is den's durable record: VMs, their checkpoints' catalog,
// users' keys, API tokens, the hosts sharing the record with the
// leases that say which host may run a VM, and the disk use measured of
// VMs. *DB implements it on SQLite
// (one host) and on PostgreSQL (hosts of a cluster share one database).
type Store interface {
	VMStore
	CheckpointStore
	KeyStore
	TokenStore
	HostStore
	LeaseStore
	UsageStore
	Close() error
}

// VMStore keeps VM records. Every write bumps the record's generation;
// UpdateVMIf writes only at the generation the caller decided on. Updates
// check the state transition (CheckTransition) and apply
// VM.KeepWakeOnBoot.
type VMStore interface {
	CreateVM(ctx context.Context, vm VM) error
	GetVM(ctx context.Context, name string) (VM, error)
	ListVMs(ctx context.Context, owner string) ([]VM, error)
	UpdateVM(ctx context.Context, name string, f func(*VM) error) (VM, error)
	UpdateVMIf(ctx context.Context, name string, gen int64, f func(*VM) error) (VM, error)
	DeleteVM(ctx context.Context, name string) error
	// TouchVM raises the VM's last activity, without a new generation.
	TouchVM(ctx context.Context, name string, t time.Time) error
}

// CheckpointStore keeps the checkpoint catalog. A checkpoint id is never
// handed out twice for a VM name: NextCheckpointSeq is past every
// sequence number AddCheckpoint ever recorded for the name, of rows
// deleted since and of VMs of that name removed since too, and
// AddCheckpoint refuses one that is not.
type CheckpointStore interface {
	NextCheckpointSeq(ctx context.Context, vm string) (int, error)
	AddCheckpoint(ctx context.Context, c Checkpoint) error
	SetCheckpointSizes(ctx context.Context, vm, id string, memory, disk int64) error
	GetCheckpoint(ctx context.Context, vm, id string) (Checkpoint, error)
	ListCheckpoints(ctx context.Context, vm string) ([]Checkpoint, error)
	DeleteCheckpoint(ctx context.Context, vm, id string) error
	DeleteCheckpoints(ctx context.Context, vm string) error
}

// KeyStore keeps users' SSH public keys.
type KeyStore interface {
	AddKey(ctx context.Context, k Key) error
	ListKeys(ctx context.Context, user string) ([]Key, error)
	RemoveKey(ctx context.Context, user, ref string) (Key, error)
	UserForKey(ctx context.Context, fingerprint string) (string, error)
}

// TokenStore keeps users' API tokens, by the hash of their secret (the
// secret itself is never given to the store).
type TokenStore interface {
	// AddToken records a token; ErrExists when its id or hash is taken,
	// or its user has a token of that name.
	AddToken(ctx context.Context, t Token) error
	// ListTokens returns the tokens ordered by user, then date; of one
	// user when user is set.
	ListTokens(ctx context.Context, user string) ([]Token, error)
	// RemoveToken deletes the token whose id or name is ref (of user
	// only, when user is set) and returns it: ErrNotFound when none
	// matches, ErrAmbiguous when a name matches several users' tokens.
	RemoveToken(ctx context.Context, user, ref string) (Token, error)
	// TokenByHash returns the token whose secret hashes to hash;
	// ErrNotFound when there is none.
	TokenByHash(ctx context.Context, hash string) (Token, error)
	// TouchToken raises the token's last use to t (never lowers it);
	// ErrNotFound when there is no token of that id.
	TouchToken(ctx context.Context, id string, t time.Time) error
}

var _ Store = (*DB)(nil)
