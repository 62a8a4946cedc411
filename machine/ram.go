package machine

import (
	"fmt"
	"hash/fnv"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/denhq/den/registry"
	"golang.org/x/sys/unix"
)

// Guest RAM lives in memory, never on a disk filesystem: a VMM that keeps
// it in a file (QEMU's memory-backend-file, which x-ignore-shared
// snapshots need) gets that file on a tmpfs den mounts at StateDir.RAM(),
// sized to the host's RAM (the memory budget decides what runs). A daemon
// restart leaves the mount, and the VMs on it, as they are.

// tmpfsMagic is statfs's f_type of a tmpfs.
const tmpfsMagic = 0x01021994

// setupRAM decides where guest RAM files go, once the drivers are known:
// Config.RAMDir as given, else a tmpfs at StateDir.RAM() (mounted unless
// it is one already), else /dev/shm, else, with a warning, the state
// dir's filesystem.
func (m *Manager) setupRAM() {
	needed := false
	for _, d := range m.drivers {
		needed = needed || d.Capabilities().RAMFile
	}
	switch {
	case m.cfg.RAMDir != "":
		m.ramDir = m.cfg.RAMDir
		m.ramWhere = describeRAM(m.ramDir)
		return
	case !needed:
		m.ramDir = m.state.RAM()
		m.ramWhere = "in the VMM's own memory"
		return
	}
	dir := m.state.RAM()
	err := mountTmpfs(dir)
	if err == nil {
		m.ramDir, m.ramWhere = dir, describeRAM(dir)
		return
	}
	if isTmpfs("/dev/shm") {
		h := fnv.New32a()
		h.Write([]byte(m.state.Path()))
		m.ramDir = filepath.Join("/dev/shm", fmt.Sprintf("den-%08x", h.Sum32()))
		m.ramWhere = describeRAM(m.ramDir)
		m.log.Warn("den: guest RAM in /dev/shm: no tmpfs of den's own", "err", err)
		return
	}
	m.ramDir = filepath.Join(m.state.Path(), "run-ram")
	m.ramWhere = "a file on the state dir's disk (" + m.ramDir + "): every dirty guest page becomes host writeback"
	m.log.Warn("den: guest RAM on the state dir's disk: no tmpfs could be mounted and /dev/shm is not one", "err", err)
}

// ramFile is the file backing a VM's guest RAM.
func (m *Manager) ramFile(name string) string { return filepath.Join(m.ramDir, name, "memory") }

// ramGone marks a RAM directory moved aside to be freed (discardRAM):
// .gone-NAME-N. No VM name starts with a dot.
const ramGone = ".gone-"

// discardRAM frees a VM's RAM file, whose VMM has exited: the directory
// is renamed aside at once and removed in the background. Freeing a
// guest's pages from the tmpfs takes 20-50 ms here (512 MiB guest), time
// a restore or a sleep need not wait for; needRAMSpace waits for the
// frees in flight before it refuses, Close waits for them, and the next
// start removes any a crash left (sweepRAM).
func (m *Manager) discardRAM(name string) {
	if m.ramDir == "" {
		return
	}
	dir := filepath.Dir(m.ramFile(name))
	gone := filepath.Join(m.ramDir, fmt.Sprintf("%s%s-%d", ramGone, name, time.Now().UnixNano()))
	if err := os.Rename(dir, gone); err != nil {
		_ = os.RemoveAll(dir) // none (the usual error), or removed here
		return
	}
	m.ramFrees.add()
	go func() {
		defer m.ramFrees.done()
		_ = os.RemoveAll(gone)
	}()
}

// inFlight counts background tasks (the frees of RAM files) that others
// may wait for. Unlike a sync.WaitGroup, a task may start while someone
// waits: wait then waits for it too.
type inFlight struct {
	mu   sync.Mutex
	n    int
	idle chan struct{} // closed when n falls to 0
}

func (f *inFlight) add() {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.n == 0 {
		f.idle = make(chan struct{})
	}
	f.n++
}

func (f *inFlight) done() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.n--
	if f.n == 0 {
		close(f.idle)
	}
}

// wait returns once no task is under way.
func (f *inFlight) wait() {
	f.mu.Lock()
	idle, n := f.idle, f.n
	f.mu.Unlock()
	if n > 0 {
		<-idle
	}
}

// sweepRAM removes, at the end of reconcile (vms is the registry it
// reconciled), the RAM
// directories no VMM uses: den's own leftovers of a crash (a RAM
// directory moved aside to be freed, a restore's staged memory
// (stage_ram.go), a warm base's throwaway VM's), and those of this
// daemon's VMs whose VMM is gone (a crash; a host reboot with a RAM dir
// that is not a tmpfs). Nothing else in the directory is touched: it may
// be one others use (--ram-dir /dev/shm).
func (m *Manager) sweepRAM(vms []registry.VM) {
	if m.ramDir == "" {
		return
	}
	ents, err := os.ReadDir(m.ramDir)
	if err != nil {
		return
	}
	ours := map[string]bool{}
	for _, vm := range vms {
		ours[vm.Name] = true
	}
	for _, e := range ents {
		name := e.Name()
		switch {
		case !e.IsDir():
			continue
		case strings.HasPrefix(name, ramGone), strings.HasPrefix(name, ramStaged), strings.HasPrefix(name, baseVMPrefix):
		case !ours[name] || m.instance(name) != nil:
			continue // not a VM of this daemon's, or in use
		}
		if err := os.RemoveAll(filepath.Join(m.ramDir, name)); err != nil {
			m.log.Warn("den: remove an unused guest RAM file", "dir", name, "err", err)
		}
	}
}

// GuestRAM says where guest RAM lives, for den doctor.
func (m *Manager) GuestRAM() string { return m.ramWhere }

// mountTmpfs mounts a tmpfs at dir, as large as the host's RAM, unless a
// tmpfs is there already (a daemon restart).
func mountTmpfs(dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	if isTmpfs(dir) {
		return nil
	}
	size := "50%"
	if b, err := HostMemTotal(); err == nil && b > 0 {
		size = strconv.FormatInt(b, 10)
	}
	if err := unix.Mount("den-ram", dir, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "mode=0700,size="+size); err != nil {
		return fmt.Errorf("mount a tmpfs for guest RAM at %s: %w", dir, err)
	}
	return nil
}

func isTmpfs(dir string) bool {
	var st unix.Statfs_t
	return unix.Statfs(dir, &st) == nil && st.Type == tmpfsMagic
}

func describeRAM(dir string) string {
	if isTmpfs(dir) {
		var st unix.Statfs_t
		_ = unix.Statfs(dir, &st)
		return fmt.Sprintf("tmpfs at %s (%d MiB)", dir, int64(st.Blocks)*st.Bsize>>20)
	}
	return "a file in " + dir + " (not a tmpfs: every dirty guest page becomes host writeback)"
}
