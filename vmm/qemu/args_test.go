package qemu

import (
	"strings"
	"testing"

	"github.com/denhq/den/vmm"
)

func TestBuildArgs(t *testing.T) {
	cfg := vmm.Config{CPUs: 2, MemoryBytes: 512 << 20, Kernel: "/k", Initramfs: "/i", Cmdline: "console=ttyS0",
		Disks: []vmm.Disk{{ID: "root", Path: "/d"}, {ID: "ro", Path: "/r", ReadOnly: true}}, Net: []vmm.Net{{ID: "n", MAC: "52:54:00:00:00:01"}}}
	args := strings.Join(buildArgs(cfg, vmm.RunDir("/run/x"), "/run/x/memory", "tcg", true), " ")
	for _, want := range []string{
		"-machine microvm,memory-backend=mem",
		"memory-backend-file,id=mem,size=512M,mem-path=/run/x/memory,share=on",
		"-smp 2", "-accel tcg,thread=multi,tb-size=128 -cpu max", "-kernel /proc/self/fd/8", "-initrd /proc/self/fd/9", "-S", "-incoming defer", "-no-reboot",
		"-add-fd fd=3,set=1,opaque=root-ro -add-fd fd=4,set=1,opaque=root-rw", "-add-fd fd=5,set=2,opaque=ro-ro -drive",
		"id=ro,file=/dev/fdset/2,format=raw,if=none,discard=unmap,cache=writeback,file.locking=off,readonly=on",
		"-sandbox on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny",
		"-netdev user,id=n -device virtio-net-device,netdev=n,mac=52:54:00:00:00:01",
		"virtserialport,chardev=agent,name=org.den.agent",
		"-qmp unix:/run/x/api.sock,server=on,wait=off",
	} {
		if !strings.Contains(args, want) {
			t.Errorf("args lack %q:\n%s", want, args)
		}
	}
	if !strings.Contains(kernelCmdline("console=ttyS0", "tcg"), "tsc_early_khz=") {
		t.Error("tcg cmdline lacks tsc_early_khz")
	}
	if strings.Contains(kernelCmdline("console=ttyS0", "kvm"), "tsc_early_khz") {
		t.Error("kvm cmdline has tsc_early_khz")
	}
	kvm := strings.Join(buildArgs(cfg, vmm.RunDir("/run/x"), "/run/x/memory", "kvm", false), " ")
	if !strings.Contains(kvm, "-accel kvm -cpu host") || strings.Contains(kvm, "-incoming") {
		t.Errorf("kvm args: %s", kvm)
	}
}

func TestMapStatus(t *testing.T) {
	for _, c := range []struct {
		status string
		booted bool
		want   vmm.State
	}{
		{"prelaunch", false, vmm.StateCreated},
		{"paused", false, vmm.StateCreated},
		{"paused", true, vmm.StatePaused},
		{"postmigrate", true, vmm.StatePaused},
		{"running", true, vmm.StateRunning},
		{"inmigrate", false, vmm.StateNotCreated},
		{"shutdown", true, vmm.StateShutdown},
	} {
		if got := mapStatus(c.status, c.booted); got != c.want {
			t.Errorf("mapStatus(%q, %v) = %s, want %s", c.status, c.booted, got, c.want)
		}
	}
}
