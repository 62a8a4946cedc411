package bench

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/denhq/den/api"
	"github.com/denhq/den/image"
)

// buildStep is the record's worst case, timed with the activity record
// on and off: every step a new process writing a file under /root, 150
// steps of sh and cat, and nothing else.
const buildStep = `mkdir -p /root/bench && i=0; while [ $i -lt 150 ]; do i=$((i+1)); sh -c "echo $i | cat > /root/bench/f$((i%16))"; done`

// cBuildFiles is how many C files cBuild compiles.
const cBuildFiles = 12

// cBuildSetup writes a small C project under /root/cbuild: cBuildFiles
// files of a few functions each and a Makefile.
var cBuildSetup = func() string {
	var b strings.Builder
	b.WriteString("mkdir -p /root/cbuild && cd /root/cbuild && ")
	objs := make([]string, 0, cBuildFiles)
	for i := range cBuildFiles {
		fmt.Fprintf(&b, `printf '#include <string.h>\nint f%d(const char *s){int n=0;for(;*s;s++)n=n*31+*s;return n+%d;}\nint g%d(int x){return x*x+f%d("den");}\nsize_t h%d(const char *s){return strlen(s)+%d;}\n' > f%d.c && `, i, i, i, i, i, i, i)
		objs = append(objs, fmt.Sprintf("f%d.o", i))
	}
	fmt.Fprintf(&b, `printf 'int main(void){return 0;}\n' > main.c && printf 'OBJS=main.o %s\nprog: $(OBJS)\n\tcc -o prog $(OBJS)\n%%%%.o: %%%%.c\n\tcc -O1 -c $< -o $@\n' > Makefile`, strings.Join(objs, " "))
	return b.String()
}()

// cBuild is a build as it happens: make compiling the project anew, cc
// running its compiler, assembler and linker for each file.
const cBuild = `cd /root/cbuild && make -B -s`

// Names of the activity figures.
const (
	activityOn     = "build step, activity record on (150 processes writing files)"
	activityOff    = "build step, activity record off (150 processes writing files)"
	activityCPUOn  = "build step, the guest agent's CPU time, record on"
	activityCPUOff = "build step, the guest agent's CPU time, record off"
	cBuildOn       = "C build, activity record on (make of 13 files with cc, debian)"
	cBuildOff      = "C build, activity record off (make of 13 files with cc, debian)"
	cBuildCPUOn    = "C build, the guest agent's CPU time, record on"
	cBuildCPUOff   = "C build, the guest agent's CPU time, record off"
)

// onOff is what recordOnOff measured: the work's time, and the guest
// agent's CPU time during it, with the record on and off.
type onOff struct {
	on, off, cpuOn, cpuOff []time.Duration
}

// activityCost times buildStep in one VM, and cBuild in a debian VM
// (when the image is there), with the guest's activity record on and off
// in turn, run after run, each first in every other run (this host's
// speed drifts over minutes). The guest agent's CPU time during each run
// is a figure too: what the record costs the guest, free of the host's
// drift, which moves the times by more than the record does.
func (d *daemon) activityCost(ctx context.Context, o Options, accel string, say func(string)) ([]Figure, error) {
	m, err := d.recordOnOff(ctx, o, "activity", "", "", buildStep, "build step", say)
	if err != nil {
		return nil, err
	}
	figs := []Figure{figure(activityOn, d.vmm, accel, "512M", m.on), figure(activityOff, d.vmm, accel, "512M", m.off),
		figure(activityCPUOn, d.vmm, accel, "512M", m.cpuOn), figure(activityCPUOff, d.vmm, accel, "512M", m.cpuOff)}
	if err := image.Dir(o.Images).Check(image.Debian); err != nil {
		say(fmt.Sprintf("no C build with the activity record: %v", err))
		return figs, nil
	}
	m, err = d.recordOnOff(ctx, o, "activity-cc", image.Debian, cBuildSetup, cBuild, "C build", say)
	if err != nil {
		return figs, err
	}
	return append(figs, figure(cBuildOn, d.vmm, accel, "512M", m.on), figure(cBuildOff, d.vmm, accel, "512M", m.off),
		figure(cBuildCPUOn, d.vmm, accel, "512M", m.cpuOn), figure(cBuildCPUOff, d.vmm, accel, "512M", m.cpuOff)), nil
}

