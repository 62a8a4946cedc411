package registry

import (
	"errors"
	"fmt"
	"time"
)

// State is a VM's life-cycle state as den records it.
type State string

const (
	// StateCreating: disk being cloned, VMM booting; rolled back on failure.
	StateCreating State = "creating"
	// StateRunning: the VMM runs the guest.
	StateRunning State = "running"
	// StateStopped: no VMM; Reason says why (stopped by a user, VMM died...).
	StateStopped State = "stopped"
	// StateSleeping: memory and disk saved in the suspend slot, no VMM.
	StateSleeping State = "sleeping"
	// StateDeleting: being removed.
	StateDeleting State = "deleting"
	// StateLost: no VMM; the host that ran it, or worked on it, was lost
	// (it let the VM's lease lapse), and another host took it over.
	// Reason says which host, when, and what is left. It waits for a
	// person: an explicit wake boots it from its disk, and a restore
	// restores a checkpoint; nothing else starts it.
	StateLost State = "lost"
)

// transitions is the table of valid state changes.
var transitions = map[State][]State{
	StateCreating: {StateRunning, StateStopped, StateDeleting},
	StateRunning:  {StateStopped, StateSleeping, StateDeleting, StateLost},
	StateStopped:  {StateRunning, StateDeleting, StateLost},
	StateSleeping: {StateRunning, StateStopped, StateDeleting, StateLost},
	StateLost:     {StateRunning, StateStopped, StateDeleting},
	StateDeleting: {},
}

// ErrIllegalTransition is wrapped by every TransitionError.
var ErrIllegalTransition = errors.New("illegal state transition")

// TransitionError is a state change the table does not allow.
type TransitionError struct {
	From, To State
}

func (e *TransitionError) Error() string {
	return fmt.Sprintf("cannot go from %s to %s", e.From, e.To)
}

// Unwrap makes errors.Is(err, ErrIllegalTransition) hold.
func (e *TransitionError) Unwrap() error { return ErrIllegalTransition }

// CheckTransition says whether a VM may go from one state to another; a
// refusal is a *TransitionError.
func CheckTransition(from, to State) error {
	for _, s := range transitions[from] {
		if s == to {
			return nil
		}
	}
	return &TransitionError{From: from, To: to}
}

// Transitions returns the table of valid state changes (a copy).
func Transitions() map[State][]State {
	out := make(map[State][]State, len(transitions))
	for k, v := range transitions {
		out[k] = append([]State(nil), v...)
	}
	return out
}

// VM is one VM's record.
type VM struct {
	Name        string        `json:"name"`
	Owner       string        `json:"owner"`
	Image       string        `json:"image"`
	CPUs        int           `json:"cpus"`
	MemoryBytes int64         `json:"memory_bytes"`
	DiskBytes   int64         `json:"disk_bytes"`
	State       State         `json:"state"`
	Reason      string        `json:"reason,omitempty"`
	VMM         string        `json:"vmm"`
	Accel       string        `json:"accel"`
	IdleTimeout time.Duration `json:"idle_timeout"`
	CreatedAt   time.Time     `json:"created_at"`
	LastActive  time.Time     `json:"last_active"`
	// SpecJSON is the orchestration layer's own per-VM data (paths,
	// network), opaque here.
	SpecJSON string `json:"-"`
	// Generation counts the record's writes (1 when created); an update
	// decided on one generation is refused once another write came
	// between (UpdateVMIf). Later it carries an owning host's fencing.
	Generation int64 `json:"generation"`
	// WakeOnBoot marks a VM put to sleep because the host shut down: the
	// next daemon start wakes it, and the wake clears the mark. It is set
	// on a running VM about to be put to sleep for a shutdown, and holds
	// only while the VM is running or sleeping: any write that takes the
	// VM to another state (or from sleeping to running) clears it.
	WakeOnBoot bool `json:"wake_on_boot,omitempty"`
}

// KeepWakeOnBoot applies WakeOnBoot's rule to a record whose state was
// old before a write: the mark survives running -> sleeping (the sleep it
// was set for) and writes that keep the state; every other state change
// clears it. Every Store applies it in UpdateVM and UpdateVMIf.
func (vm *VM) KeepWakeOnBoot(old State) {
	if vm.State == old || (old == StateRunning && vm.State == StateSleeping) {
		return
	}
	vm.WakeOnBoot = false
}
