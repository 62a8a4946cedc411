// Package hostinfo reads what a host is: its CPU's vendor, model, count
// and features.
package hostinfo

import (
	"os"
	"sort"
	"strings"
)

// CPUInfo is the host CPU as /proc/cpuinfo describes it.
type CPUInfo struct {
	// Vendor is the vendor id ("GenuineIntel", "AuthenticAMD").
	Vendor string
	// Model is the model name.
	Model string
	// Count is the number of logical CPUs.
	Count int
	// Flags are the features of the first CPU, sorted.
	Flags []string
}

// CPU returns the host CPU's model name and its count of logical CPUs,
// from /proc/cpuinfo ("", 0 where it cannot be read).
func CPU() (model string, cpus int) {
	c := ReadCPU()
	return c.Model, c.Count
}

// ReadCPU reads /proc/cpuinfo (a zero CPUInfo where it cannot be read).
func ReadCPU() CPUInfo {
	data, err := os.ReadFile("/proc/cpuinfo")
	if err != nil {
		return CPUInfo{}
	}
	return ParseCPU(string(data))
}

// ParseCPU reads the text of /proc/cpuinfo: vendor, model and flags of
// its first processor, and how many processors it lists.
func ParseCPU(text string) CPUInfo {
	var c CPUInfo
	for _, line := range strings.Split(text, "\n") {
		k, v, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		k, v = strings.TrimSpace(k), strings.TrimSpace(v)
		switch {
		case k == "processor":
			c.Count++
		case k == "vendor_id" && c.Vendor == "":
			c.Vendor = v
		case k == "model name" && c.Model == "":
			c.Model = v
		case k == "flags" && c.Flags == nil:
			c.Flags = strings.Fields(v)
			sort.Strings(c.Flags)
		}
	}
	return c
}
