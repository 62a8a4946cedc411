// Package storage is den's volume: the one filesystem that holds VM disks,
// images, checkpoints and suspend slots, shared by every VM on a host and,
// in the shared shape, by several hosts.
//
// The rest of den sees only the Volume interface and typed Paths (see
// layout.go): create a sparse disk, clone a file or directory in O(metadata),
// rename atomically, remove, measure. Behind it is a JuiceFS file system
// mounted with FUSE by a supervised `juicefs mount` process:
//
//   - Embedded (the default, nothing to run): metadata in
//     sqlite3://<state>/meta.db, data chunks as files under <state>/objects/.
//   - Shared: data in an S3 bucket (MinIO or any S3), metadata in Redis or
//     PostgreSQL, so several hosts mount the same volume and a VM can be
//     restored on another host.
//
// Secrets (S3 keys, the metadata password) are read from a 0600 file and
// handed to juicefs through its environment (ACCESS_KEY, SECRET_KEY,
// META_PASSWORD), never on a command line where ps would show them. Before
// the first format the S3 endpoint, keys and bucket are checked with
// minio-go so that a wrong setting fails with one actionable line instead of
// a juicefs retry loop.
//
// Mount options, decided for VM disks: the cache directory and log file are
// always explicit (under the state directory); --writeback is off by
// default, because with it a write acknowledged to the guest (even after
// fsync) lives only in this host's cache until uploaded, so a checkpoint
// could not be restored on another host and a host loss would lose
// acknowledged writes. The embedded shape gains nothing from it (its object
// store is the local disk already). Config.Writeback turns it on for a
// single-host shared volume where fsync latency matters more; see
// scripts/bench-storage.sh for the figures. Trash is off (--trash-days 0):
// den's checkpoints are the undo, and a trash would keep every replaced disk
// for a day.
//
// Clones and data sizes are asked of the mount itself, through its control
// file (control.go), as the juicefs CLI does: no process per clone. Only
// format, mount and the fallback for a mount without a control file run
// the binary.
//
// The mount process runs in its own session so that a daemon restart does
// not take the file system (and so every running VM's disk) down with it; a
// new daemon adopts a healthy mount it finds at the mount point. A
// supervisor probes the mount, notices a mount process that exits or hangs,
// remounts, and tells subscribers (see Event). juicefs's own supervisor
// (the process den starts) already restarts a crashed service process on
// the same FUSE connection, so open files survive that; den's remount is
// for the rest (the whole process tree gone, or hung), and after it files
// opened before (a running VM's disk) must be reopened.
//
// A trap for callers: a process that forks while it holds a file on the
// volume open passes the descriptor to the child, and the child's exec
// closes it; FUSE turns that close into a FLUSH that waits for the file's
// pending uploads. So the daemon should not keep volume files open while it
// starts processes (QEMU, not the daemon, holds VM disks), or a fork can
// stall for as long as the object store is slow or down.
package storage
