//go:build !crashpoints

package machine

// crashpoint marks a step the fault tests crash den at; a no-op outside
// builds with the crashpoints tag (see crashpoint.go).
func crashpoint(string) {}
