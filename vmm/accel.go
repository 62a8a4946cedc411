package vmm

import (
	"fmt"
	"os"
)

// KVMStatus says whether this host's /dev/kvm can run den's guests.
type KVMStatus struct {
	// Present: /dev/kvm exists and opens read-write.
	Present bool `json:"present"`
	// PVM: the KVM module is PVM (kvm_pvm), which runs only guest
	// kernels built for PVM; a stock kernel dies under it.
	PVM bool `json:"pvm"`
	// Usable: real guests boot under KVM here.
	Usable bool `json:"usable"`
	// Reason explains the verdict in one line.
	Reason string `json:"reason"`
}

// kvmPaths are the files DetectKVM reads; tests point them elsewhere.
var kvmPaths = struct{ dev, pvmModule string }{"/dev/kvm", "/sys/module/kvm_pvm"}

// DetectKVM finds out whether KVM can run stock guest kernels here. It
// does not boot anything: a driver that is in doubt may still probe.
func DetectKVM() KVMStatus {
	f, err := os.OpenFile(kvmPaths.dev, os.O_RDWR, 0)
	if err != nil {
		return KVMStatus{Reason: fmt.Sprintf("%s not usable (%v): guests run under TCG emulation, which is slow", kvmPaths.dev, err)}
	}
	f.Close()
	if _, err := os.Stat(kvmPaths.pvmModule); err == nil {
		return KVMStatus{Present: true, PVM: true, Reason: "/dev/kvm is PVM (kvm_pvm loaded): it runs only PVM-built guest kernels, so guests run under TCG emulation, which is slow"}
	}
	return KVMStatus{Present: true, Usable: true, Reason: "/dev/kvm is usable"}
}

// Accelerator is "kvm" when DetectKVM finds it usable, else "tcg".
func (s KVMStatus) Accelerator() string {
	if s.Usable {
		return "kvm"
	}
	return "tcg"
}
