package e2b

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"strconv"
	"strings"

	"connectrpc.com/connect"
	"github.com/pkg/sftp"
)

// filesystemService is envd's filesystem service (filesystem.Filesystem):
// its Connect handlers, through the guest agent's SFTP server.
type filesystemService struct{ s *Server }

func (svc filesystemService) routes(opts []connect.HandlerOption) {
	svc.s.envd.Handle("/filesystem.Filesystem/Stat", connect.NewUnaryHandler("/filesystem.Filesystem/Stat", svc.stat, opts...))
	svc.s.envd.Handle("/filesystem.Filesystem/ListDir", connect.NewUnaryHandler("/filesystem.Filesystem/ListDir", svc.listDir, opts...))
	svc.s.envd.Handle("/filesystem.Filesystem/MakeDir", connect.NewUnaryHandler("/filesystem.Filesystem/MakeDir", svc.makeDir, opts...))
	svc.s.envd.Handle("/filesystem.Filesystem/Move", connect.NewUnaryHandler("/filesystem.Filesystem/Move", svc.move, opts...))
	svc.s.envd.Handle("/filesystem.Filesystem/Remove", connect.NewUnaryHandler("/filesystem.Filesystem/Remove", svc.remove, opts...))
	svc.watcherRoutes(opts)
	svc.s.envd.Handle("/filesystem.Filesystem/WatchDir", connect.NewServerStreamHandler("/filesystem.Filesystem/WatchDir", svc.watchDir, opts...))
}

// files is one call's view of a sandbox's files.
type files struct {
	fs     *sftp.Client
	acct   account
	users  map[uint32]string
	groups map[uint32]string
}

// openFiles authenticates a filesystem call and opens the sandbox's
// files; close them with the returned func.
func (svc filesystemService) openFiles(ctx context.Context, req connect.AnyRequest) (*files, func(), error) {
	c, id, err := svc.s.envdCaller(ctx, req.Header())
	if err != nil {
		return nil, nil, err
	}
	defer c.api.CloseIdle()
	g, err := guest(ctx, c, id)
	if err != nil {
		return nil, nil, connect.NewError(connect.CodeUnavailable, err)
	}
	fs, err := g.SFTP()
	if err != nil {
		g.Close()
		return nil, nil, connect.NewError(connect.CodeUnavailable, fmt.Errorf("den: sftp: %w", err))
	}
	user, _ := userOf(req.Header())
	acct, err := lookupAccount(fs, user)
	if err != nil {
		fs.Close()
		g.Close()
		return nil, nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("den: %w", err))
	}
	return &files{fs: fs, acct: acct}, func() { fs.Close(); g.Close() }, nil
}

// fileError is the Connect error of a guest file error.
func fileError(p string, err error) error {
	code := connect.CodeInternal
	switch {
	case errors.Is(err, os.ErrNotExist):
		code = connect.CodeNotFound
	case errors.Is(err, os.ErrPermission):
		code = connect.CodePermissionDenied
	case errors.Is(err, os.ErrExist):
		code = connect.CodeAlreadyExists
	}
	return connect.NewError(code, fmt.Errorf("den: %s: %w", p, err))
}

// names reads a passwd or group file of the guest: id -> name.
func (f *files) names(file string) map[uint32]string {
	out := map[uint32]string{}
	r, err := f.fs.Open(file)
	if err != nil {
		return out
	}
	defer r.Close()
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		fields := strings.Split(sc.Text(), ":")
		if len(fields) < 3 {
			continue
		}
		if id, err := strconv.ParseUint(fields[2], 10, 32); err == nil {
			out[uint32(id)] = fields[0]
		}
	}
	return out
}

func nameOf(m map[uint32]string, id uint32) string {
	if n, ok := m[id]; ok {
		return n
	}
	return strconv.FormatUint(uint64(id), 10)
}

// entry describes p (not following a last symlink).
func (f *files) entry(p string, fi fs.FileInfo) entryInfo {
	if f.users == nil {
		f.users, f.groups = f.names("/etc/passwd"), f.names("/etc/group")
	}
	e := entryInfo{Name: path.Base(p), Path: p, Size: fi.Size(), Mode: uint32(fi.Mode().Perm()),
		Permissions: fi.Mode().String(), ModifiedTime: fi.ModTime().UTC(), Type: fileTypeFile}
	if st, ok := fi.Sys().(*sftp.FileStat); ok {
		e.Owner, e.Group = nameOf(f.users, st.UID), nameOf(f.groups, st.GID)
	}
	switch {
	case fi.IsDir():
		e.Type = fileTypeDir
	case fi.Mode()&fs.ModeSymlink != 0:
		e.Type = fileTypeSymlink
		if t, err := f.fs.ReadLink(p); err == nil {
			if !path.IsAbs(t) {
				t = path.Join(path.Dir(p), t)
			}
			e.SymlinkTarget = &t
		}
	}
	return e
}

