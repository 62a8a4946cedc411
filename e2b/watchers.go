package e2b

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"sync"
	"time"

	"connectrpc.com/connect"
)

// The non-streaming watchers (CreateWatcher, GetWatcherEvents,
// RemoveWatcher) look at a directory as WatchDir does, in the
// background, and keep what changed until the next GetWatcherEvents.
// A sandbox has at most maxWatchers; one not asked for its events for
// watcherIdle, or whose sandbox is paused or killed, goes.

const (
	maxWatchers   = 16
	watcherIdle   = 5 * time.Minute
	maxWatchQueue = 10000
)

// filesystem.CreateWatcherRequest
type createWatcherRequest struct {
	Path      string `json:"path"`
	Recursive bool   `json:"recursive"`
}

// filesystem.CreateWatcherResponse
type createWatcherResponse struct {
	WatcherID string `json:"watcherId"`
}

// filesystem.GetWatcherEventsRequest, RemoveWatcherRequest
type watcherRequest struct {
	WatcherID string `json:"watcherId"`
}

// filesystem.GetWatcherEventsResponse
type watcherEventsResponse struct {
	Events []fsEvent `json:"events"`
}

// watcher is one background look at a directory.
type watcher struct {
	sandbox string
	stop    context.CancelFunc
	mu      sync.Mutex
	events  []fsEvent
	err     error
	asked   time.Time
}

// watchers are the sandboxes' background watchers by id.
type watchers struct {
	mu sync.Mutex
	m  map[string]*watcher
}

func newWatchers() *watchers { return &watchers{m: map[string]*watcher{}} }

func (ws *watchers) count(sandbox string) int {
	n := 0
	for _, w := range ws.m {
		if w.sandbox == sandbox {
			n++
		}
	}
	return n
}

// take removes and returns sandbox's watcher id.
func (ws *watchers) take(sandbox, id string) *watcher {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	w, ok := ws.m[id]
	if !ok || w.sandbox != sandbox {
		return nil
	}
	delete(ws.m, id)
	return w
}

func (ws *watchers) get(sandbox, id string) *watcher {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	if w, ok := ws.m[id]; ok && w.sandbox == sandbox {
		return w
	}
	return nil
}

// forget stops sandbox's watchers.
func (ws *watchers) forget(sandbox string) {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	for id, w := range ws.m {
		if w.sandbox == sandbox {
			w.stop()
			delete(ws.m, id)
		}
	}
}

func (svc filesystemService) watcherRoutes(opts []connect.HandlerOption) {
	svc.s.envd.Handle("/filesystem.Filesystem/CreateWatcher", connect.NewUnaryHandler("/filesystem.Filesystem/CreateWatcher", svc.createWatcher, opts...))
	svc.s.envd.Handle("/filesystem.Filesystem/GetWatcherEvents", connect.NewUnaryHandler("/filesystem.Filesystem/GetWatcherEvents", svc.watcherEvents, opts...))
	svc.s.envd.Handle("/filesystem.Filesystem/RemoveWatcher", connect.NewUnaryHandler("/filesystem.Filesystem/RemoveWatcher", svc.removeWatcher, opts...))
}

