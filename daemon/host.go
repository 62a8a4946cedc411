package daemon

import (
	"github.com/denhq/den/api"
	"github.com/denhq/den/machine"
)

// memoryInfo is the memory budget and its use, as GET /v1/info reports
// them.
func memoryInfo(st machine.MemoryStatus) *api.MemoryInfo {
	return &api.MemoryInfo{
		BudgetBytes: st.Budget, CommittedBytes: st.Committed, FreeBytes: st.Free,
		Running: st.Running, Starting: st.Starting, VMMOverheadBytes: st.VMMOverhead,
		HostTotalBytes: st.HostTotal, HostAvailableBytes: st.HostAvailable, PressureSomeAvg10: st.PressureSome,
	}
}
