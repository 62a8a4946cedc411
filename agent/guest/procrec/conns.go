//go:build linux

package procrec

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"fmt"
	"net/netip"
	"os"
	"strings"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"

	"github.com/denhq/den/agent"
)

// connRingBytes is the size of the kernel ring the connect hooks write to
// (a power of two): 3,640 connections between two reads (64 bytes and a
// header of 8 each); the hooks count those the full ring refused.
const connRingBytes = 256 << 10

// connEvent is what the connect hooks write, 64 bytes:
//
//	0  u64 pid_tgid   8  u32 uid   12 u32 family (AF_INET, AF_INET6)
//	16 [16]byte address (IPv4 in the first 4 bytes)
//	32 u32 port (network order in the low 16 bits)   36 u32 socket type
//	40 [16]byte comm   56 u64 time (CLOCK_MONOTONIC ns)
const connEventLen = 64

// connWatch is the connection record: a cgroup connect hook for IPv4
// and one for IPv6 on the cgroup2 root, writing to one ring.
type connWatch struct {
	bpfSet
	cgroup  string
	mounted bool // cgroup was mounted for the record: close unmounts it
	attach  []ebpf.AttachType
}

// WatchConnections records each connect(2) to an address outside the
// guest (TCP connections and connected UDP sockets: the process, its
// uid, the address and port), from two eBPF programs on the kernel's
// cgroup connect hooks. They run on the cgroup2 hierarchy's root, which
// is mounted for the purpose if it is not yet.
func (r *Recorder) WatchConnections() error {
	cg, mounted, err := cgroup2Root()
	if err != nil {
		return fmt.Errorf("connection record: %w", err)
	}
	w := &connWatch{cgroup: cg, mounted: mounted}
	if err := w.maps("den_conns", connRingBytes); err != nil {
		w.close()
		return fmt.Errorf("connection record: %w", err)
	}
	for _, a := range []ebpf.AttachType{ebpf.AttachCGroupInet4Connect, ebpf.AttachCGroupInet6Connect} {
		p, err := ebpf.NewProgram(&ebpf.ProgramSpec{
			Name:         "den_connect",
			Type:         ebpf.CGroupSockAddr,
			AttachType:   a,
			Instructions: connectProgram(w.ring.FD(), w.lost.FD(), a == ebpf.AttachCGroupInet6Connect),
			License:      "GPL",
		})
		if err != nil {
			w.close()
			return fmt.Errorf("connection record: load the connect hook: %w", err)
		}
		w.progs, w.attach = append(w.progs, p), append(w.attach, a)
	}
	if err := w.reader(); err != nil {
		w.close()
		return fmt.Errorf("connection record: %w", err)
	}
	if err := w.hook(true); err != nil {
		w.close()
		return err
	}
	r.mu.Lock()
	r.conns = w
	r.mu.Unlock()
	r.kick()
	return nil
}

// connectProgram is the connect hook: it writes a connEvent to the ring
// (or counts it in lost when the ring is full) and lets the connection
// go on (returns 1). ctx is a bpf_sock_addr: user_ip4 at 4, user_ip6 at
// 8, user_port at 24, type at 32.
func connectProgram(ring, lost int, v6 bool) asm.Instructions {
	const ev = -connEventLen // the event, on the stack
	in := asm.Instructions{
		asm.Mov.Reg(asm.R6, asm.R1),
		asm.FnGetCurrentPidTgid.Call(),
		asm.StoreMem(asm.RFP, ev, asm.R0, asm.DWord),
		asm.FnGetCurrentUidGid.Call(),
		asm.StoreMem(asm.RFP, ev+8, asm.R0, asm.Word),
	}
	if v6 {
		in = append(in, asm.StoreImm(asm.RFP, ev+12, unix.AF_INET6, asm.Word))
		for i := int16(0); i < 4; i++ {
			in = append(in,
				asm.LoadMem(asm.R1, asm.R6, 8+4*i, asm.Word),
				asm.StoreMem(asm.RFP, ev+16+4*i, asm.R1, asm.Word))
		}
	} else {
		in = append(in,
			asm.StoreImm(asm.RFP, ev+12, unix.AF_INET, asm.Word),
			asm.LoadMem(asm.R1, asm.R6, 4, asm.Word),
			asm.StoreMem(asm.RFP, ev+16, asm.R1, asm.Word),
			asm.StoreImm(asm.RFP, ev+20, 0, asm.Word),
			asm.StoreImm(asm.RFP, ev+24, 0, asm.Word),
			asm.StoreImm(asm.RFP, ev+28, 0, asm.Word))
	}
	return append(append(in,
		asm.LoadMem(asm.R1, asm.R6, 24, asm.Word),
		asm.StoreMem(asm.RFP, ev+32, asm.R1, asm.Word),
		asm.LoadMem(asm.R1, asm.R6, 32, asm.Word),
		asm.StoreMem(asm.RFP, ev+36, asm.R1, asm.Word),
		asm.Mov.Reg(asm.R1, asm.RFP),
		asm.Add.Imm(asm.R1, ev+40),
		asm.Mov.Imm(asm.R2, 16),
		asm.FnGetCurrentComm.Call(),
		asm.FnKtimeGetNs.Call(),
		asm.StoreMem(asm.RFP, ev+56, asm.R0, asm.DWord),
		asm.Mov.Reg(asm.R2, asm.RFP),
		asm.Add.Imm(asm.R2, ev),
		asm.Mov.Imm(asm.R3, connEventLen),
	), output(ring, lost, ev, 1)...)
}

