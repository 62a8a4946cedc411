// Package bench measures den's headline numbers the same way every time:
// it starts a den daemon of its own on a temporary state dir, drives it
// through the API client, and reports medians with min and max over
// several runs, per VMM and accelerator.
package bench

import (
	"context"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/denhq/den/internal/hostinfo"
	"github.com/denhq/den/vmm"
)

// Options configures a run.
type Options struct {
	// Den is the den binary that runs the daemon.
	Den string
	// Images is the guest image directory.
	Images string
	// Image is the root filesystem benchmarked (default "minimal": under
	// TCG the Debian image's systemd dominates every figure; the E2B
	// figures need "debian", whose /bin/bash the SDK runs commands with).
	Image string
	// Runs per figure after a warm-up (default 5; quick: 3).
	Runs int
	// Quick skips the 2 GiB ratios and the gateway.
	Quick bool
	// NetworkOnly measures only the network figures (network.go).
	NetworkOnly bool
	// ScaleOnly measures only a host with many sleeping VMs
	// (sleepers.go).
	ScaleOnly bool
	// Cluster is a cluster config (den daemon --cluster) the scale
	// figures' daemon joins: its VMs are recorded in the cluster's
	// PostgreSQL and kept on its shared volume.
	Cluster string
	// ActivityOnly measures only what the guest's activity record
	// costs (activity.go).
	ActivityOnly bool
	// E2BOnly measures only the E2B figures: the official e2b SDK
	// against the daemon's --e2b-listen beside den's own path (e2b.go).
	E2BOnly bool
	// E2BSDK is the directory of bench.mjs and the SDK's node_modules
	// (default e2e/e2bsdk).
	E2BSDK string
	// Breakdown adds each timed operation's steps, as the daemon
	// traced them (breakdown.go).
	Breakdown bool
	// VMMs to benchmark ("qemu", "cloud-hypervisor"); default: every one
	// present.
	VMMs []string
	// Progress receives a line per step (nil: none).
	Progress func(string)
}

// Figure is one measured quantity.
type Figure struct {
	Name    string    `json:"name"`
	VMM     string    `json:"vmm"`
	Accel   string    `json:"accel"`
	Memory  string    `json:"memory"`
	Unit    string    `json:"unit"`
	Samples []float64 `json:"samples"`
	Median  float64   `json:"median"`
	Min     float64   `json:"min"`
	Max     float64   `json:"max"`
	// P99 is the 99th percentile (nearest rank), where a mode takes it.
	P99  float64 `json:"p99,omitempty"`
	Note string  `json:"note,omitempty"`
}

// Result is a whole run.
type Result struct {
	Host    string             `json:"host"`
	Date    time.Time          `json:"date"`
	Machine Machine            `json:"machine"`
	VMMs    map[string]string  `json:"vmm_versions"`
	Image   string             `json:"image"`
	Runs    int                `json:"runs"`
	Quick   bool               `json:"quick"`
	Figures []Figure           `json:"figures"`
	Ratios  map[string]float64 `json:"ratios"`
	// Breakdowns are the steps of each timed operation (with Breakdown).
	Breakdowns []Breakdown `json:"breakdowns,omitempty"`
	Took       string      `json:"took"`
}

// Machine describes the host.
type Machine struct {
	CPU    string `json:"cpu"`
	Cores  int    `json:"cores"`
	Memory string `json:"memory"`
	Kernel string `json:"kernel"`
	KVM    string `json:"kvm"`
}

// figure builds a Figure from durations.
func figure(name, vmmName, accel, mem string, ds []time.Duration) Figure {
	f := Figure{Name: name, VMM: vmmName, Accel: accel, Memory: mem, Unit: "ms"}
	for _, d := range ds {
		f.Samples = append(f.Samples, float64(d.Microseconds())/1000)
	}
	f.Median, f.Min, f.Max = stats(f.Samples)
	return f
}

// stats is the median, min and max of xs.
func stats(xs []float64) (med, lo, hi float64) {
	if len(xs) == 0 {
		return 0, 0, 0
	}
	s := append([]float64(nil), xs...)
	sort.Float64s(s)
	n := len(s)
	med = s[n/2]
	if n%2 == 0 {
		med = (s[n/2-1] + s[n/2]) / 2
	}
	return med, s[0], s[n-1]
}

// percentile is the p-th percentile of xs by nearest rank (with fewer
// than 100 samples, p99 is the largest).
func percentile(xs []float64, p float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := append([]float64(nil), xs...)
	sort.Float64s(s)
	i := int(math.Ceil(p/100*float64(len(s)))) - 1
	return s[max(0, min(i, len(s)-1))]
}

