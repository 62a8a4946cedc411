package machine

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/denhq/den/internal/size"
)

// Host memory pressure: the kernel's pressure stall information (PSI,
// /proc/pressure/memory) and MemAvailable (/proc/meminfo). Above the
// thresholds the watcher puts the least recently active idle VM to sleep
// (the same choice and the same sleep as admission), one at a time with
// a cooldown between, until pressure falls.

// Pressure is one reading of the host's memory pressure.
type Pressure struct {
	// SomeAvg10 is PSI's memory "some avg10": the share (percent) of the
	// last 10 s in which some task stalled on memory; < 0 when unknown.
	SomeAvg10 float64
	// Available is MemAvailable in bytes; < 0 when unknown.
	Available int64
	// Total is MemTotal in bytes; < 0 when unknown.
	Total int64
}

// PressureSource reads the host's memory pressure (tests inject one).
type PressureSource func() (Pressure, error)

const (
	psiMemory = "/proc/pressure/memory"
	meminfo   = "/proc/meminfo"
)

// HostPressure reads /proc/pressure/memory and /proc/meminfo; a kernel
// without PSI gives SomeAvg10 -1.
func HostPressure() (Pressure, error) {
	p := Pressure{SomeAvg10: -1}
	total, avail, err := hostMeminfo()
	if err != nil {
		return p, err
	}
	p.Total, p.Available = total, avail
	if some, err := readPSISome(psiMemory); err == nil {
		p.SomeAvg10 = some
	}
	return p, nil
}

// HostMemTotal is the host's MemTotal in bytes.
func HostMemTotal() (int64, error) {
	total, _, err := hostMeminfo()
	return total, err
}

// hostMeminfo reads MemTotal and MemAvailable.
func hostMeminfo() (total, avail int64, err error) {
	data, err := os.ReadFile(meminfo)
	if err != nil {
		return 0, 0, fmt.Errorf("host memory: %w", err)
	}
	return parseMeminfo(data)
}

func parseMeminfo(data []byte) (total, avail int64, err error) {
	total, avail = -1, -1
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 2 {
			continue
		}
		n, err := strconv.ParseInt(f[1], 10, 64)
		if err != nil {
			continue
		}
		if len(f) > 2 && f[2] == "kB" {
			n <<= 10
		}
		switch f[0] {
		case "MemTotal:":
			total = n
		case "MemAvailable:":
			avail = n
		}
	}
	if total < 0 || avail < 0 {
		return 0, 0, fmt.Errorf("host memory: no MemTotal or MemAvailable in %s", meminfo)
	}
	return total, avail, nil
}

// readPSISome reads "some avg10" of a PSI file.
func readPSISome(path string) (float64, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return -1, fmt.Errorf("memory pressure: %w", err)
	}
	return parsePSISome(data)
}

func parsePSISome(data []byte) (float64, error) {
	for line := range strings.SplitSeq(string(data), "\n") {
		f := strings.Fields(line)
		if len(f) == 0 || f[0] != "some" {
			continue
		}
		for _, kv := range f[1:] {
			if v, ok := strings.CutPrefix(kv, "avg10="); ok {
				return strconv.ParseFloat(v, 64)
			}
		}
	}
	return -1, fmt.Errorf("memory pressure: no \"some avg10\" in %s", psiMemory)
}

// pressureLimits are the watcher's thresholds, resolved from the config.
type pressureLimits struct {
	some         float64 // < 0: ignored
	minAvailable int64   // < 0: ignored; 0: DefaultMinAvailablePercent of the reading's Total
}

func (mb *memoryBudget) pressureLimits() pressureLimits {
	c := mb.m.cfg.Memory
	l := pressureLimits{some: c.PressureSome, minAvailable: c.MinAvailable}
	if l.some == 0 {
		l.some = DefaultPressureSome
	}
	return l
}

// pressureReason says why p is pressure ("" when it is not).
func (l pressureLimits) reason(p Pressure) string {
	if l.some >= 0 && p.SomeAvg10 >= 0 && p.SomeAvg10 >= l.some {
		return fmt.Sprintf("memory pressure: PSI some avg10 %.1f%% (threshold %.1f%%)", p.SomeAvg10, l.some)
	}
	minAvail := l.minAvailable
	if minAvail == 0 && p.Total > 0 {
		minAvail = p.Total * DefaultMinAvailablePercent / 100
	}
	if minAvail > 0 && p.Available >= 0 && p.Available < minAvail {
		return fmt.Sprintf("memory pressure: MemAvailable %s (threshold %s)", size.Format(p.Available), size.Format(minAvail))
	}
	return ""
}

// watchPressure reads the host's memory pressure every interval until
// the Manager closes; under pressure it puts one VM to sleep, then waits
// out the cooldown before the next.
func (mb *memoryBudget) watchPressure() {
	c := mb.m.cfg.Memory
	if c.PressureInterval < 0 {
		return
	}
	interval, cooldown, src := c.PressureInterval, c.PressureCooldown, c.Pressure
	if interval == 0 {
		interval = DefaultPressureInterval
	}
	if cooldown <= 0 {
		cooldown = DefaultPressureCooldown
	}
	if src == nil {
		src = HostPressure
	}
	limits := mb.pressureLimits()
	tick := time.NewTicker(interval)
	defer tick.Stop()
	var lastSleep, lastWarn time.Time
	for {
		select {
		case <-mb.m.closed:
			return
		case <-tick.C:
		}
		p, err := src()
		if err != nil {
			mb.m.log.Debug("den: memory pressure unknown", "err", err)
			continue
		}
		why := limits.reason(p)
		if why == "" || time.Since(lastSleep) < cooldown {
			continue
		}
		name, cannot := mb.relievePressure(why)
		if name != "" {
			lastSleep = time.Now()
			continue
		}
		if time.Since(lastWarn) >= cooldown {
			lastWarn = time.Now()
			mb.m.log.Warn("den: "+why+"; no vm can be put to sleep", "cannot", cannot)
		}
	}
}

// relievePressure puts the least recently active idle VM to sleep; it
// returns its name, or why none could sleep.
func (mb *memoryBudget) relievePressure(why string) (string, string) {
	// A sleep under way when the Manager closes finishes: Close waits
	// for it.
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := mb.acquireAdmission(ctx); err != nil {
		return "", err.Error()
	}
	defer mb.releaseAdmission()
	use := mb.memoryUse(ctx, "")
	cannot := map[string]string{}
	if name, ok := mb.sleepOne(ctx, use.running, cannot, why); ok {
		return name, ""
	}
	var parts []string
	for _, r := range use.running {
		parts = append(parts, r.name+" ("+cannot[r.name]+")")
	}
	if len(parts) == 0 {
		return "", "no vm is running"
	}
	return "", strings.Join(parts, ", ")
}
