//go:build linux

package procrec

import (
	"encoding/binary"
	"errors"
	"fmt"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/btf"
	"github.com/cilium/ebpf/link"
	"github.com/cilium/ebpf/ringbuf"
)

// The process record comes from three eBPF programs on the scheduler's
// raw tracepoints, which write to one ring the agent reads in batches:
// the kernel keeps each exec's command line, parent, uid and time, so
// the agent need not wake at each event while the process still lives.

// procRingBytes is the size of the process ring (a power of two): about
// 3,000 execs of a few hundred bytes of command line between two reads;
// the programs count those the full ring refused.
const procRingBytes = 1 << 20

// maxArgvRead is how much of an exec's command line the kernel copies.
const maxArgvRead = 4096

// Kinds of ring record: the process ring's, and the connect hooks'.
const (
	recFork    = 1
	recExec    = 2
	recExit    = 3
	recConnect = 4
)

// A process ring record, little endian:
//
//	0  u32 kind   4  u32 pid (the process, a thread group's id)
//	8  u32 parent (fork, exec)   12 u32 euid (exec) or exit code (exit)
//	16 u64 time (CLOCK_MONOTONIC ns)
//
// An exec's record goes on with
//
//	24 u32 the command line's whole length   28 u32 unused
//	32 [16]byte comm   48 the command line, NUL-separated, at most
//	maxArgvRead bytes
const (
	procHdrLen  = 24
	execHdrLen  = 48
	execRecLen  = execHdrLen + maxArgvRead
	procStackEv = -procHdrLen // fork's and exit's record, on the stack
	procSlot    = -procHdrLen - 8
)

// kernelLayout holds the offsets the programs read the kernel's
// structures at, taken from the running kernel's BTF.
type kernelLayout struct {
	taskPID, taskTGID, taskRealParent, taskCred, taskMM, taskExitCode int32
	credEUID                                                          int32
	mmArgStart, mmArgEnd                                              int32
}

// loadLayout reads the offsets from the kernel's BTF
// (/sys/kernel/btf/vmlinux).
func loadLayout() (kernelLayout, error) {
	spec, err := btf.LoadKernelSpec()
	if err != nil {
		return kernelLayout{}, fmt.Errorf("the kernel's BTF: %w", err)
	}
	var l kernelLayout
	type want struct {
		typ, member string
		to          *int32
	}
	for _, w := range []want{
		{"task_struct", "pid", &l.taskPID},
		{"task_struct", "tgid", &l.taskTGID},
		{"task_struct", "real_parent", &l.taskRealParent},
		{"task_struct", "cred", &l.taskCred},
		{"task_struct", "mm", &l.taskMM},
		{"task_struct", "exit_code", &l.taskExitCode},
		{"cred", "euid", &l.credEUID},
		{"mm_struct", "arg_start", &l.mmArgStart},
		{"mm_struct", "arg_end", &l.mmArgEnd},
	} {
		var s *btf.Struct
		if err := spec.TypeByName(w.typ, &s); err != nil {
			return kernelLayout{}, fmt.Errorf("the kernel's BTF: struct %s: %w", w.typ, err)
		}
		off, ok := memberOffset(s.Members, w.member)
		if !ok {
			return kernelLayout{}, fmt.Errorf("the kernel's BTF: struct %s has no %s", w.typ, w.member)
		}
		*w.to = int32(off)
	}
	return l, nil
}

// memberOffset finds a member by name, in anonymous structs and unions
// too, and gives its offset in bytes.
func memberOffset(members []btf.Member, name string) (uint32, bool) {
	for _, m := range members {
		if m.Name == name && m.BitfieldSize == 0 && m.Offset%8 == 0 {
			return m.Offset.Bytes(), true
		}
		if m.Name != "" {
			continue
		}
		var inner []btf.Member
		switch t := btf.UnderlyingType(m.Type).(type) {
		case *btf.Struct:
			inner = t.Members
		case *btf.Union:
			inner = t.Members
		}
		if off, ok := memberOffset(inner, name); ok {
			return m.Offset.Bytes() + off, true
		}
	}
	return 0, false
}

// bpfSet is what a record's eBPF programs hold: a ring they write to, a
// counter of what the full ring refused, the programs, their links and
// the ring's reader.
type bpfSet struct {
	ring  *ebpf.Map
	lost  *ebpf.Map // one u64
	seen  uint64    // of lost, what is in the record already
	progs []*ebpf.Program
	links []link.Link
	rd    *ringbuf.Reader
}