// find returns the median of a figure, 0 if absent.
func (r *Result) find(name, vmmName, mem string) float64 {
	for _, f := range r.Figures {
		if f.Name == name && f.VMM == vmmName && (mem == "" || f.Memory == mem) {
			return f.Median
		}
	}
	return 0
}

// paired is the median of a's samples over b's, run by run: for figures
// measured in turn, each pair taken back to back, so that the host's
// drift between runs cancels out. 0 if either is absent or they differ
// in count.
func (r *Result) paired(a, b, vmmName, mem string) float64 {
	var fa, fb *Figure
	for i := range r.Figures {
		f := &r.Figures[i]
		if f.VMM != vmmName || f.Memory != mem {
			continue
		}
		switch f.Name {
		case a:
			fa = f
		case b:
			fb = f
		}
	}
	if fa == nil || fb == nil || len(fa.Samples) != len(fb.Samples) {
		return 0
	}
	var q []float64
	for i, x := range fa.Samples {
		if fb.Samples[i] > 0 {
			q = append(q, x/fb.Samples[i])
		}
	}
	med, _, _ := stats(q)
	return med
}

// ratios computes the machine-independent ratios per VMM.
func (r *Result) ratios() {
	r.Ratios = map[string]float64{}
	for v := range r.VMMs {
		put := func(name string, a, b float64) {
			if a > 0 && b > 0 {
				r.Ratios[v+": "+name] = a / b
			}
		}
		put("wake / cold boot", r.find("wake to running", v, "512M"), r.find("create to exec-ready (cold boot)", v, "512M"))
		put("checkpoint(1 GiB) / checkpoint(512 MiB)", r.find("checkpoint (memory+disk)", v, "1G"), r.find("checkpoint (memory+disk)", v, "512M"))
		put("wake(1 GiB) / wake(512 MiB)", r.find("wake to running", v, "1G"), r.find("wake to running", v, "512M"))
		put("checkpoint(2 GiB) / checkpoint(512 MiB)", r.find("checkpoint (memory+disk)", v, "2G"), r.find("checkpoint (memory+disk)", v, "512M"))
		put("wake(2 GiB) / wake(512 MiB)", r.find("wake to running", v, "2G"), r.find("wake to running", v, "512M"))
		put("wake(2 GiB) / wake(512 MiB), in turn", r.find(wakeInTurn, v, "2G"), r.find(wakeInTurn, v, "512M"))
		// What the VMM alone spends more on the larger guest, sampled in
		// the same turns, and den's own time above it at each size.
		if f2, f5 := r.find(floorInTurn, v, "2G"), r.find(floorInTurn, v, "512M"); f2 > 0 && f5 > 0 {
			put("vmm floor(2 GiB) / vmm floor(512 MiB), in turn", f2, f5)
			put("(wake - vmm floor)(2 GiB) / (wake - vmm floor)(512 MiB), in turn",
				r.find(wakeInTurn, v, "2G")-f2, r.find(wakeInTurn, v, "512M")-f5)
		}
		r.e2bRatios(v, put)
		put("build step: activity record on / off", r.find(activityOn, v, "512M"), r.find(activityOff, v, "512M"))
		put("C build: activity record on / off", r.find(cBuildOn, v, "512M"), r.find(cBuildOff, v, "512M"))
		put("build step: activity record on / off, run by run", r.paired(activityOn, activityOff, v, "512M"), 1)
		put("C build: activity record on / off, run by run", r.paired(cBuildOn, cBuildOff, v, "512M"), 1)
		// What the record takes of the guest's CPU, over the work's time.
		put("build step: the agent's CPU with the record on, less off / time off",
			r.find(activityCPUOn, v, "512M")-r.find(activityCPUOff, v, "512M"), r.find(activityOff, v, "512M"))
		put("C build: the agent's CPU with the record on, less off / time off",
			r.find(cBuildCPUOn, v, "512M")-r.find(cBuildCPUOff, v, "512M"), r.find(cBuildOff, v, "512M"))
		if v == "qemu" {
			// Issue 15's goals: den's operations against the VMM's own floor.
			floor := r.find(floorName, v, "512M")
			put("wake to running / vmm floor", r.find("wake to running", v, "512M"), floor)
			// den create's answer: the VM running, its agent ready, as the
			// floor is timed (the figure to exec-ready adds a first exec).
			put("create (warm base) / vmm floor", r.find("create to running (warm base)", v, "512M"), floor)
			put("restore (memory+disk) / vmm floor", r.find("restore (memory+disk, to running)", v, "512M"), floor)
			// What a create or a fork asks of the guest beyond the floor,
			// first in a fresh QEMU and again (floor.go).
			put("vmm floor: new identity first / again", r.find(identityFirst, v, "512M"), r.find(identityAgain, v, "512M"))
		}
		put("checkpoint (memory+disk) / sleep", r.find("checkpoint (memory+disk)", v, "512M"), r.find("sleep", v, "512M"))
		put("TCP throughput tap / user-mode", r.find("guest to host TCP (tap)", v, ""), r.find("guest to host TCP (qemu user-mode)", v, ""))
		put("HTTP first byte sleeping / running", r.find("HTTP first byte through --http-listen (sleeping vm, woken)", v, ""), r.find("HTTP first byte through --http-listen (running vm)", v, ""))
		put("DNS through the vm's resolver (allow-list, again) / upstream", r.find("DNS answer through the vm's resolver, allow-list, again", v, ""), r.find("DNS answer from the upstream directly", v, ""))
		for _, f := range []string{"checkpoint (memory+disk)", "sleep", "wake to running", "restore (memory+disk, to running)"} {
			put(f+" with digests / without", r.find(f, v, "512M"), r.find(f, v+", no digests", "512M"))
			put(f+" RAM on tmpfs / on disk", r.find(f, v, "512M"), r.find(f, v+", RAM file on the state dir's disk", "512M"))
		}
	}
}