func (f *files) stat(p string) (*entryInfo, error) {
	fi, err := f.fs.Lstat(p)
	if err != nil {
		return nil, fileError(p, err)
	}
	e := f.entry(p, fi)
	return &e, nil
}

func (svc filesystemService) stat(ctx context.Context, req *connect.Request[pathRequest]) (*connect.Response[entryResponse], error) {
	f, done, err := svc.openFiles(ctx, req)
	if err != nil {
		return nil, err
	}
	defer done()
	e, err := f.stat(f.acct.abs(req.Msg.Path))
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&entryResponse{Entry: e}), nil
}

// maxEntries caps one listing.
const maxEntries = 100000

func (svc filesystemService) listDir(ctx context.Context, req *connect.Request[listDirRequest]) (*connect.Response[listDirResponse], error) {
	depth := req.Msg.Depth
	if depth == 0 {
		depth = 1
	}
	f, done, err := svc.openFiles(ctx, req)
	if err != nil {
		return nil, err
	}
	defer done()
	root := f.acct.abs(req.Msg.Path)
	fi, err := f.fs.Stat(root)
	if err != nil {
		return nil, fileError(root, err)
	}
	if !fi.IsDir() {
		return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("den: %s is not a directory", root))
	}
	out := &listDirResponse{Entries: []entryInfo{}}
	var walk func(dir string, level uint32) error
	walk = func(dir string, level uint32) error {
		infos, err := f.fs.ReadDir(dir)
		if err != nil {
			return fileError(dir, err)
		}
		for _, fi := range infos {
			if len(out.Entries) >= maxEntries {
				return connect.NewError(connect.CodeResourceExhausted, fmt.Errorf("den: %s holds over %d entries at depth %d", root, maxEntries, depth))
			}
			p := path.Join(dir, fi.Name())
			e := f.entry(p, fi)
			out.Entries = append(out.Entries, e)
			if fi.IsDir() && level < depth {
				if err := walk(p, level+1); err != nil {
					return err
				}
			}
		}
		return nil
	}
	if err := walk(root, 1); err != nil {
		return nil, err
	}
	return connect.NewResponse(out), nil
}

func (svc filesystemService) makeDir(ctx context.Context, req *connect.Request[pathRequest]) (*connect.Response[entryResponse], error) {
	f, done, err := svc.openFiles(ctx, req)
	if err != nil {
		return nil, err
	}
	defer done()
	p := f.acct.abs(req.Msg.Path)
	if fi, err := f.fs.Lstat(p); err == nil {
		if fi.IsDir() {
			return nil, connect.NewError(connect.CodeAlreadyExists, fmt.Errorf("den: directory %s exists", p))
		}
		return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("den: %s exists and is not a directory", p))
	}
	if err := f.acct.mkdirAll(f.fs, p); err != nil {
		return nil, fileError(p, err)
	}
	e, err := f.stat(p)
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&entryResponse{Entry: e}), nil
}

func (svc filesystemService) move(ctx context.Context, req *connect.Request[moveRequest]) (*connect.Response[entryResponse], error) {
	f, done, err := svc.openFiles(ctx, req)
	if err != nil {
		return nil, err
	}
	defer done()
	src, dst := f.acct.abs(req.Msg.Source), f.acct.abs(req.Msg.Destination)
	if _, err := f.fs.Lstat(src); err != nil {
		return nil, fileError(src, err)
	}
	if err := f.acct.mkdirAll(f.fs, path.Dir(dst)); err != nil {
		return nil, fileError(path.Dir(dst), err)
	}
	if err := f.fs.PosixRename(src, dst); err != nil {
		return nil, fileError(src, err)
	}
	e, err := f.stat(dst)
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&entryResponse{Entry: e}), nil
}

func (svc filesystemService) remove(ctx context.Context, req *connect.Request[pathRequest]) (*connect.Response[empty], error) {
	f, done, err := svc.openFiles(ctx, req)
	if err != nil {
		return nil, err
	}
	defer done()
	p := f.acct.abs(req.Msg.Path)
	if p == "/" {
		return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("den: will not remove /"))
	}
	if _, err := f.fs.Lstat(p); err != nil {
		return nil, fileError(p, err)
	}
	if err := f.fs.RemoveAll(p); err != nil {
		return nil, fileError(p, err)
	}
	return connect.NewResponse(&empty{}), nil
}
