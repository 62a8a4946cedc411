package bench

import (
	"os"
	"strconv"
	"strings"
)

// cpuSpan measures the CPU time the whole host (every process, every
// core) uses over a span: what an operation costs beside how long it
// takes. On a host of few cores an operation whose steps overlap is held
// by the CPU time they need together, not by the longest of them.
type cpuSpan struct {
	start float64 // ms, -1 if /proc/stat could not be read
}

// startCPU begins a span.
func startCPU() cpuSpan { return cpuSpan{start: hostCPUms()} }

// ms is the host's CPU time since the span began, -1 if unknown.
func (s cpuSpan) ms() float64 {
	now := hostCPUms()
	if s.start < 0 || now < 0 {
		return -1
	}
	return now - s.start
}

// clockTicks is USER_HZ, the unit of /proc/stat: 100 on every Linux
// architecture den runs on.
const clockTicks = 100

// hostCPUms is the CPU time the host has spent busy since boot, in ms
// (-1 if unknown).
func hostCPUms() float64 {
	data, err := os.ReadFile("/proc/stat")
	if err != nil {
		return -1
	}
	return busyMS(string(data))
}

// busyMS reads the busy time off /proc/stat's text, in ms: its first
// line, every field but idle and iowait (guest time is counted in user
// already); -1 if it is not that line.
func busyMS(stat string) float64 {
	line, _, _ := strings.Cut(stat, "\n")
	f := strings.Fields(line)
	if len(f) < 9 || f[0] != "cpu" {
		return -1
	}
	var busy float64
	for i, v := range f[1:9] { // user nice system idle iowait irq softirq steal
		if i == 3 || i == 4 {
			continue
		}
		n, err := strconv.ParseFloat(v, 64)
		if err != nil {
			return -1
		}
		busy += n
	}
	return busy * 1000 / clockTicks
}
