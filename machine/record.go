package machine

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net/netip"
	"sync"
	"time"

	"github.com/denhq/den/activity"
	"github.com/denhq/den/agent"
	"github.com/denhq/den/registry"
	"github.com/denhq/den/storage"
)

// DefaultRecordPull is how often a running VM's process record is read
// into its activity record.
const DefaultRecordPull = 10 * time.Second

// recordPullTimeout bounds one read of a guest's process record;
// recordBeforeTimeout the read an operation makes before it stops or
// snapshots the guest (a hung guest must not hold it up long).
const (
	recordPullTimeout   = 5 * time.Second
	recordBeforeTimeout = time.Second
)

// recordPage is how many events den asks for at a time (the agent also
// stops a page at 128 KiB of JSON).
const recordPage = 256

// maxRecordPages bounds the pages one pull reads (of recordPage events
// at most each); the rest waits for the next pull.
const maxRecordPages = 16

// unknownCursor is the cursor of a VM whose place in its guest's record
// den does not know (a restore to a checkpoint the record has no mark
// of): it names no ring, so the next pull reads all the guest holds.
var unknownCursor = activity.Cursor{Ring: "unknown"}

// records keeps each VM's activity record (package activity) beside its
// disk on the volume: it reads the guest's process record while the VM
// runs (every RecordPull, and before the operations that stop or
// snapshot the guest) and marks what happens to the VM. Sessions mark
// themselves (Session.Tag, Session.NoteURL).
type records struct {
	m    *Manager
	mu   sync.Mutex
	logs map[string]*vmRecord
	wg   sync.WaitGroup
}

// urlNoteEvery bounds the entries requests through a VM's URL make in
// its record: one per VM in this time, counting the requests since.
const urlNoteEvery = 10 * time.Second

type vmRecord struct {
	log *activity.Log
	// pull serialises reads of the guest's record.
	pull sync.Mutex
	// off is why the guest records nothing, once noted in the record.
	off string
	// urlAt is when a URL request was last marked; urlSince counts
	// those not marked since (records.mu).
	urlAt    time.Time
	urlSince int
}

// of returns a VM's record (opened on first use).
func (rc *records) of(name string) (*vmRecord, error) {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	if r := rc.logs[name]; r != nil {
		return r, nil
	}
	dir, err := rc.m.vol.Path(storage.VMActivity(name))
	if err != nil {
		return nil, err
	}
	if rc.logs == nil {
		rc.logs = map[string]*vmRecord{}
	}
	r := &vmRecord{log: activity.Open(dir, rc.m.cfg.RecordCap)}
	rc.logs[name] = r
	return r, nil
}

// forget drops what is kept of a VM's record in memory (the VM was
// removed: one made later under its name has a record of its own).
func (rc *records) forget(name string) {
	rc.mu.Lock()
	delete(rc.logs, name)
	rc.mu.Unlock()
}

// mark appends entries to a VM's record; a failure is logged, never an
// operation's failure.
func (rc *records) mark(name string, entries ...activity.Entry) {
	rc.write(name, true, entries)
}

// markLazy is mark without waiting for the volume to make the entries
// durable: a mark on a request's path.
func (rc *records) markLazy(name string, entries ...activity.Entry) {
	rc.write(name, false, entries)
}

func (rc *records) write(name string, durable bool, entries []activity.Entry) {
	r, err := rc.of(name)
	if err == nil {
		if durable {
			err = r.log.Append(entries...)
		} else {
			err = r.log.AppendLazy(entries...)
		}
	}
	if err != nil {
		rc.m.log.Warn("den: activity record not written", "vm", name, "err", err)
	}
}

// noteURL marks a request through the VM's URL to port, at most one
// entry per urlNoteEvery (counting the requests in between): the first
// request of such a time waits for one append to the volume.
func (rc *records) noteURL(name string, port int) {
	r, err := rc.of(name)
	if err != nil {
		return
	}
	rc.mu.Lock()
	now := time.Now()
	if now.Sub(r.urlAt) < urlNoteEvery {
		r.urlSince++
		rc.mu.Unlock()
		return
	}
	more := r.urlSince
	r.urlAt, r.urlSince = now, 0
	rc.mu.Unlock()
	e := activity.Entry{Kind: activity.KindSession, Time: now, Via: "url", Who: "a request through its URL",
		Detail: fmt.Sprintf("to port %d", port)}
	if more > 0 {
		e.Detail += fmt.Sprintf(" (and %d more since the last such entry)", more)
	}
	if err := r.log.AppendLazy(e); err != nil {
		rc.m.log.Warn("den: activity record not written", "vm", name, "err", err)
	}
}