func (svc filesystemService) createWatcher(ctx context.Context, req *connect.Request[createWatcherRequest]) (*connect.Response[createWatcherResponse], error) {
	f, done, err := svc.openFiles(ctx, req)
	if err != nil {
		return nil, err
	}
	root := f.acct.abs(req.Msg.Path)
	fi, err := f.fs.Stat(root)
	if err == nil && !fi.IsDir() {
		err = connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("den: %s is not a directory", root))
	} else if err != nil {
		err = fileError(root, err)
	}
	var before map[string]seen
	if err == nil {
		if before, err = f.look(root, req.Msg.Recursive); err != nil {
			err = fileError(root, err)
		}
	}
	if err != nil {
		done()
		return nil, err
	}
	sandbox := sandboxID(ctx)
	b := make([]byte, 12)
	rand.Read(b)
	id := hex.EncodeToString(b)
	wctx, stop := context.WithCancel(context.Background())
	w := &watcher{sandbox: sandbox, stop: stop, asked: time.Now()}
	svc.s.watches.mu.Lock()
	if svc.s.watches.count(sandbox) >= maxWatchers {
		svc.s.watches.mu.Unlock()
		stop()
		done()
		return nil, connect.NewError(connect.CodeResourceExhausted, fmt.Errorf("den: sandbox %s has %d watchers: remove one first", sandbox, maxWatchers))
	}
	svc.s.watches.m[id] = w
	svc.s.watches.mu.Unlock()
	go func() {
		defer done()
		tick := time.NewTicker(watchEvery)
		defer tick.Stop()
		for {
			select {
			case <-wctx.Done():
				return
			case <-tick.C:
			}
			w.mu.Lock()
			idle := time.Since(w.asked) > watcherIdle
			w.mu.Unlock()
			if idle {
				svc.s.watches.take(sandbox, id)
				return
			}
			after, err := f.look(root, req.Msg.Recursive)
			w.mu.Lock()
			if err != nil {
				w.err = err
			} else {
				w.events = append(w.events, changes(before, after)...)
				if len(w.events) > maxWatchQueue {
					w.err = fmt.Errorf("over %d events not asked for", maxWatchQueue)
				}
			}
			failed := w.err != nil
			w.mu.Unlock()
			if failed {
				// Kept for a GetWatcherEvents to say why, until it goes
				// as an idle one does.
				select {
				case <-wctx.Done():
				case <-time.After(watcherIdle):
					svc.s.watches.take(sandbox, id)
				}
				return
			}
			before = after
		}
	}()
	return connect.NewResponse(&createWatcherResponse{WatcherID: id}), nil
}

func (svc filesystemService) watcherEvents(ctx context.Context, req *connect.Request[watcherRequest]) (*connect.Response[watcherEventsResponse], error) {
	c, id, err := svc.s.envdCaller(ctx, req.Header())
	if err != nil {
		return nil, err
	}
	c.api.CloseIdle()
	w := svc.s.watches.get(id, req.Msg.WatcherID)
	if w == nil {
		return nil, connect.NewError(connect.CodeNotFound, fmt.Errorf("den: no watcher %q in sandbox %s", req.Msg.WatcherID, id))
	}
	w.mu.Lock()
	events, werr := w.events, w.err
	w.events, w.asked = nil, time.Now()
	w.mu.Unlock()
	if werr != nil && len(events) > 0 {
		// What it saw first; why it stopped on the next call.
		return connect.NewResponse(&watcherEventsResponse{Events: events}), nil
	}
	if werr != nil {
		svc.s.watches.take(id, req.Msg.WatcherID)
		w.stop()
		return nil, fileError("watcher "+req.Msg.WatcherID, werr)
	}
	return connect.NewResponse(&watcherEventsResponse{Events: nonNil(events)}), nil
}

func (svc filesystemService) removeWatcher(ctx context.Context, req *connect.Request[watcherRequest]) (*connect.Response[empty], error) {
	c, id, err := svc.s.envdCaller(ctx, req.Header())
	if err != nil {
		return nil, err
	}
	c.api.CloseIdle()
	w := svc.s.watches.take(id, req.Msg.WatcherID)
	if w == nil {
		return nil, connect.NewError(connect.CodeNotFound, errors.New("den: no such watcher"))
	}
	w.stop()
	return connect.NewResponse(&empty{}), nil
}

// dropSessions ends what the server holds open in sandbox id: its
// processes' and watchers' agent connections. The sandbox was killed
// (gone), or paused (not gone: its processes run on, detached).
func (s *Server) dropSessions(id string, gone bool) {
	if gone {
		s.procs.forget(id)
	} else {
		s.procs.detach(id)
	}
	s.watches.forget(id)
}
