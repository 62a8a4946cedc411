//go:build crashpoints

package machine

import "os"

// crashpoint kills the daemon at a named step when DEN_CRASHPOINT names
// it: how the fault tests crash den in the middle of an operation. Only
// builds with the crashpoints tag have it (the e2e tests build den so);
// den itself has the no-op in crashpoint_off.go.
func crashpoint(name string) {
	if os.Getenv("DEN_CRASHPOINT") == name {
		p, _ := os.FindProcess(os.Getpid())
		_ = p.Kill()
		select {}
	}
}
