// Package cloudhypervisor drives one Cloud Hypervisor process per VM through
// its REST API on a unix socket (--api-socket), and reaches the guest over
// Cloud Hypervisor's hybrid vsock.
//
// A VMM value is bound to one vmm.RunDir. Start launches
// `cloud-hypervisor --api-socket path=<RunDir>/api.sock` in its own session
// (vmm.StartProcess), so the process outlives the caller's context and the
// caller itself; Adopt re-attaches to it after the caller restarted. Every
// API call carries a deadline; Cloud Hypervisor's errors (a JSON array of
// strings, outermost context first) come back as *APIError with the whole
// chain kept.
//
// Snapshots go into a directory (config.json, state.json, memory-ranges).
// Restore always happens in a fresh VMM process; memory is either copied in
// (Copy) or faulted in lazily through userfaultfd (OnDemand). When the
// snapshot's recorded host paths do not fit the restoring VM (another run
// directory, a fork's own disks), Restore builds a private restore directory
// under the RunDir with links to the snapshot's files and a rewritten
// config.json, and never modifies the snapshot itself.
//
// Guest connections (DialGuest) do not survive a restore or a VMM restart:
// callers redial.
package cloudhypervisor