// agentPID finds the guest agent's pid by its program (a shell loop: the
// minimal image has no pgrep, and its agent is pid 1, named init).
const agentPID = `for p in /proc/[0-9]*; do case "$(readlink $p/exe 2>/dev/null)" in */den-agent) echo ${p#/proc/}; break;; esac; done`

// withAgentCPU runs work in the guest after printing the agent's user
// and system ticks (/proc/PID/stat's 14th and 15th fields); agentAfter
// prints them again once the agent has read the work's last events (it
// reads them in batches, up to 200 ms late).
func withAgentCPU(work string, pid int) string {
	return ticksLine(pid) + "; ( " + work + " ) >/dev/null"
}

func agentAfter(pid int) string {
	return "sleep 0.5; " + ticksLine(pid)
}

// ticksLine prints the agent's ticks for agentTicks.
func ticksLine(pid int) string {
	return fmt.Sprintf("echo \"den-agent-ticks $(cut -d' ' -f14,15 /proc/%d/stat)\"", pid)
}

// agentTicks reads withAgentCPU's and agentAfter's lines: the agent's
// CPU time between them, at the guest kernel's 100 ticks a second (x86
// Debian's USER_HZ).
func agentTicks(before, after string) (time.Duration, error) {
	var t [2]int64
	for i, out := range []string{before, after} {
		j := strings.LastIndex(out, "den-agent-ticks ")
		if j < 0 {
			return 0, fmt.Errorf("no agent CPU time in %q", out)
		}
		var u, s int64
		if _, err := fmt.Sscanf(out[j:], "den-agent-ticks %d %d", &u, &s); err != nil {
			return 0, fmt.Errorf("agent CPU time in %q: %w", out[j:], err)
		}
		t[i] = u + s
	}
	return time.Duration(t[1]-t[0]) * 10 * time.Millisecond, nil
}

// recordOnOff makes VM name (of img, "" the default) and runs setup in
// it, then times work with the record on and off in turn, after a
// warm-up (the programs in the page cache).
func (d *daemon) recordOnOff(ctx context.Context, o Options, name, img, setup, work, what string, say func(string)) (m onOff, err error) {
	if _, err := d.client.CreateVM(ctx, api.CreateRequest{Name: name, Image: img, IdleTimeout: "0"}, nil); err != nil {
		return m, err
	}
	defer d.client.RemoveVM(context.WithoutCancel(ctx), name, true)
	for _, cmd := range []string{setup, work} {
		if cmd == "" {
			continue
		}
		if out, err := d.exec(ctx, name, cmd); err != nil {
			return m, fmt.Errorf("%s: %w: %s", what, err, out)
		}
	}
	out, err := d.exec(ctx, name, agentPID)
	pid, perr := strconv.Atoi(strings.TrimSpace(out))
	if err != nil || perr != nil {
		return m, fmt.Errorf("%s: the guest agent's pid: %w %v: %q", what, err, perr, out)
	}
	work = withAgentCPU(work, pid)
	// The agent's CPU time runs to a moment after the work (agentAfter),
	// in a second exec, which costs the agent the same with the record on
	// or off.
	for i := 0; i < o.Runs; i++ {
		say(fmt.Sprintf("%s with the activity record on and off (%d/%d)", what, i+1, o.Runs))
		for j, rec := range []bool{i%2 == 0, i%2 != 0} {
			if _, err := d.client.SetActivityRecord(ctx, name, rec); err != nil {
				return m, err
			}
			var out string
			t, err := timed(func() (err error) { out, err = d.exec(ctx, name, work); return err })
			if err != nil {
				return m, fmt.Errorf("%s (record %v, %d): %w", what, rec, j, err)
			}
			after, err := d.exec(ctx, name, agentAfter(pid))
			if err != nil {
				return m, fmt.Errorf("%s (record %v, %d): %w", what, rec, j, err)
			}
			cpu, err := agentTicks(out, after)
			if err != nil {
				return m, fmt.Errorf("%s (record %v, %d): %w", what, rec, j, err)
			}
			if rec {
				m.on, m.cpuOn = append(m.on, t), append(m.cpuOn, cpu)
			} else {
				m.off, m.cpuOff = append(m.off, t), append(m.cpuOff, cpu)
			}
		}
	}
	_, _ = d.client.SetActivityRecord(ctx, name, true)
	return m, nil
}
