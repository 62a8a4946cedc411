//go:build linux

package guest

import (
	"bufio"
	"bytes"
	"encoding/hex"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/denhq/den/agent"
)

// userHZ is the unit of /proc/stat's CPU times (USER_HZ, 100 on Linux).
const userHZ = 100

// pfKthread is PF_KTHREAD in /proc/PID/stat's flags.
const pfKthread = 0x00200000

// procScanTimeout bounds how long an activity request waits for the
// process count.
const procScanTimeout = 500 * time.Millisecond

// activity reads the activity signals from procfs.
func (s *Server) activity() (agent.Activity, error) {
	a, err := readActivity(s.sys.ProcDir)
	if err != nil {
		return a, err
	}
	a.AgentCPU, _ = readSelfCPU(filepath.Join(s.sys.ProcDir, "self", "stat"))
	a.Processes = s.procs.count(s.sys.ProcDir, procScanTimeout)
	a.Sessions = int(s.sessions.Load())
	a.Forwards = int(s.forwards.Load())
	a.Leases = s.leases.List()
	return a, nil
}

func readActivity(proc string) (agent.Activity, error) {
	a := agent.Activity{Time: time.Now()}
	if err := readStat(filepath.Join(proc, "stat"), &a); err != nil {
		return a, err
	}
	if data, err := os.ReadFile(filepath.Join(proc, "loadavg")); err == nil {
		if f := strings.Fields(string(data)); len(f) > 0 {
			a.Load1, _ = strconv.ParseFloat(f[0], 64)
		}
	}
	for _, f := range []string{"net/tcp", "net/tcp6"} {
		est, remote, err := countTCP(filepath.Join(proc, f))
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			return a, err
		}
		a.TCPEstablished += est
		a.TCPRemote += remote
	}
	return a, nil
}

func readStat(path string, a *agent.Activity) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("activity: %w", err)
	}
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 2 {
			continue
		}
		switch {
		case f[0] == "cpu":
			// user nice system idle iowait irq softirq steal (guest time
			// is already in user).
			var total, idle uint64
			for i := 1; i < len(f) && i <= 8; i++ {
				v, _ := strconv.ParseUint(f[i], 10, 64)
				total += v
				if i == 4 || i == 5 {
					idle += v
				}
			}
			a.CPUTotal = ticks(total)
			a.CPUBusy = ticks(total - idle)
		case strings.HasPrefix(f[0], "cpu"):
			a.CPUs++
		case f[0] == "procs_running":
			a.ProcsRunning, _ = strconv.Atoi(f[1])
		}
	}
	return nil
}

// readSelfCPU is a process's user and system CPU time from its
// /proc/PID/stat (fields 14 and 15, counted after the command name,
// which may hold spaces and parentheses).
func readSelfCPU(path string) (time.Duration, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return 0, fmt.Errorf("agent cpu: %w", err)
	}
	end := bytes.LastIndexByte(data, ')')
	if end < 0 {
		return 0, fmt.Errorf("agent cpu: %s: no command name", path)
	}
	f := strings.Fields(string(data[end+1:]))
	// f[0] is field 3 (state): utime is field 14, stime field 15.
	if len(f) < 13 {
		return 0, fmt.Errorf("agent cpu: %s: %d fields", path, len(f)+2)
	}
	utime, err1 := strconv.ParseUint(f[11], 10, 64)
	stime, err2 := strconv.ParseUint(f[12], 10, 64)
	if err := errors.Join(err1, err2); err != nil {
		return 0, fmt.Errorf("agent cpu: %s: %w", path, err)
	}
	return ticks(utime + stime), nil
}

func ticks(n uint64) time.Duration { return time.Duration(n) * (time.Second / userHZ) }

// procCounter counts processes in the background: reading /proc/PID/stat
// can block for as long as the task is stuck (in execve on a hung FUSE
// file system, say), and a blocked read cannot be cancelled. At most one
// scan runs; a request that finds one running, or that times out, gets
// the last count.
type procCounter struct {
	mu      sync.Mutex
	running bool
	last    int
	counted bool
}

// count returns the number of processes, or -1 before any scan finished.
func (pc *procCounter) count(proc string, timeout time.Duration) int {
	pc.mu.Lock()
	if !pc.counted {
		pc.last = -1
	}
	if pc.running {
		defer pc.mu.Unlock()
		return pc.last
	}
	pc.running = true
	pc.mu.Unlock()
	ch := make(chan int, 1)
	go func() {
		n := countProcesses(proc)
		pc.mu.Lock()
		pc.last, pc.running, pc.counted = n, false, true
		pc.mu.Unlock()
		ch <- n
	}()
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case n := <-ch:
		return n
	case <-t.C:
		pc.mu.Lock()
		defer pc.mu.Unlock()
		return pc.last
	}
}

// countProcesses counts user-space processes (not kernel threads).
func countProcesses(proc string) int {
	ents, err := os.ReadDir(proc)
	if err != nil {
		return 0
	}
	n := 0
	for _, e := range ents {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		data, err := os.ReadFile(filepath.Join(proc, e.Name(), "stat"))
		if err != nil {
			continue
		}
		// pid (comm) state ppid pgrp session tty_nr tpgid flags ...
		i := bytes.LastIndexByte(data, ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(string(data[i+1:]))
		if len(f) < 7 {
			continue
		}
		flags, _ := strconv.ParseUint(f[6], 10, 64)
		if flags&pfKthread != 0 {
			continue
		}
		n++
	}
	return n
}

// countTCP counts established connections in /proc/net/tcp{,6}, and
// those whose peer is not loopback.
func countTCP(path string) (est, remote int, err error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return 0, 0, fmt.Errorf("activity: %w", err)
	}
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Scan() // header
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 4 || f[3] != "01" { // TCP_ESTABLISHED
			continue
		}
		est++
		addr, _, _ := strings.Cut(f[2], ":")
		if ip, ok := parseProcIP(addr); !ok || !ip.Unmap().IsLoopback() {
			remote++
		}
	}
	return est, remote, nil
}

// parseProcIP decodes /proc/net/tcp's address: 32-bit words in host
// (little-endian) order.
func parseProcIP(s string) (netip.Addr, bool) {
	b, err := hex.DecodeString(s)
	if err != nil || (len(b) != 4 && len(b) != 16) {
		return netip.Addr{}, false
	}
	for i := 0; i < len(b); i += 4 {
		b[i], b[i+1], b[i+2], b[i+3] = b[i+3], b[i+2], b[i+1], b[i]
	}
	ip, ok := netip.AddrFromSlice(b)
	return ip, ok
}
