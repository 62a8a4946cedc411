package main

import (
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// unixSignalName is the SSH name of a signal: "KILL" for SIGKILL.
func unixSignalName(s syscall.Signal) string {
	return strings.TrimPrefix(unix.SignalName(s), "SIG")
}
