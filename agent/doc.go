// Package agent is the protocol between the den daemon and den-agent, the
// guest agent that runs first in every den VM, and the host-side client
// for it.
//
// # Transport
//
// The agent is an SSH server (RFC 4251-4254) on the guest channel: an
// AF_VSOCK listener on port [Port] (Cloud Hypervisor), and/or the
// virtio-serial port named [SerialPortName] (QEMU). A virtio-serial port is
// one byte stream that the host connects to and disconnects from over time,
// so the agent treats it as a sequence of connections: each SSH version line
// that arrives from the host ("SSH-2.0-...") starts a new SSH connection and
// ends the previous one, and a host disconnect (EOF on the port) ends the
// current one. Bytes before a version line are stale and dropped.
//
// Stale bytes flow the other way too: after a host reconnect the guest may
// still flush the tail of an old connection. The client therefore sends a
// random nonce in its version string ("SSH-2.0-den_<nonce>") and the agent
// echoes it as the comment of its own ("SSH-2.0-denagent_<version> <nonce>");
// [Dial] skips every byte before the server version line carrying its nonce.
//
// # Authentication
//
// Public keys only. The agent accepts the keys in /etc/den/authorized_keys
// and those on the kernel command line as den.key=<type>:<base64> (see
// [AuthorizedKeyArg]); the daemon's key comes from [LoadOrCreateHostKey].
// The agent's host key is generated in the guest on first boot; the client
// accepts any host key unless given [WithHostKeyCallback] (see
// [PinnedHostKey] for trust on first use).
//
// # Sessions
//
// Standard SSH sessions: "exec" and "shell" run through the user's shell
// from /etc/passwd (or /bin/sh) with "-c"; "pty-req" and "window-change"
// give a terminal; "env" requests set the environment; "signal" is
// delivered to the process group (the terminal's foreground group with a
// PTY); "subsystem" "sftp" is an SFTP server; "auth-agent-req@openssh.com"
// forwards the client's SSH agent (SSH_AUTH_SOCK). The exit status is sent
// as "exit-status", or "exit-signal" when the process died of a signal
// (the client reports 128+signal, as a shell does).
//
// The working directory is passed as the environment variable [EnvWorkdir]
// (DEN_WORKDIR) in an "env" request; the agent removes it from the
// command's environment and starts the command there (default: the user's
// home directory). If the directory or the user cannot be set up, the agent
// writes "den-agent: <reason>" to stderr and exits with [ExitSetupFailed].
//
// "direct-tcpip" channels dial a TCP address from inside the guest.
//
// # Control requests
//
// Control requests are SSH global requests (want-reply set) named
// "den-<what>@den" with a JSON payload (possibly empty). On success the
// reply is SSH_MSG_REQUEST_SUCCESS with a JSON result; on failure it is
// SSH_MSG_REQUEST_FAILURE whose payload is a UTF-8 error message (empty
// when the agent does not know the request):
//
//	den-ready@den     {}                                  -> ReadyInfo
//	den-clock@den     ClockRequest{unix_nano}             -> ClockReply
//	den-freeze@den    FreezeRequest{timeout_ms}           -> FreezeReply
//	den-thaw@den      {}                                  -> ThawReply
//	den-identity@den  IdentityRequest{hostname, entropy, token}  -> IdentityReply{..., host_key}
//	den-growroot@den  GrowRequest{min_device_bytes}       -> GrowReply
//	den-activity@den  {}                                  -> Activity
//	den-poweroff@den  PoweroffRequest{reboot}             -> {}
//
// Freeze freezes every mounted writable block-device filesystem (FIFREEZE)
// and thaws them by itself after the timeout, or when the connection that
// froze them ends. Identity reseeds the kernel RNG with the host's random
// bytes (RNDADDENTROPY, a write to /dev/urandom, RNDRESEEDCRNG), writes a new
// /etc/machine-id, sets the hostname, makes a new agent host key (returned
// as host_key; new connections see it) and records the token in
// /etc/den/identity, so that a cold boot with den.identity=token keeps this
// identity. GrowRoot grows the root ext4 filesystem online to its block
// device's size, after waiting briefly for the device to reach
// min_device_bytes.
//
// Inside the guest, `den-agent hold [--for DURATION] [--name N]` and
// `den-agent release [--name N]` take and drop a keep-awake lease through
// the unix socket [LeaseSocket] (one JSON [LeaseRequest] line in, one
// [LeaseReply] line out); [Activity] reports the leases.
//
// # Client
//
// [Dial] runs the handshake over a stream from the VMM's guest channel;
// [WaitReady] redials until the agent answers ReqReady. One [Client]
// multiplexes any number of sessions, SFTP clients, forwarded TCP
// connections and control requests. Control requests (and keepalives,
// see [WithKeepalive]) are answered one at a time per connection. After a
// snapshot restore the caller dials anew: on a serial port the agent
// drops the old connection when the new one's version line arrives.
package agent
