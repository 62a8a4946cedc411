package cloudhypervisor

import (
	"encoding/json"
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/denhq/den/vmm"
)

// fakeResizeDisk stands in for Cloud Hypervisor's vm.resize-disk. No
// recorded transcript has this endpoint, so its answers are not replayed:
// the handler checks each request against openapi.yaml (PUT with a JSON
// body that is a VmResizeDisk, "id" a string and "desired_size" an int64,
// nothing else), then, as the spec says, answers 204 after resizing the
// disk's file (as Cloud Hypervisor does), or 404 for an id that names no
// disk. The 404 and 400 texts are made up, in Cloud Hypervisor's shape (a
// JSON array of strings).
type fakeResizeDisk struct {
	disks map[string]string // id -> image path

	mu  sync.Mutex
	got []VmResizeDisk
}

func (f *fakeResizeDisk) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	fail := func(status int, msg string) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		data, _ := json.Marshal([]string{"Error from API", "The disk could not be resized", msg})
		w.Write(data)
	}
	if req.Method != http.MethodPut {
		fail(http.StatusMethodNotAllowed, "method "+req.Method)
		return
	}
	if ct := req.Header.Get("Content-Type"); ct != "application/json" {
		fail(http.StatusBadRequest, "content type "+ct)
		return
	}
	var body map[string]json.RawMessage
	if err := json.NewDecoder(req.Body).Decode(&body); err != nil {
		fail(http.StatusBadRequest, "body: "+err.Error())
		return
	}
	for k := range body {
		if k != "id" && k != "desired_size" {
			fail(http.StatusBadRequest, "unknown field "+k)
			return
		}
	}
	var r VmResizeDisk
	if err := json.Unmarshal(body["id"], &r.ID); err != nil || r.ID == "" {
		fail(http.StatusBadRequest, "id: want a non-empty string")
		return
	}
	if err := json.Unmarshal(body["desired_size"], &r.DesiredSize); err != nil || r.DesiredSize <= 0 {
		fail(http.StatusBadRequest, "desired_size: want a positive int64")
		return
	}
	path, ok := f.disks[r.ID]
	if !ok {
		fail(http.StatusNotFound, "no disk with id "+r.ID)
		return
	}
	if err := os.Truncate(path, r.DesiredSize); err != nil {
		fail(http.StatusInternalServerError, err.Error())
		return
	}
	f.mu.Lock()
	f.got = append(f.got, r)
	f.mu.Unlock()
	w.WriteHeader(http.StatusNoContent)
}

func (f *fakeResizeDisk) requests() []VmResizeDisk {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]VmResizeDisk(nil), f.got...)
}

// infoWithDisk is a recorded vm.info answer of a running VM whose disk
// "root" is at path.
func infoWithDisk(t *testing.T, path string) entry {
	t.Helper()
	e := recorded(t, mainTranscript, "GET /api/v1/vm.info", 200)
	var body map[string]any
	must(t, "decode vm.info", decodeJSON(e.RespBody, &body))
	disks := body["config"].(map[string]any)["disks"].([]any)
	if len(disks) != 1 || disks[0].(map[string]any)["id"] != "root" {
		t.Fatalf("recorded vm.info has disks %v, want one, root", disks)
	}
	disks[0].(map[string]any)["path"] = path
	data, err := json.Marshal(body)
	must(t, "encode vm.info", err)
	e.RespBody = data
	return e
}

func TestResizeDisk(t *testing.T) {
	v, rd := newTestVMM(t)
	disk := filepath.Join(rd.Path(), "disk.raw")
	writeFile(t, disk, nil)
	must(t, "truncate", os.Truncate(disk, 256<<20))
	var entries []entry
	for range 6 {
		entries = append(entries, infoWithDisk(t, disk))
	}
	r := startReplay(t, rd.APISocket(), entries...)
	fake := &fakeResizeDisk{disks: map[string]string{"root": disk}}
	r.mu.Lock()
	r.handlers = map[string]http.HandlerFunc{pathPut("vm.resize-disk"): fake.ServeHTTP}
	r.mu.Unlock()
	ctx := testCtx(t, 30*time.Second)

	if !v.Capabilities().ResizeDisk {
		t.Error("capabilities say no ResizeDisk")
	}
	must(t, "resize the root disk", v.ResizeDisk(ctx, "", 1<<30))
	// The same size again: allowed, it tells the guest again.
	must(t, "resize to the same size", v.ResizeDisk(ctx, "root", 1<<30))
	want := []VmResizeDisk{{ID: "root", DesiredSize: 1 << 30}, {ID: "root", DesiredSize: 1 << 30}}
	if got := fake.requests(); len(got) != 2 || got[0] != want[0] || got[1] != want[1] {
		t.Errorf("resize-disk requests %+v, want %+v", got, want)
	}
	if st, err := os.Stat(disk); err != nil || st.Size() != 1<<30 {
		t.Errorf("disk file after resize: %v %v", st.Size(), err)
	}

	// Refused before asking Cloud Hypervisor.
	for _, c := range []struct {
		id    string
		bytes int64
		want  string
		is    error
	}{
		{"root", 512 << 20, "ch resize-disk: disk \"root\" is 1073741824 bytes, refusing to shrink it to 536870912", nil},
		{"root", 1<<30 + 100, "ch resize-disk: size 1073741924 is not a positive multiple of 512 bytes", nil},
		{"data", 2 << 30, `ch resize-disk: no disk "data" (the vm has ["root"]): no such disk`, vmm.ErrNoSuchDisk},
	} {
		err := v.ResizeDisk(ctx, c.id, c.bytes)
		if err == nil || err.Error() != c.want {
			t.Errorf("resize %q to %d: %v, want %s", c.id, c.bytes, err, c.want)
		}
		if c.is != nil && !errors.Is(err, c.is) {
			t.Errorf("resize %q: %v does not wrap %v", c.id, err, c.is)
		}
	}
	if n := len(fake.requests()); n != 2 {
		t.Errorf("%d resize-disk requests, want 2", n)
	}

	// What the fake answers requests the driver never sends.
	wantErr(t, raw(ctx, v, http.MethodPut, "vm.resize-disk", VmResizeDisk{ID: "nope", DesiredSize: 1 << 30}), 404,
		"ch resize-disk: 404: Error from API: The disk could not be resized: no disk with id nope", false)
	wantErr(t, raw(ctx, v, http.MethodPut, "vm.resize-disk", map[string]any{"disk_id": "root", "desired_size": 1 << 30}), 400,
		"ch resize-disk: 400: Error from API: The disk could not be resized: unknown field disk_id", false)
	if u := r.unexpectedRequests(); len(u) != 0 {
		t.Errorf("unexpected requests: %v", u)
	}
}

func TestResizeDiskWithoutVM(t *testing.T) {
	v, rd := newTestVMM(t)
	startReplay(t, rd.APISocket(), info404(t))
	err := v.ResizeDisk(testCtx(t, 30*time.Second), "", 1<<30)
	if !errors.Is(err, vmm.ErrInvalidState) || !strings.Contains(err.Error(), "no vm") {
		t.Fatalf("resize without a vm: %v", err)
	}
}