// vmEvent is a mark of something that happened to the VM.
func vmEvent(event, checkpoint, detail string) activity.Entry {
	return activity.Entry{Kind: activity.KindVM, Event: event, Checkpoint: checkpoint, Detail: detail}
}

// pull reads what the guest recorded since the last pull into the VM's
// record, within timeout, and returns the record's cursor after it. It
// uses the agent connection the instance has, and dials one only with
// dial. The caller holds the VM (an operation) or knows it runs.
func (rc *records) pull(ctx context.Context, name string, in *instance, timeout time.Duration, dial bool) (activity.Cursor, error) {
	r, err := rc.of(name)
	if err != nil {
		return activity.Cursor{}, err
	}
	r.pull.Lock()
	defer r.pull.Unlock()
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	c := in.connectedAgent()
	if c == nil && dial {
		c, err = rc.m.agents.agentClient(ctx, in)
	}
	if c == nil {
		if err == nil {
			err = errors.New("no agent connection")
		}
		return activity.Cursor{}, fmt.Errorf("read the process record of vm %q: %w", name, err)
	}
	cur, err := r.log.Cursor()
	if err != nil {
		return cur, err
	}
	after := cur.Seq
	for page := 0; page < maxRecordPages; page++ {
		rep, err := c.ProcLog(ctx, after, recordPage)
		if errors.Is(err, agent.ErrUnsupported) {
			rep = agent.ProcLogReply{Off: true, Reason: "its agent is older than den's process record (VMs made from an image built since have it)"}
		} else if err != nil {
			return cur, fmt.Errorf("read the process record of vm %q: %w", name, err)
		}
		if rep.Off {
			if r.off != rep.Reason {
				r.off = rep.Reason
				if err := r.log.Append(activity.Entry{Kind: activity.KindLost, Detail: "the guest records no processes: " + rep.Reason}); err != nil {
					return cur, err
				}
			}
			return cur, nil
		}
		if rep.Ring != cur.Ring && after != 0 {
			// Another ring (the guest booted, its agent restarted):
			// everything it holds is new.
			after = 0
			cur.Ring = rep.Ring
			continue
		}
		var entries []activity.Entry
		if rep.Oldest > after+1 {
			entries = append(entries, activity.Entry{Kind: activity.KindLost, Lost: rep.Oldest - after - 1,
				Detail: "the guest's record was full before den read it", Cursor: activity.Cursor{Ring: rep.Ring, Seq: rep.Oldest - 1}})
		}
		// The guest is not trusted: an event out of sequence, or of a
		// kind it does not make, is dropped.
		last := after
		for _, ev := range rep.Events {
			if ev.Seq <= last || ev.Seq > rep.Last {
				continue
			}
			if e, ok := activity.FromProc(rep.Ring, ev); ok {
				if e.Kind == activity.KindConnect {
					if ap, err := netip.ParseAddrPort(e.Addr); err == nil {
						e.Name = rc.m.net.nameOf(name, ap.Addr())
					}
				}
				entries = append(entries, e)
				last = ev.Seq
			}
		}
		if len(rep.Events) == 0 && rep.Ring != cur.Ring {
			// A new ring with nothing in it yet: the cursor moves to it.
			entries = append(entries, activity.Entry{Kind: activity.KindVM, Event: activity.EventBoot,
				Detail: "the guest's agent started", Cursor: activity.Cursor{Ring: rep.Ring}})
		}
		if err := r.log.Append(entries...); err != nil {
			return cur, err
		}
		if cur, err = r.log.Cursor(); err != nil {
			return cur, err
		}
		if last == after || cur.Seq >= rep.Last {
			return cur, nil
		}
		after = cur.Seq
	}
	return cur, nil
}

// pullBefore reads the guest's record before an operation stops or
// snapshots it; a failure is logged (the operation goes on) and the
// cursor is then the record's.
func (rc *records) pullBefore(ctx context.Context, name string, in *instance) activity.Cursor {
	cur, err := rc.pull(ctx, name, in, recordBeforeTimeout, false)
	if err != nil {
		rc.m.log.Warn("den: activity record", "vm", name, "err", err)
		if r, err := rc.of(name); err == nil {
			cur, _ = r.log.Cursor()
		}
	}
	return cur
}

// skipCursor is where the guest's record stands now: a VM made from a
// warm base starts its record there, after what ran in the base.
func (rc *records) skipCursor(ctx context.Context, in *instance) activity.Cursor {
	ctx, cancel := context.WithTimeout(ctx, recordBeforeTimeout)
	defer cancel()
	c := in.connectedAgent()
	if c == nil {
		return activity.Cursor{}
	}
	rep, err := c.ProcLog(ctx, math.MaxUint64, 1)
	if err != nil || rep.Off {
		return activity.Cursor{}
	}
	return activity.Cursor{Ring: rep.Ring, Seq: rep.Last}
}

