package e2b

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"sync"
	"time"

	"github.com/denhq/den/internal/atomicfile"
)

// record is what den keeps of a sandbox beyond its VM: what E2B calls
// its template, metadata, environment and lifecycle. A VM without a
// record (made with den create) is a sandbox too, with none of these.
type record struct {
	Owner     string            `json:"owner"`
	Template  string            `json:"template"`
	Metadata  map[string]string `json:"metadata,omitempty"`
	EnvVars   map[string]string `json:"env_vars,omitempty"`
	StartedAt time.Time         `json:"started_at"`
	// EndAt is when the sandbox times out: it is killed then, or put to
	// sleep when AutoPause is set. Zero: never.
	EndAt      time.Time `json:"end_at,omitzero"`
	AutoPause  bool      `json:"auto_pause,omitempty"`
	AutoResume bool      `json:"auto_resume,omitempty"`
	// Paused: E2B paused it (a pause call, or its timeout with
	// AutoPause). Without AutoResume its envd and ports refuse until a
	// connect; den's own idle sleep does not set it (such a VM wakes
	// when reached, as every den VM).
	Paused bool `json:"paused,omitempty"`
	// Timeout is the timeout it was made with, or last set (setTimeout,
	// connect), given again when it resumes by itself (AutoResume).
	Timeout time.Duration `json:"timeout,omitempty"`
	// TrafficToken, when set (allowPublicTraffic false), is what a
	// request to one of its ports carries in E2b-Traffic-Access-Token.
	TrafficToken string `json:"traffic_token,omitempty"`
	// Killed: the sandbox was killed while it had snapshots (den
	// checkpoints), which outlive it as on E2B: its VM stays asleep,
	// out of E2B's sight but for them, until the last one is deleted.
	Killed bool `json:"killed,omitempty"`
	// Made: the VM was made through E2B (create, fork, a snapshot). Only
	// such a sandbox's ports are served on the E2B address; a VM made
	// with den create keeps den's own rules for them (den url), even
	// once an E2B call gave it a record.
	Made bool `json:"made,omitempty"`
	// Egress is the den egress policy its network settings gave ("":
	// the daemon's default).
	Egress string `json:"egress,omitempty"`
	// Making: the sandbox's VM is being made (create, fork); a list
	// leaves such a record alone for makingGrace though no VM has the
	// name yet.
	Making bool `json:"making,omitempty"`
}

// makingGrace bounds how long a record stays without its VM while the
// VM is made: past it, a daemon that died mid-create left it.
const makingGrace = 30 * time.Minute

// store keeps the records in one JSON file, written atomically.
type store struct {
	mu   sync.Mutex
	path string
	recs map[string]record
}

func openStore(path string) (*store, error) {
	s := &store{path: path, recs: map[string]record{}}
	data, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return s, nil
	}
	if err != nil {
		return nil, fmt.Errorf("e2b records: %w", err)
	}
	if err := json.Unmarshal(data, &s.recs); err != nil {
		return nil, fmt.Errorf("e2b records %s: %w", path, err)
	}
	return s, nil
}

func (s *store) get(id string) (record, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	r, ok := s.recs[id]
	return r, ok
}

// all returns a copy of every record.
func (s *store) all() map[string]record {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[string]record, len(s.recs))
	for id, r := range s.recs {
		out[id] = r
	}
	return out
}

// put stores r as id's record.
func (s *store) put(id string, r record) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	old, had := s.recs[id]
	s.recs[id] = r
	if err := s.save(); err != nil {
		if had {
			s.recs[id] = old
		} else {
			delete(s.recs, id)
		}
		return err
	}
	return nil
}

// update changes id's record with f, if there is one.
func (s *store) update(id string, f func(*record)) (record, bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	r, ok := s.recs[id]
	if !ok {
		return record{}, false, nil
	}
	old := r
	f(&r)
	s.recs[id] = r
	if err := s.save(); err != nil {
		s.recs[id] = old
		return old, true, err
	}
	return r, true, nil
}

func (s *store) remove(id string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.recs[id]; !ok {
		return nil
	}
	delete(s.recs, id)
	return s.save()
}

func (s *store) save() error {
	if err := atomicfile.WriteJSON(s.path, s.recs, 0o600); err != nil {
		return fmt.Errorf("e2b records: %w", err)
	}
	return nil
}