// timed runs f and returns how long it took.
func timed(f func() error) (time.Duration, error) {
	start := time.Now()
	err := f()
	return time.Since(start), err
}

// machineInfo reads the host's description.
func machineInfo(kvm string) Machine {
	m := Machine{KVM: kvm}
	m.CPU, m.Cores = hostinfo.CPU()
	if data, err := os.ReadFile("/proc/meminfo"); err == nil {
		m.Memory = strings.TrimSpace(strings.TrimPrefix(strings.SplitN(string(data), "\n", 2)[0], "MemTotal:"))
	}
	if out, err := exec.Command("uname", "-r").Output(); err == nil {
		m.Kernel = strings.TrimSpace(string(out))
	}
	return m
}

// Run runs every benchmark and returns the figures.
func Run(ctx context.Context, o Options) (Result, error) {
	if o.Image == "" {
		o.Image = "minimal"
	}
	if o.E2BOnly {
		if o.E2BSDK == "" {
			o.E2BSDK = filepath.Join("e2e", "e2bsdk")
		}
		// Before any daemon: node or the SDK missing is one line.
		if _, _, err := E2BCheck(o.E2BSDK); err != nil {
			return Result{}, err
		}
	}
	if o.Runs <= 0 {
		switch {
		case o.E2BOnly:
			o.Runs = 20 // p99 over at least 20 runs, --quick or not
		case o.Quick:
			o.Runs = 3
		default:
			o.Runs = 5
		}
	}
	if o.Progress == nil {
		o.Progress = func(string) {}
	}
	host, _ := os.Hostname()
	res := Result{Host: host, Date: time.Now().UTC(), VMMs: map[string]string{}, Image: o.Image, Runs: o.Runs, Quick: o.Quick}
	start := time.Now()
	vmms := o.VMMs
	if len(vmms) == 0 {
		vmms = available()
	}
	vs := variants(vmms, o.Quick)
	if o.ActivityOnly || o.ScaleOnly {
		vs = mainVariants(vmms)
	}
	if o.E2BOnly {
		vs = e2bVariants(vmms)
	}
	for _, v := range vs {
		// The figures set against the VMM's floor, which is sampled
		// between them (floor.go).
		var fl *floor
		if v.name == "qemu" && !o.NetworkOnly && !o.ScaleOnly && !o.E2BOnly && !o.ActivityOnly {
			var err error
			if fl, err = newFloor(ctx, o, mainFloor, o.Progress); err != nil {
				return res, fmt.Errorf("bench: %w", err)
			}
		}
		if o.NetworkOnly {
			res.VMMs[v.name] = vmmVersion(v.vmm)
			if k := vmm.DetectKVM(); k.Usable {
				res.Machine = machineInfo("kvm")
			} else {
				res.Machine = machineInfo("tcg: " + k.Reason)
			}
			break
		}
		d, err := startDaemon(ctx, o, v)
		if err != nil {
			fl.close()
			return res, fmt.Errorf("bench %s: %w", v.name, err)
		}
		d.floor = fl
		info, err := d.client.Info(ctx)
		if err == nil {
			res.Machine = machineInfo(info.Accel + ": " + info.AccelNote)
			res.VMMs[v.name] = d.version
		}
		var figs []Figure
		switch {
		case o.ScaleOnly:
			figs, err = d.sleepers(ctx, o, v, info.Accel, nil, func(s string) { o.Progress(v.name + ": " + s) })
		case o.ActivityOnly:
			figs, err = d.activityCost(ctx, o, info.Accel, func(s string) { o.Progress(v.name + ": " + s) })
		case o.E2BOnly:
			figs, err = d.e2b(ctx, o, info.Accel, func(s string) { o.Progress(v.name + ": " + s) })
		default:
			figs, err = d.runAll(ctx, o, v, info.Accel)
		}
		res.Figures = append(res.Figures, figs...)
		for _, b := range d.traces.breakdowns() {
			if v.name != v.vmm {
				b.VMM = v.name
			}
			res.Breakdowns = append(res.Breakdowns, b)
		}
		d.stop()
		if fl != nil {
			res.Figures = append(res.Figures, fl.figures()...)
			fl.close()
		}
		if err != nil {
			return res, fmt.Errorf("bench %s: %w", v.name, err)
		}
	}
	if slices.Contains(vmms, "qemu") && !o.ScaleOnly && !o.E2BOnly && !o.ActivityOnly {
		figs, err := networkFigures(ctx, o, o.Progress)
		res.Figures = append(res.Figures, figs...)
		if err != nil && o.NetworkOnly {
			return res, fmt.Errorf("bench network: %w", err)
		}
		if err != nil {
			// The figures above are kept: a host without TAP devices
			// for the VMMs' user still gets them.
			o.Progress("bench network: " + err.Error() + " (the network figures are left out)")
		}
	}
	res.ratios()
	res.Took = time.Since(start).Round(time.Second).String()
	return res, nil
}

