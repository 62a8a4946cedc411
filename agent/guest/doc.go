// Package guest is the server side of den-agent, the guest agent: an SSH
// server (gliderlabs/ssh) on the guest channel (vsock, or a virtio-serial
// port treated as a sequence of connections) with sessions, sftp,
// direct-tcpip forwarding and the control requests of package agent, plus
// the keep-awake lease socket and, when the agent is init, a zombie reaper.
// See package agent for the protocol.
package guest