// cursorAt is where a VM restored to, or forked from, checkpoint id of
// vm reads its guest's record on from.
func (rc *records) cursorAt(vm, id string) activity.Cursor {
	r, err := rc.of(vm)
	if err != nil {
		return unknownCursor
	}
	cur, err := r.log.CursorAt(id)
	if err != nil {
		return unknownCursor
	}
	return cur
}

// startPuller reads every running VM's guest record every RecordPull
// until the Manager closes.
func (rc *records) startPuller() {
	every := rc.m.cfg.RecordPull
	if every < 0 {
		return
	}
	if every == 0 {
		every = DefaultRecordPull
	}
	rc.wg.Add(1)
	go func() {
		defer rc.wg.Done()
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-rc.m.closed:
				return
			case <-t.C:
				rc.pullAll()
			}
		}
	}()
}

func (rc *records) pullAll() {
	rc.m.mu.Lock()
	names := make([]string, 0, len(rc.m.instances))
	for name := range rc.m.instances {
		names = append(names, name)
	}
	rc.m.mu.Unlock()
	for _, name := range names {
		rc.pullIdle(context.Background(), name)
	}
}

// pullIdle reads a running VM's guest record over its agent connection
// unless an operation holds the VM (it reads it itself where it
// matters) or the connection is down (it is not redialed for this). It
// takes no lock of the VM: an operation that begins meanwhile waits for
// the read before its own.
func (rc *records) pullIdle(ctx context.Context, name string) {
	rc.m.mu.Lock()
	_, held := rc.m.holders[name]
	rc.m.mu.Unlock()
	if held {
		return
	}
	in := rc.m.procs.instance(name)
	if in == nil || !alive(in) || !in.isOpen() {
		return
	}
	if _, err := rc.pull(ctx, name, in, recordPullTimeout, false); err != nil {
		rc.m.log.Debug("den: activity record", "vm", name, "err", err)
	}
}

// SetActivityRecord switches the guest's process and file record of a
// running VM on or off, until its next boot (a restore or fork of a
// checkpoint takes the switch the checkpoint's memory holds), and marks
// it, with who, in the VM's record. It returns whether it is on now.
func (m *Manager) SetActivityRecord(ctx context.Context, name string, on bool, who string) (bool, error) {
	o, err := m.begin(ctx, name, "activity record")
	if err != nil {
		return false, err
	}
	defer o.unlock()
	in := o.instance()
	if o.vm.State != registry.StateRunning || in == nil || !alive(in) {
		return false, fmt.Errorf("switch the activity record of vm %q: it is %s, not running: %w", name, o.vm.State, ErrConflict)
	}
	m.records.pullBefore(ctx, name, in) // what came before the switch
	ctx, cancel := context.WithTimeout(ctx, recordPullTimeout)
	defer cancel()
	c, err := m.agents.agentClient(ctx, in)
	if err != nil {
		return false, fmt.Errorf("switch the activity record of vm %q: %w", name, err)
	}
	rep, err := c.SetProcRecord(ctx, on)
	if errors.Is(err, agent.ErrUnsupported) || err == nil && rep.Off {
		return false, fmt.Errorf("switch the activity record of vm %q: its guest records nothing: %w", name, ErrConflict)
	}
	if err != nil {
		return false, fmt.Errorf("switch the activity record of vm %q: %w", name, err)
	}
	state := map[bool]string{true: "on", false: "off"}[!rep.Paused]
	m.records.mark(name, vmEvent(activity.EventRecord, "", "switched "+state+" by "+who))
	return !rep.Paused, nil
}

// Activity reads a VM's activity record; a running VM's guest record is
// read first, unless an operation holds the VM. With f.Checkpoint, the
// record is the checkpoint's (errors.Is ErrNotFound when the record has
// no mark of it).
func (m *Manager) Activity(ctx context.Context, name string, f activity.Filter) ([]activity.Entry, error) {
	if _, err := m.get(ctx, name); err != nil {
		return nil, err
	}
	if f.Checkpoint != "" {
		if _, err := m.getCheckpoint(ctx, name, f.Checkpoint); err != nil {
			return nil, err
		}
	} else {
		m.records.pullIdle(ctx, name)
	}
	r, err := m.records.of(name)
	if err != nil {
		return nil, err
	}
	out, err := r.log.Read(f)
	if errors.Is(err, activity.ErrNoCheckpoint) {
		return nil, fmt.Errorf("activity of vm %q at %s: %w (taken before den kept activity records, or its mark went with the record's oldest half): %w", name, f.Checkpoint, err, ErrNotFound)
	}
	return out, err
}
