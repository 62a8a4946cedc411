package machine

import (
	"encoding/json"
	"strings"
	"testing"
)

// TestRestorableOn: the rules a snapshot's host record is held to on
// the host that restores it.
func TestRestorableOn(t *testing.T) {
	kvm := snapshotHost{Host: "a", VMM: "cloud-hypervisor", VMMVersion: "v53.0", SnapshotVersion: "v53.0", Accel: "kvm",
		CPUVendor: "GenuineIntel", CPUModel: "Xeon A", CPUFlags: []string{"avx2", "fpu", "sse2"}}
	tcg := snapshotHost{Host: "a", VMM: "qemu", VMMVersion: "7.2.22", SnapshotVersion: "7.2", Accel: "tcg",
		CPUVendor: "GenuineIntel", CPUFlags: []string{"avx512f", "fpu"}}
	with := func(h snapshotHost, f func(*snapshotHost)) snapshotHost {
		h.CPUFlags = append([]string(nil), h.CPUFlags...)
		f(&h)
		return h
	}
	for _, c := range []struct {
		name     string
		from, at snapshotHost
		want     string // "" restorable, else a part of the reason
	}{
		{"same host", kvm, kvm, ""},
		{"more features here", kvm, with(kvm, func(h *snapshotHost) { h.CPUFlags = []string{"avx2", "avx512f", "fpu", "sse2"} }), ""},
		{"another vmm", kvm, with(kvm, func(h *snapshotHost) { h.VMM = "qemu" }), "taken by cloud-hypervisor on host a"},
		{"another version", kvm, with(kvm, func(h *snapshotHost) { h.VMMVersion, h.SnapshotVersion = "v54.0", "v54.0" }), "v54.0 on host a does not read"},
		{"a qemu patch release", tcg, with(tcg, func(h *snapshotHost) { h.VMMVersion = "7.2.23" }), ""},
		{"a version not known", kvm, with(kvm, func(h *snapshotHost) { h.SnapshotVersion = "" }), ""},
		{"another accelerator", kvm, with(kvm, func(h *snapshotHost) { h.Accel = "tcg" }), "under kvm on host a"},
		{"another vendor", kvm, with(kvm, func(h *snapshotHost) { h.CPUVendor = "AuthenticAMD" }), "GenuineIntel CPU (host a)"},
		{"fewer features", kvm, with(kvm, func(h *snapshotHost) { h.CPUFlags = []string{"fpu"} }), "lacks, which the guest may use: avx2 sse2"},
		{"mitigations another kernel chose", with(kvm, func(h *snapshotHost) { h.CPUFlags = []string{"avx2", "fpu", "pti", "sse2"} }), kvm, ""},
		{"an emulated cpu", tcg, with(tcg, func(h *snapshotHost) { h.CPUVendor, h.CPUFlags = "AuthenticAMD", nil }), ""},
	} {
		err := c.from.restorableOn(c.at)
		switch {
		case c.want == "" && err != nil:
			t.Errorf("%s: refused: %v", c.name, err)
		case c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)):
			t.Errorf("%s: %v, want an error saying %q", c.name, err, c.want)
		}
	}
	many := with(kvm, func(h *snapshotHost) { h.CPUFlags = strings.Fields("a b c d e f g h fpu") })
	if err := many.restorableOn(with(kvm, func(h *snapshotHost) { h.CPUFlags = []string{"fpu"} })); err == nil || !strings.HasSuffix(err.Error(), "a b c d e f and 2 more") {
		t.Errorf("eight missing features: %v", err)
	}
	if kvm.compatKey() == with(kvm, func(h *snapshotHost) { h.CPUFlags = []string{"fpu"} }).compatKey() {
		t.Error("kvm hosts with other CPU features share warm bases")
	}
	if tcg.compatKey() != with(tcg, func(h *snapshotHost) { h.CPUFlags = nil; h.Host = "b" }).compatKey() {
		t.Error("tcg hosts with other CPUs do not share warm bases")
	}
}

// TestNeedRestorableOn: placement reads another host's record of its
// VMMs (HostInfo.Compat) with the same rules.
func TestNeedRestorableOn(t *testing.T) {
	taken := snapshotHost{Host: "a", VMM: "qemu", VMMVersion: "7.2.22", SnapshotVersion: "7.2", Accel: "tcg"}
	compat := func(name, version string, vmms ...string) string {
		own := map[string]snapshotHost{}
		for _, v := range vmms {
			h := taken
			h.Host, h.VMM, h.VMMVersion, h.SnapshotVersion = name, v, version, version[:3]
			own[v] = h
		}
		b, err := json.Marshal(own)
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	sleeping := Need{VM: "box", vmm: "qemu", snapshot: &taken}
	for _, c := range []struct {
		name         string
		need         Need
		host, compat string
		want         string // "" restorable, else a part of the reason
	}{
		{"same version", sleeping, "b", compat("b", "7.2.23", "qemu", "cloud-hypervisor"), ""},
		{"another version", sleeping, "c", compat("c", "9.1.0", "qemu"),
			`host c cannot restore vm "box"'s memory: it was taken by qemu 7.2.22 on host a, and qemu 9.1.0 on host c does not read`},
		{"no such vmm", sleeping, "d", compat("d", "v53.0", "cloud-hypervisor"), `vm "box" runs under qemu, which host d does not have`},
		{"a host that records nothing", sleeping, "e", "", ""},
		{"nothing to restore", Need{VM: "box", vmm: "qemu"}, "c", compat("c", "9.1.0", "qemu"), ""},
	} {
		err := c.need.RestorableOn(c.host, c.compat)
		switch {
		case c.want == "" && err != nil:
			t.Errorf("%s: refused: %v", c.name, err)
		case c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)):
			t.Errorf("%s: got %v, want %q", c.name, err, c.want)
		}
	}
}
