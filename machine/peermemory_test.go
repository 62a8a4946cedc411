package machine

import (
	"context"
	"errors"
	"io"
	"testing"

	"github.com/denhq/den/memstore"
)

// TestLocalMemorySendRefuses: a peer's request for a local copy of
// memory names a valid VM, a sleep's copy, and extents inside the memory,
// no more of them than it has; one for a copy this host lacks is
// ErrNotFound.
func TestLocalMemorySendRefuses(t *testing.T) {
	ctx := context.Background()
	size := int64(4 * memstore.ExtentSize)
	for _, c := range []struct {
		what string
		req  MemoryRequest
		want error
	}{
		{"a bad name", MemoryRequest{VM: "../x", Key: "suspend-ab", Size: size}, ErrInvalid},
		{"a checkpoint's key", MemoryRequest{VM: "box", Key: "cp-1-ab", Size: size}, ErrInvalid},
		{"a key with a slash", MemoryRequest{VM: "box", Key: "suspend-a/../../b", Size: size}, ErrInvalid},
		{"an extent past the end", MemoryRequest{VM: "box", Key: "suspend-ab", Size: size, Extents: []int64{4}}, ErrInvalid},
		{"a negative extent", MemoryRequest{VM: "box", Key: "suspend-ab", Size: size, Extents: []int64{-1}}, ErrInvalid},
		{"an extent past an index that overflows", MemoryRequest{VM: "box", Key: "suspend-ab", Size: size, Extents: []int64{1 << 62}}, ErrInvalid},
		{"more extents than the memory has", MemoryRequest{VM: "box", Key: "suspend-ab", Size: size, Extents: []int64{0, 1, 2, 3, 0}}, ErrInvalid},
		{"no size", MemoryRequest{VM: "box", Key: "suspend-ab"}, ErrInvalid},
		{"a copy this host lacks", MemoryRequest{VM: "box", Key: "suspend-ab", Size: size, Extents: []int64{0, 3}}, ErrNotFound},
	} {
		if err := (LocalMemory{}).Send(ctx, c.req, io.Discard); !errors.Is(err, c.want) {
			t.Errorf("%s: %v, want %v", c.what, err, c.want)
		}
	}
	if n := (MemoryRequest{Size: size + 10, Extents: []int64{0, 4}}).Bytes(); n != memstore.ExtentSize+10 {
		t.Errorf("bytes of a full and a last short extent: %d", n)
	}
}
