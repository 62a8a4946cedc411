package e2b

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"path"
	"slices"
	"time"

	"connectrpc.com/connect"
)

// WatchDir: den's guest agent has no file notification channel, so the
// daemon looks at the directory through SFTP every watchEvery and tells
// what changed between two looks: a new entry is a create (and a write
// when it has content, as inotify reports a file written at once), a
// gone one a remove, a changed size or modification time a write, a
// changed mode a chmod. Changes undone within one interval are not seen.

// watchEvery is how often a watched directory is looked at.
const watchEvery = 300 * time.Millisecond

// maxWatched caps the entries one watch looks at.
const maxWatched = 10000

// filesystem.WatchDirRequest
type watchDirRequest struct {
	Path      string `json:"path"`
	Recursive bool   `json:"recursive"`
}

// filesystem.FilesystemEvent
type fsEvent struct {
	Name string `json:"name"`
	Type string `json:"type"`
}

// filesystem.WatchDirResponse (a oneof)
type watchDirResponse struct {
	Start      *struct{} `json:"start,omitempty"`
	Filesystem *fsEvent  `json:"filesystem,omitempty"`
	Keepalive  *struct{} `json:"keepalive,omitempty"`
}

// seen is what a look saw of one entry.
type seen struct {
	dir   bool
	size  int64
	mtime time.Time
	mode  fs.FileMode
}

// look sees root's entries (all levels when recursive), by path
// relative to root.
func (f *files) look(root string, recursive bool) (map[string]seen, error) {
	out := map[string]seen{}
	var walk func(dir, rel string) error
	walk = func(dir, rel string) error {
		infos, err := f.fs.ReadDir(dir)
		if err != nil {
			return err
		}
		for _, fi := range infos {
			if len(out) >= maxWatched {
				return fmt.Errorf("over %d entries", maxWatched)
			}
			name := path.Join(rel, fi.Name())
			out[name] = seen{dir: fi.IsDir(), size: fi.Size(), mtime: fi.ModTime(), mode: fi.Mode()}
			if recursive && fi.IsDir() {
				// A directory gone meanwhile is seen gone next time.
				if err := walk(path.Join(dir, fi.Name()), name); err != nil && !errors.Is(err, fs.ErrNotExist) {
					return err
				}
			}
		}
		return nil
	}
	return out, walk(root, "")
}

// changes are the events between two looks, in name order.
func changes(before, after map[string]seen) []fsEvent {
	var out []fsEvent
	for _, name := range slices.Sorted(maps.Keys(after)) {
		a := after[name]
		b, ok := before[name]
		switch {
		case !ok:
			out = append(out, fsEvent{Name: name, Type: "EVENT_TYPE_CREATE"})
			if !a.dir && a.size > 0 {
				out = append(out, fsEvent{Name: name, Type: "EVENT_TYPE_WRITE"})
			}
		case !a.dir && (a.size != b.size || !a.mtime.Equal(b.mtime)):
			out = append(out, fsEvent{Name: name, Type: "EVENT_TYPE_WRITE"})
		case a.mode != b.mode:
			out = append(out, fsEvent{Name: name, Type: "EVENT_TYPE_CHMOD"})
		}
	}
	for _, name := range slices.Sorted(maps.Keys(before)) {
		if _, ok := after[name]; !ok {
			out = append(out, fsEvent{Name: name, Type: "EVENT_TYPE_REMOVE"})
		}
	}
	return out
}

func (svc filesystemService) watchDir(ctx context.Context, req *connect.Request[watchDirRequest], stream *connect.ServerStream[watchDirResponse]) error {
	f, done, err := svc.openFiles(ctx, req)
	if err != nil {
		return err
	}
	defer done()
	root := f.acct.abs(req.Msg.Path)
	fi, err := f.fs.Stat(root)
	if err != nil {
		return fileError(root, err)
	}
	if !fi.IsDir() {
		return connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("den: %s is not a directory", root))
	}
	before, err := f.look(root, req.Msg.Recursive)
	if err != nil {
		return fileError(root, err)
	}
	if err := stream.Send(&watchDirResponse{Start: &struct{}{}}); err != nil {
		return err
	}
	tick := time.NewTicker(watchEvery)
	defer tick.Stop()
	var alive <-chan time.Time
	if d := keepaliveEvery(req.Header()); d > 0 {
		t := time.NewTicker(d)
		defer t.Stop()
		alive = t.C
	}
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-alive:
			if err := stream.Send(&watchDirResponse{Keepalive: &struct{}{}}); err != nil {
				return err
			}
		case <-tick.C:
			after, err := f.look(root, req.Msg.Recursive)
			if err != nil {
				return fileError(root, err)
			}
			for _, ev := range changes(before, after) {
				if err := stream.Send(&watchDirResponse{Filesystem: &ev}); err != nil {
					return err
				}
			}
			before = after
		}
	}
}