// maps makes the ring (of size bytes, a power of two) and the counter.
func (b *bpfSet) maps(name string, size uint32) error {
	var err error
	if b.ring, err = ebpf.NewMap(&ebpf.MapSpec{Name: name, Type: ebpf.RingBuf, MaxEntries: size}); err != nil {
		return fmt.Errorf("ring: %w", err)
	}
	if b.lost, err = ebpf.NewMap(&ebpf.MapSpec{Name: name + "_lost", Type: ebpf.Array, KeySize: 4, ValueSize: 8, MaxEntries: 1}); err != nil {
		return fmt.Errorf("counter: %w", err)
	}
	return nil
}

// reader opens the ring's reader. Its reads never block: run polls the
// ring itself and reads what it holds.
func (b *bpfSet) reader() error {
	rd, err := ringbuf.NewReader(b.ring)
	if err != nil {
		return fmt.Errorf("read the ring: %w", err)
	}
	rd.SetDeadline(time.Unix(1, 0))
	b.rd = rd
	return nil
}

// unhook detaches the programs.
func (b *bpfSet) unhook() error {
	var errs []error
	for _, l := range b.links {
		errs = append(errs, l.Close())
	}
	b.links = nil
	return errors.Join(errs...)
}

// release detaches and frees everything.
func (b *bpfSet) release() {
	_ = b.unhook()
	if b.rd != nil {
		b.rd.Close()
	}
	for _, p := range b.progs {
		p.Close()
	}
	for _, m := range []*ebpf.Map{b.ring, b.lost} {
		if m != nil {
			m.Close()
		}
	}
}

// procWatch is the process record's programs, their ring and links.
type procWatch struct {
	bpfSet
	scratch *ebpf.Map // per CPU: where an exec's record is built
	points  []string
}

// newProcWatch loads the programs; hook attaches them.
func newProcWatch() (*procWatch, error) {
	l, err := loadLayout()
	if err != nil {
		return nil, err
	}
	w := &procWatch{}
	if err := w.maps("den_procs", procRingBytes); err != nil {
		w.close()
		return nil, err
	}
	if w.scratch, err = ebpf.NewMap(&ebpf.MapSpec{Name: "den_exec", Type: ebpf.PerCPUArray, KeySize: 4, ValueSize: execRecLen, MaxEntries: 1}); err != nil {
		w.close()
		return nil, fmt.Errorf("exec scratch: %w", err)
	}
	ring, lost := w.ring.FD(), w.lost.FD()
	for _, p := range []struct {
		point string
		prog  asm.Instructions
	}{
		{"sched_process_fork", forkProgram(l, ring, lost)},
		{"sched_process_exec", execProgram(l, ring, lost, w.scratch.FD())},
		{"sched_process_exit", exitProgram(l, ring, lost)},
	} {
		prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{
			Name: "den_" + p.point[len("sched_process_"):], Type: ebpf.RawTracepoint,
			Instructions: p.prog, License: "GPL",
		})
		if err != nil {
			w.close()
			return nil, fmt.Errorf("load the %s hook: %w", p.point, err)
		}
		w.progs, w.points = append(w.progs, prog), append(w.points, p.point)
	}
	if err := w.reader(); err != nil {
		w.close()
		return nil, err
	}
	return w, nil
}

// hook attaches the programs to their tracepoints, or detaches them.
func (w *procWatch) hook(on bool) error {
	if !on {
		return w.unhook()
	}
	if len(w.links) > 0 {
		return nil
	}
	for i, p := range w.progs {
		l, err := link.AttachRawTracepoint(link.RawTracepointOptions{Name: w.points[i], Program: p})
		if err != nil {
			_ = w.hook(false)
			return fmt.Errorf("attach to tracepoint %s: %w", w.points[i], err)
		}
		w.links = append(w.links, l)
	}
	return nil
}

func (w *procWatch) close() {
	w.release()
	if w.scratch != nil {
		w.scratch.Close()
	}
}

// lostSince says how many records the full ring refused since it was
// last asked.
func (w *bpfSet) lostSince() uint64 {
	var n uint64
	if w.lost.Lookup(uint32(0), &n) != nil || n <= w.seen {
		return 0
	}
	lost := n - w.seen
	w.seen = n
	return lost
}

// readKernel loads size bytes (4 or 8) at src+off, kernel memory, into
// dst through the stack slot procSlot. src must survive a call (R6-R9).
func readKernel(dst, src asm.Register, off int32, size asm.Size) asm.Instructions {
	return asm.Instructions{
		asm.Mov.Reg(asm.R3, src),
		asm.Add.Imm(asm.R3, off),
		asm.Mov.Reg(asm.R1, asm.RFP),
		asm.Add.Imm(asm.R1, procSlot),
		asm.Mov.Imm(asm.R2, int32(size.Sizeof())),
		asm.FnProbeReadKernel.Call(),
		asm.LoadMem(dst, asm.RFP, procSlot, size),
	}
}