// hook attaches the programs to the cgroup, or detaches them.
func (w *connWatch) hook(on bool) error {
	if !on {
		return w.unhook()
	}
	for i, p := range w.progs {
		l, err := link.AttachCgroup(link.CgroupOptions{Path: w.cgroup, Attach: w.attach[i], Program: p})
		if err != nil {
			_ = w.hook(false)
			return fmt.Errorf("connection record: attach the connect hook to %s: %w", w.cgroup, err)
		}
		w.links = append(w.links, l)
	}
	return nil
}

func (w *connWatch) close() {
	w.release()
	if w.mounted {
		_ = unix.Unmount(w.cgroup, unix.MNT_DETACH)
	}
}

// cgroup2Root finds the cgroup2 hierarchy's mount, or mounts it under
// /run (mounted says so).
func cgroup2Root() (dir string, mounted bool, err error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return "", false, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		// ID PARENT MAJ:MIN ROOT MOUNTPOINT OPTIONS ... - FSTYPE SOURCE ...
		pre, post, ok := strings.Cut(sc.Text(), " - ")
		fields, typ := strings.Fields(pre), strings.Fields(post)
		if ok && len(fields) >= 5 && len(typ) > 0 && typ[0] == "cgroup2" && fields[3] == "/" {
			return unescapeMount(fields[4]), false, nil
		}
	}
	dir = "/run/den-agent/cgroup2"
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", false, err
	}
	if err := unix.Mount("cgroup2", dir, "cgroup2", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
		return "", false, fmt.Errorf("mount cgroup2 on %s: %w", dir, err)
	}
	return dir, true, nil
}

// unescapeMount undoes mountinfo's octal escapes (\040 for a space).
func unescapeMount(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			var v byte
			ok := true
			for _, c := range s[i+1 : i+4] {
				if c < '0' || c > '7' {
					ok = false
				}
				v = v*8 + byte(c-'0')
			}
			if ok {
				b.WriteByte(v)
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// decodeConn reads one connect hook record; ok is false for a short
// one or a connection that stays inside the guest.
func decodeConn(b []byte) (c kernelEvent, ok bool) {
	if len(b) < connEventLen {
		return c, false
	}
	le := binary.LittleEndian
	var addr netip.Addr
	switch le.Uint32(b[12:]) {
	case unix.AF_INET:
		addr = netip.AddrFrom4([4]byte(b[16:20]))
	case unix.AF_INET6:
		addr = netip.AddrFrom16([16]byte(b[16:32])).Unmap()
	default:
		return c, false
	}
	if addr.IsLoopback() || addr.IsUnspecified() {
		return c, false
	}
	c = kernelEvent{kind: recConnect, pid: uint32(le.Uint64(b[0:]) >> 32), val: le.Uint32(b[8:]), mono: int64(le.Uint64(b[56:])),
		addr: netip.AddrPortFrom(addr, binary.BigEndian.Uint16(b[32:34])).String(), proto: "tcp", comm: cString(b[40:56])}
	if le.Uint32(b[36:]) == unix.SOCK_DGRAM {
		c.proto = "udp"
	}
	return c, true
}

// cString is b up to its first NUL.
func cString(b []byte) string {
	if i := bytes.IndexByte(b, 0); i >= 0 {
		b = b[:i]
	}
	return string(b)
}

// conn records one connect, which happened at at (r.mu held).
func (r *Recorder) conn(c kernelEvent, at time.Time) {
	pid := int(c.pid)
	ev := agent.ProcEvent{Time: at, Kind: agent.ProcConnect, PID: pid, UID: int(c.val),
		Addr: c.addr, Proto: c.proto, Comm: c.comm, Session: r.sessionOf(pid)}
	if p := r.live[pid]; p != nil {
		ev.PPID = p.ppid
	}
	r.add(ev)
}