// variant is a daemon configuration measured: a VMM, and for the
// comparison runs the knob that turns off what makes it fast.
type variant struct {
	name  string   // as the figures show it
	vmm   string   // den daemon --vmm
	flags []string // extra daemon flags
	// compare: only the memory-size figures (checkpoint, restore, sleep,
	// wake), to set beside the main run's.
	compare bool
	// storage: a comparison variant that takes the idle checkpoint's
	// storage figure too.
	storage bool
}

// variants are the runs for the given VMMs: each VMM as den runs it,
// without digests (what verified checkpoints cost), QEMU with its RAM
// file on the state dir's disk (what the tmpfs saves), and (unless quick)
// without x-ignore-shared (QEMU) or with Copy restores (Cloud
// Hypervisor).
func variants(vmms []string, quick bool) []variant {
	var out []variant
	for _, v := range vmms {
		out = append(out, variant{name: v, vmm: v},
			variant{name: v + ", no digests", vmm: v, flags: []string{"--no-digests"}, compare: true})
		if v == "qemu" {
			out = append(out, variant{name: "qemu, RAM file on the state dir's disk", vmm: v, flags: []string{"--ram-dir", "{state}/run-ram"}, compare: true},
				variant{name: "qemu, memory in files of its own (not by content)", vmm: v, flags: []string{"--memory-files"}, compare: true, storage: true})
		}
		if quick {
			continue
		}
		switch v {
		case "qemu":
			out = append(out, variant{name: "qemu, RAM in the stream (no x-ignore-shared)", vmm: v, flags: []string{"--qemu-stream-ram"}, compare: true})
		case "cloud-hypervisor":
			out = append(out, variant{name: "cloud-hypervisor, Copy restore", vmm: v, flags: []string{"--restore-copy"}, compare: true})
		}
	}
	return out
}

// e2bVariants are the E2B mode's daemons: each VMM as den runs it, with
// E2B's API on a free loopback port.
// mainVariants are the runs of each VMM as den runs it.
func mainVariants(vmms []string) []variant {
	var out []variant
	for _, v := range vmms {
		out = append(out, variant{name: v, vmm: v})
	}
	return out
}

func e2bVariants(vmms []string) []variant {
	var out []variant
	for _, v := range vmms {
		out = append(out, variant{name: v, vmm: v, flags: []string{"--e2b-listen", "127.0.0.1:0"}})
	}
	return out
}

// available lists the VMMs present on this host: QEMU always, Cloud
// Hypervisor when DEN_CH_BINARY or PATH has it.
func available() []string {
	out := []string{"qemu"}
	if b := os.Getenv("DEN_CH_BINARY"); b != "" {
		out = append(out, "cloud-hypervisor")
	} else if _, err := exec.LookPath("cloud-hypervisor"); err == nil {
		out = append(out, "cloud-hypervisor")
	}
	return out
}

// ResultsPath is where a result is kept: bench/results/<host>-<date>.
func ResultsPath(dir string, r Result) string {
	return filepath.Join(dir, fmt.Sprintf("%s-%s", r.Host, r.Date.Format("2006-01-02T150405")))
}