// output writes the R3 bytes at R2 to ring, or counts them in lost when
// the ring is full (the map's key built at the stack offset key), then
// returns ret.
func output(ring, lost int, key int16, ret int32) asm.Instructions {
	return asm.Instructions{
		asm.LoadMapPtr(asm.R1, ring),
		asm.Mov.Imm(asm.R4, 0),
		asm.FnRingbufOutput.Call(),
		asm.JEq.Imm(asm.R0, 0, "out"),
		asm.StoreImm(asm.RFP, key, 0, asm.Word),
		asm.LoadMapPtr(asm.R1, lost),
		asm.Mov.Reg(asm.R2, asm.RFP),
		asm.Add.Imm(asm.R2, int32(key)),
		asm.FnMapLookupElem.Call(),
		asm.JEq.Imm(asm.R0, 0, "out"),
		asm.Mov.Imm(asm.R1, 1),
		asm.AddAtomic.Mem(asm.R0, asm.R1, asm.DWord, 0),
		asm.Mov.Imm(asm.R0, ret).WithSymbol("out"),
		asm.Return(),
	}
}

// stackRecord writes a fork's or an exit's record (procHdrLen bytes) on
// the stack, from registers that survive a call (asm.RFP stands for 0),
// and sends it.
func stackRecord(ring, lost int, kind int64, pid, parent, val asm.Register) asm.Instructions {
	in := asm.Instructions{
		asm.StoreImm(asm.RFP, procStackEv, kind, asm.Word),
		asm.StoreMem(asm.RFP, procStackEv+4, pid, asm.Word),
	}
	for i, r := range []asm.Register{parent, val} {
		off := procStackEv + 8 + 4*int16(i)
		if r == asm.RFP {
			in = append(in, asm.StoreImm(asm.RFP, off, 0, asm.Word))
		} else {
			in = append(in, asm.StoreMem(asm.RFP, off, r, asm.Word))
		}
	}
	in = append(in,
		asm.FnKtimeGetNs.Call(),
		asm.StoreMem(asm.RFP, procStackEv+16, asm.R0, asm.DWord),
		asm.Mov.Reg(asm.R2, asm.RFP),
		asm.Add.Imm(asm.R2, procStackEv),
		asm.Mov.Imm(asm.R3, procHdrLen),
	)
	return append(in, output(ring, lost, procSlot, 0)...)
}

// forkProgram records a new process (not a thread): its id and its
// parent's. The tracepoint's arguments are the parent and the child.
func forkProgram(l kernelLayout, ring, lost int) asm.Instructions {
	in := asm.Instructions{asm.LoadMem(asm.R6, asm.R1, 8, asm.DWord)} // the child
	in = append(in, readKernel(asm.R7, asm.R6, l.taskPID, asm.Word)...)
	in = append(in, readKernel(asm.R8, asm.R6, l.taskTGID, asm.Word)...)
	in = append(in, asm.JNE.Reg(asm.R7, asm.R8, "out"))
	in = append(in, readKernel(asm.R9, asm.R6, l.taskRealParent, asm.DWord)...)
	in = append(in, readKernel(asm.R9, asm.R9, l.taskTGID, asm.Word)...)
	return append(in, stackRecord(ring, lost, recFork, asm.R8, asm.R9, asm.RFP)...)
}

// exitProgram records a process's end (its last thread's, the group
// leader's) with its exit code. The tracepoint's argument is the task,
// which is the current one.
func exitProgram(l kernelLayout, ring, lost int) asm.Instructions {
	in := asm.Instructions{
		asm.LoadMem(asm.R6, asm.R1, 0, asm.DWord),
		asm.FnGetCurrentPidTgid.Call(),
		asm.Mov.Reg(asm.R7, asm.R0),
		asm.RSh.Imm(asm.R7, 32), // tgid
		asm.Mov.Reg32(asm.R0, asm.R0),
		asm.JNE.Reg(asm.R0, asm.R7, "out"), // a thread
	}
	in = append(in, readKernel(asm.R8, asm.R6, l.taskExitCode, asm.Word)...)
	return append(in, stackRecord(ring, lost, recExit, asm.R7, asm.RFP, asm.R8)...)
}

