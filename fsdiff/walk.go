package fsdiff

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"
)

// entry is one path of a tree as its inode describes it.
type entry struct {
	File
	ino   uint64
	ctime int64 // ns
	mtime int64 // ns
	rdev  uint64
	fsys  string // the host path
}

// tree is a mounted filesystem's paths (absolute, as the guest sees
// them) under a prefix.
type tree map[string]*entry

// walk reads the metadata of every path under prefix in the tree
// mounted at root, without following symlinks. A prefix that does not
// exist gives an empty tree.
// MaxEntries bounds the files a diff looks at in one image: the guest
// decides how many there are.
const MaxEntries = 2_000_000

func walk(ctx context.Context, root, prefix string) (tree, error) {
	t := tree{}
	var visit func(p string) error
	visit = func(p string) error {
		if len(t) >= MaxEntries {
			return fmt.Errorf("more than %d files under %s: narrow the diff with --path", MaxEntries, prefix)
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		host := filepath.Join(root, filepath.FromSlash(p))
		e, err := lstat(host)
		if err != nil {
			return err
		}
		t[p] = e
		if e.Type != TypeDir {
			return nil
		}
		names, err := readNames(host)
		if err != nil {
			return err
		}
		for _, n := range names {
			if err := visit(path.Join(p, n)); err != nil {
				return err
			}
		}
		return nil
	}
	// Each element of the prefix must be a real directory of the tree
	// (a symlink on the way would lead the walk elsewhere).
	for d := path.Dir(prefix); d != "/"; d = path.Dir(d) {
		var st unix.Stat_t
		if err := unix.Lstat(filepath.Join(root, d), &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFDIR {
			return t, nil
		}
	}
	if err := visit(prefix); err != nil {
		if errors.Is(err, fs.ErrNotExist) && len(t) == 0 {
			return t, nil
		}
		return nil, err
	}
	return t, nil
}

func readNames(dir string) ([]string, error) {
	f, err := os.Open(dir)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return f.Readdirnames(-1)
}

func lstat(host string) (*entry, error) {
	var st unix.Stat_t
	if err := unix.Lstat(host, &st); err != nil {
		return nil, &fs.PathError{Op: "lstat", Path: host, Err: err}
	}
	e := &entry{
		File: File{
			Size: st.Size, Mode: fmt.Sprintf("%04o", st.Mode&07777), UID: st.Uid, GID: st.Gid,
			Links: uint64(st.Nlink), MTime: time.Unix(st.Mtim.Sec, st.Mtim.Nsec).UTC(),
		},
		ino: st.Ino, ctime: st.Ctim.Nano(), mtime: st.Mtim.Nano(), rdev: st.Rdev, fsys: host,
	}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFREG:
		e.Type = TypeFile
	case unix.S_IFDIR:
		e.Type = TypeDir
	case unix.S_IFLNK:
		e.Type = TypeSymlink
		target, err := os.Readlink(host)
		if err != nil {
			return nil, err
		}
		e.Target = target
	case unix.S_IFIFO:
		e.Type = TypeFIFO
	case unix.S_IFSOCK:
		e.Type = TypeSocket
	case unix.S_IFCHR:
		e.Type = TypeChar
	case unix.S_IFBLK:
		e.Type = TypeBlock
	}
	return e, nil
}

// fsIOCGetVersion is FS_IOC_GETVERSION: an inode's generation, which
// ext4 changes when it gives a freed inode number to a new file.
const fsIOCGetVersion = 0x80087601

// generation reads the inode generation of a regular file or directory.
func generation(host string) (uint32, error) {
	fd, err := unix.Open(host, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		return 0, &fs.PathError{Op: "open", Path: host, Err: err}
	}
	defer unix.Close(fd)
	v, err := unix.IoctlGetUint32(fd, fsIOCGetVersion)
	if err != nil {
		return 0, &fs.PathError{Op: "get inode generation", Path: host, Err: err}
	}
	return v, nil
}
