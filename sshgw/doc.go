// Package sshgw is den's SSH gateway: an SSH server (gliderlabs/ssh) on a
// port of its own through which plain OpenSSH clients reach their VMs
// with no den client installed.
//
//	ssh -p 2222 box@host          a shell in the VM "box" (woken if asleep)
//	ssh -p 2222 box@host make     exec, with its exit status
//	sftp -P 2222 box@host         sftp (and scp, which speaks sftp)
//	ssh -p 2222 -L 8080:localhost:80 box@host
//	ssh -p 2222 den@host ls       den's own verbs, for the key's user
//
// Authentication is by public key only; every registered key belongs to
// one user (Backend.UserForKey), and the SSH user name is the VM to reach.
// After authentication the connection claims the VM once, lazily at its
// first channel (Backend.Open starts or wakes it and keeps it counted as
// active until the connection ends), and relays each "session" and
// "direct-tcpip" channel, with its requests and exit status, to the VM's
// guest agent (sshrelay.RelayChannel).
//
// A VM that does not exist and a VM of another user give the same one
// line, so the gateway tells nobody what other users have. Unknown keys
// get OpenSSH's own "Permission denied (publickey)". Agent forwarding
// (-A) is refused with a message: the guest agent opens its agent
// channels on the one connection the daemon shares between every
// session of a VM, with nothing that says which client they belong to.
// Remote forwarding (-R, to a port or a unix socket path) and forwards
// to unix sockets are refused too, with a message on the session's
// stderr (a refused -R has none of its own).
//
// Nobody can lock others out, and nothing a client does is unbounded:
// unauthenticated connections are capped per source address (an IPv4
// address, an IPv6 /64) and in all, and at the cap in all a newcomer
// pushes out the oldest of the address holding the most, so a flood
// pushes out its own connections; an address whose connections keep
// failing to authenticate is refused for a while; every connection has a
// handshake deadline; channels and forwards are capped per connection;
// and the log lines that unauthenticated connections cause are
// rate-limited, the rest summed up. The numbers are the Default*
// constants (server.go).
//
// The user name "den" is not a VM: `ssh den@host VERB ARGS` runs the den
// binary itself with VERB ARGS (split shell-like, no shell) against the
// daemon's socket, scoped to the key's user, so its output is the CLI's.
// Only verbs that act through the API are allowed (DefaultDenVerbs).
package sshgw
