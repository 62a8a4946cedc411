// Package hostinfo reads what a host is: its CPU's model and count.
package hostinfo

import (
	"os"
	"strings"
)

// CPU returns the host CPU's model name and its count of logical CPUs,
// from /proc/cpuinfo ("", 0 where it cannot be read).
func CPU() (model string, cpus int) {
	data, err := os.ReadFile("/proc/cpuinfo")
	if err != nil {
		return "", 0
	}
	for _, line := range strings.Split(string(data), "\n") {
		if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
			model = strings.TrimSpace(v)
			cpus++
		}
	}
	return model, cpus
}
