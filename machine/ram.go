package machine

import (
	"fmt"
	"hash/fnv"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/denhq/den/registry"
	"github.com/denhq/den/vmm"
	"golang.org/x/sys/unix"
)

// Guest RAM lives in memory, never on a disk filesystem: a VMM that keeps
// it in a file (QEMU's memory-backend-file, which x-ignore-shared
// snapshots need) gets that file on a tmpfs den mounts at StateDir.RAM(),
// sized to the host's RAM (the memory budget decides what runs). A daemon
// restart leaves the mount, and the VMs on it, as they are.

// tmpfsMagic is statfs's f_type of a tmpfs.
const tmpfsMagic = 0x01021994

// guestRAM is the directory of the VMs' guest RAM files: one directory
// per VM (runtime) name, holding its file.
type guestRAM struct {
	dir   string   // "": no VMM here keeps RAM in a file
	where string   // where that is, for den doctor
	frees inFlight // RAM files being freed (discard)
}

// setup decides where guest RAM files go, once the drivers are known:
// dir (Config.RAMDir) as given, else a tmpfs at state.RAM() (mounted
// unless it is one already), else /dev/shm, else, with a warning, the
// state dir's filesystem.
func (r *guestRAM) setup(dir string, state StateDir, drivers map[string]vmm.Driver, log *slog.Logger) {
	needed := false
	for _, d := range drivers {
		needed = needed || d.Capabilities().RAMFile
	}
	switch {
	case dir != "":
		r.dir = dir
		r.where = describeRAM(r.dir)
		return
	case !needed:
		r.dir = state.RAM()
		r.where = "in the VMM's own memory"
		return
	}
	own := state.RAM()
	err := mountTmpfs(own)
	if err == nil {
		r.dir, r.where = own, describeRAM(own)
		return
	}
	if isTmpfs("/dev/shm") {
		h := fnv.New32a()
		h.Write([]byte(state.Path()))
		r.dir = filepath.Join("/dev/shm", fmt.Sprintf("den-%08x", h.Sum32()))
		r.where = describeRAM(r.dir)
		log.Warn("den: guest RAM in /dev/shm: no tmpfs of den's own", "err", err)
		return
	}
	r.dir = filepath.Join(state.Path(), "run-ram")
	r.where = "a file on the state dir's disk (" + r.dir + "): every dirty guest page becomes host writeback"
	log.Warn("den: guest RAM on the state dir's disk: no tmpfs could be mounted and /dev/shm is not one", "err", err)
}

// file is the file backing a VM's guest RAM.
func (r *guestRAM) file(name string) string { return filepath.Join(r.dir, name, "memory") }

// allocated is what a VM's RAM file holds on its filesystem now.
func (r *guestRAM) allocated(name string) int64 { return allocatedBytes(r.file(name)) }

// ramGone marks a RAM directory moved aside to be freed (discard):
// .gone-NAME-N. No VM name starts with a dot.
const ramGone = ".gone-"

// discard frees a VM's RAM file, whose VMM has exited: the directory
// is renamed aside at once and removed in the background. Freeing a
// guest's pages from the tmpfs takes 20-50 ms here (512 MiB guest), time
// a restore or a sleep need not wait for; needRAMSpace waits for the
// frees in flight before it refuses, Close waits for them, and the next
// start removes any a crash left (guestRAM.sweep).
func (r *guestRAM) discard(name string) {
	if r.dir == "" {
		return
	}
	dir := filepath.Dir(r.file(name))
	gone := filepath.Join(r.dir, fmt.Sprintf("%s%s-%d", ramGone, name, time.Now().UnixNano()))
	if err := os.Rename(dir, gone); err != nil {
		_ = os.RemoveAll(dir) // none (the usual error), or removed here
		return
	}
	r.frees.add()
	go func() {
		defer r.frees.done()
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

// sweep removes, at the end of reconcile (vms is the registry it
// reconciled), the RAM
// directories no VMM uses: den's own leftovers of a crash (a RAM
// directory moved aside to be freed, a restore's staged memory
// (stage_ram.go), a warm base's throwaway VM's), and those of this
// daemon's VMs whose VMM is gone (a crash; a host reboot with a RAM dir
// that is not a tmpfs). Nothing else in the directory is touched: it may
// be one others use (--ram-dir /dev/shm).
func (r *guestRAM) sweep(vms []registry.VM, inUse func(name string) bool, log *slog.Logger) {
	if r.dir == "" {
		return
	}
	ents, err := os.ReadDir(r.dir)
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
		case !ours[name] || inUse(name):
			continue // not a VM of this daemon's, or in use
		}
		if err := os.RemoveAll(filepath.Join(r.dir, name)); err != nil {
			log.Warn("den: remove an unused guest RAM file", "dir", name, "err", err)
		}
	}
}

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