// execProgram records an exec: the process, its parent, its effective
// uid and its new command line, read from its memory (mm->arg_start to
// arg_end), built in the CPU's scratch record. The tracepoint's first
// argument is the task, the current one.
func execProgram(l kernelLayout, ring, lost, scratch int) asm.Instructions {
	in := asm.Instructions{
		asm.LoadMem(asm.R6, asm.R1, 0, asm.DWord),
		asm.StoreImm(asm.RFP, procSlot, 0, asm.Word),
		asm.LoadMapPtr(asm.R1, scratch),
		asm.Mov.Reg(asm.R2, asm.RFP),
		asm.Add.Imm(asm.R2, procSlot),
		asm.FnMapLookupElem.Call(),
		asm.JEq.Imm(asm.R0, 0, "out"),
		asm.Mov.Reg(asm.R7, asm.R0), // the record
		asm.StoreImm(asm.R7, 0, recExec, asm.Word),
		asm.FnGetCurrentPidTgid.Call(),
		asm.RSh.Imm(asm.R0, 32),
		asm.StoreMem(asm.R7, 4, asm.R0, asm.Word),
	}
	in = append(in, readKernel(asm.R8, asm.R6, l.taskRealParent, asm.DWord)...)
	in = append(in, readKernel(asm.R8, asm.R8, l.taskTGID, asm.Word)...)
	in = append(in, asm.StoreMem(asm.R7, 8, asm.R8, asm.Word))
	in = append(in, readKernel(asm.R8, asm.R6, l.taskCred, asm.DWord)...)
	in = append(in, readKernel(asm.R8, asm.R8, l.credEUID, asm.Word)...)
	in = append(in,
		asm.StoreMem(asm.R7, 12, asm.R8, asm.Word),
		asm.FnKtimeGetNs.Call(),
		asm.StoreMem(asm.R7, 16, asm.R0, asm.DWord),
		asm.StoreImm(asm.R7, 24, 0, asm.Word),
		asm.StoreImm(asm.R7, 28, 0, asm.Word),
		asm.Mov.Reg(asm.R1, asm.R7),
		asm.Add.Imm(asm.R1, 32),
		asm.Mov.Imm(asm.R2, 16),
		asm.FnGetCurrentComm.Call(),
		asm.Mov.Imm(asm.R8, 0), // bytes copied
	)
	in = append(in, readKernel(asm.R9, asm.R6, l.taskMM, asm.DWord)...)
	in = append(in, asm.JEq.Imm(asm.R9, 0, "send"))
	in = append(in, readKernel(asm.R8, asm.R9, l.mmArgEnd, asm.DWord)...)
	in = append(in, readKernel(asm.R9, asm.R9, l.mmArgStart, asm.DWord)...)
	in = append(in,
		asm.Sub.Reg(asm.R8, asm.R9),
		asm.StoreMem(asm.R7, 24, asm.R8, asm.Word),
		asm.JLE.Imm(asm.R8, maxArgvRead, "read"),
		asm.Mov.Imm(asm.R8, maxArgvRead),
		asm.Mov.Reg(asm.R1, asm.R7).WithSymbol("read"),
		asm.Add.Imm(asm.R1, execHdrLen),
		asm.Mov.Reg(asm.R2, asm.R8),
		asm.Mov.Reg(asm.R3, asm.R9),
		asm.FnProbeReadUser.Call(),
		asm.JEq.Imm(asm.R0, 0, "send"),
		asm.Mov.Imm(asm.R8, 0), // unreadable: no command line
		asm.Mov.Reg(asm.R2, asm.R7).WithSymbol("send"),
		asm.Mov.Reg(asm.R3, asm.R8),
		asm.Add.Imm(asm.R3, execHdrLen),
	)
	return append(in, output(ring, lost, procSlot, 0)...)
}

// kernelEvent is one record of the process ring or the connect hooks'
// ring, decoded.
type kernelEvent struct {
	kind, pid, parent uint32
	val               uint32 // an exec's euid, an exit's code, a connect's uid
	mono              int64  // CLOCK_MONOTONIC ns
	argv              []string
	cut               bool // argv was cut to the bounds
	comm              string
	addr, proto       string // a connect's
}

// decodeProc reads one record of the process ring.
func decodeProc(b []byte) (kernelEvent, bool) {
	if len(b) < procHdrLen {
		return kernelEvent{}, false
	}
	le := binary.LittleEndian
	e := kernelEvent{kind: le.Uint32(b[0:]), pid: le.Uint32(b[4:]), parent: le.Uint32(b[8:]),
		val: le.Uint32(b[12:]), mono: int64(le.Uint64(b[16:]))}
	if e.kind == recExec {
		if len(b) < execHdrLen {
			return kernelEvent{}, false
		}
		e.comm = cString(b[32:48])
		e.argv, e.cut = splitArgv(b[execHdrLen:], int(le.Uint32(b[24:])))
		if len(e.argv) == 0 && e.comm != "" {
			e.argv = []string{"[" + e.comm + "]"}
		}
	}
	return e, true
}
