package api

import "errors"

// ErrNoMemory: the VM could not start within the daemon's memory budget,
// and no running VM could be put to sleep to make room.
var ErrNoMemory = errors.New("not enough memory")

// MemoryInfo is the daemon's memory budget and its use (GET /v1/info,
// filled when asked). Sizes are in bytes.
type MemoryInfo struct {
	// BudgetBytes is the guest RAM, plus VMMOverheadBytes per VM, that
	// the daemon commits at most; -1 when it has no budget
	// (--memory-budget off).
	BudgetBytes int64 `json:"budget_bytes"`
	// CommittedBytes is what running and starting VMs take of it;
	// FreeBytes what is left.
	CommittedBytes int64 `json:"committed_bytes"`
	FreeBytes      int64 `json:"free_bytes"`
	// Running VMs (VMM processes), and Starting ones (their memory is
	// reserved while their VMM starts).
	Running  int `json:"running"`
	Starting int `json:"starting,omitempty"`
	// VMMOverheadBytes is counted per VM beside its guest RAM.
	VMMOverheadBytes int64 `json:"vmm_overhead_bytes"`
	// HostTotalBytes and HostAvailableBytes are the host's MemTotal and
	// MemAvailable; PressureSomeAvg10 its memory PSI "some avg10"
	// (percent). -1 where unknown.
	HostTotalBytes     int64   `json:"host_total_bytes"`
	HostAvailableBytes int64   `json:"host_available_bytes"`
	PressureSomeAvg10  float64 `json:"pressure_some_avg10"`
}
