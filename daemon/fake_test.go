package daemon

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/denhq/den/api"
	"github.com/denhq/den/machine"
	"github.com/denhq/den/registry"
	"github.com/denhq/den/users"
)

// fakeLifecycle is a Lifecycle that boots nothing: VMs are records, and
// each operation answers what the test sets. A method a test does not
// expect panics (the embedded nil interface).
type fakeLifecycle struct {
	Lifecycle

	mu    sync.Mutex
	vms   map[string]registry.VM
	calls []string
	// sleepErr is what Sleep answers.
	sleepErr error
}

func (f *fakeLifecycle) called(format string, args ...any) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, fmt.Sprintf(format, args...))
}

func (f *fakeLifecycle) Record(_ context.Context, name string) (registry.VM, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	vm, ok := f.vms[name]
	if !ok {
		return vm, fmt.Errorf("no vm named %q: %w", name, machine.ErrNotFound)
	}
	return vm, nil
}

func (f *fakeLifecycle) status(name string) (machine.Status, error) {
	vm, err := f.Record(context.Background(), name)
	return machine.Status{VM: vm}, err
}

func (f *fakeLifecycle) Get(_ context.Context, name string) (machine.Status, error) {
	f.called("get %s", name)
	return f.status(name)
}

func (f *fakeLifecycle) Brief(_ context.Context, name string) (machine.Status, error) {
	return f.status(name)
}

func (f *fakeLifecycle) Sleep(_ context.Context, name string, force bool) error {
	f.called("sleep %s force=%v", name, force)
	if f.sleepErr != nil {
		return f.sleepErr
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	vm := f.vms[name]
	vm.State = registry.StateSleeping
	f.vms[name] = vm
	return nil
}

// TestHandlersAgainstAFake: the API's handlers over a Lifecycle that
// boots nothing: who may see what, how a request reaches the lifecycle,
// and how its errors are answered.
func TestHandlersAgainstAFake(t *testing.T) {
	f := &fakeLifecycle{vms: map[string]registry.VM{
		"mine":   {Name: "mine", Owner: "alice", State: registry.StateRunning},
		"theirs": {Name: "theirs", Owner: "bob", State: registry.StateRunning},
	}}
	s := NewServer(f, users.Keys{}, api.DaemonInfo{}, nil, slog.New(slog.NewTextHandler(io.Discard, nil)))
	h := checkOpenAPI(t, s)
	do := func(method, path, body string) (int, api.ErrorBody, []byte) {
		t.Helper()
		r := httptest.NewRequest(method, path, bytes.NewBufferString(body))
		r.Header.Set("Content-Type", "application/json")
		r = r.WithContext(withCaller(r.Context(), Caller{User: "alice"}))
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		var eb api.ErrorBody
		_ = json.Unmarshal(w.Body.Bytes(), &eb)
		return w.Code, eb, w.Body.Bytes()
	}

	// Another user's VM is not found, and the lifecycle is not asked.
	if code, eb, _ := do("GET", "/v1/vms/theirs", ""); code != http.StatusNotFound || eb.Code != "not_found" {
		t.Fatalf("another user's vm: %d %+v", code, eb)
	}
	if code, _, _ := do("POST", "/v1/vms/theirs/sleep", `{}`); code != http.StatusNotFound {
		t.Fatalf("sleep of another user's vm: %d", code)
	}
	// A diff needs both VMs to be the caller's (the fake has no Diff:
	// reaching it would panic).
	for _, c := range []struct{ path, body string }{
		{"/v1/vms/mine/diff", `{"from":"cp-1","to_vm":"theirs","to":"cp-1"}`},
		{"/v1/vms/theirs/diff", `{"from":"cp-1","to_vm":"mine"}`},
		{"/v1/vms/mine/diff", `{"from":"cp-1","to_vm":"nobody"}`},
	} {
		if code, eb, _ := do("POST", c.path, c.body); code != http.StatusNotFound || !strings.Contains(eb.Error, "no vm named") {
			t.Fatalf("diff %s %s: %d %+v", c.path, c.body, code, eb)
		}
	}
	if len(f.calls) != 0 {
		t.Fatalf("the lifecycle was asked about another user's vm: %v", f.calls)
	}

	// A sleep reaches the lifecycle with its fields, and answers the VM.
	code, _, body := do("POST", "/v1/vms/mine/sleep", `{"force":true}`)
	var vm api.VM
	if err := json.Unmarshal(body, &vm); code != http.StatusOK || err != nil || vm.State != string(registry.StateSleeping) {
		t.Fatalf("sleep: %d %s", code, body)
	}
	if len(f.calls) != 1 || f.calls[0] != "sleep mine force=true" {
		t.Fatalf("calls: %v", f.calls)
	}

	// Unknown fields are refused before the lifecycle sees them.
	if code, eb, _ := do("POST", "/v1/vms/mine/sleep", `{"forse":true}`); code != http.StatusBadRequest || eb.Code != "invalid" {
		t.Fatalf("unknown field: %d %+v", code, eb)
	}

	// The lifecycle's errors, as a client reads them.
	for _, c := range []struct {
		err  error
		code string
	}{
		{fmt.Errorf("sleep vm %q: it is stopped, not running: %w", "mine", machine.ErrConflict), "conflict"},
		{fmt.Errorf("vm %q is busy: restore since 3s: %w", "mine", machine.ErrBusy), "busy"},
		{fmt.Errorf("sleep vm %q: %w", "mine", machine.ErrNoSpace), "no_space"},
		{errors.New("sleep vm \"mine\": pause vm: qmp: broken pipe"), "internal"},
	} {
		f.sleepErr = c.err
		code, eb, _ := do("POST", "/v1/vms/mine/sleep", `{}`)
		if eb.Code != c.code || code != api.Codes[c.code].Status || eb.Error != c.err.Error() {
			t.Fatalf("%v: answered %d %+v, want %s", c.err, code, eb, c.code)
		}
	}
}
