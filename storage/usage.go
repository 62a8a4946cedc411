package storage

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/denhq/den/internal/sparse"
)

type unixStat = unix.Stat_t

func stat(path string, st *unix.Stat_t) error { return unix.Stat(path, st) }

// renameNoReplace renames, failing with fs.ErrExist if to exists.
func renameNoReplace(from, to string) error {
	err := unix.Renameat2(unix.AT_FDCWD, from, unix.AT_FDCWD, to, unix.RENAME_NOREPLACE)
	if errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOSYS) {
		if _, err := os.Lstat(to); err == nil {
			return &os.LinkError{Op: "rename", Old: from, New: to, Err: fs.ErrExist}
		}
		return os.Rename(from, to)
	}
	if err != nil {
		if errors.Is(err, unix.EEXIST) {
			err = fs.ErrExist
		}
		return &os.LinkError{Op: "rename", Old: from, New: to, Err: err}
	}
	return nil
}

// Usage sums file lengths and the data each file references: for a file,
// the slices `juicefs info --raw` lists (holes are not slices).
func (v *JuiceFS) Usage(ctx context.Context, p Path) (Usage, error) {
	root, hp, err := v.readHost(p)
	if err != nil {
		return Usage{}, fmt.Errorf("usage of %s: %w", p, err)
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	var u Usage
	var files []string
	err = filepath.WalkDir(hp, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.Type().IsRegular() {
			return nil
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		u.Files++
		u.Logical += info.Size()
		files = append(files, path)
		return nil
	})
	if err != nil {
		return Usage{}, fmt.Errorf("usage of %s: %w", p, err)
	}
	data, err := v.dataBytes(ctx, root, files)
	if err != nil {
		return Usage{}, fmt.Errorf("usage of %s: %w", p, err)
	}
	u.Data = data
	return u, nil
}

// DataRanges lists the ranges of file p that hold data, in order: the
// slices JuiceFS maps for each of its chunks (through the mount's control
// file). A hole is no slice; zeros written as data are data. Reading a
// range outside them returns zeros without touching object storage.
func (v *JuiceFS) DataRanges(ctx context.Context, p Path) ([]sparse.Extent, error) {
	root, hp, err := v.readHost(p)
	if err != nil {
		return nil, fmt.Errorf("data ranges of %s: %w", p, err)
	}
	info, err := controlSlices(ctx, root, hp)
	if err != nil {
		return nil, fmt.Errorf("data ranges of %s: %w", p, err)
	}
	return info.dataRanges(), nil
}

// dataBytes sums the data the files reference, asked through the mount's
// control file (control.go). Without one, it runs `juicefs info --raw`,
// one process per batch of files, not per file: each start costs tens of
// milliseconds (a checkpoint's directory has several).
func (v *JuiceFS) dataBytes(ctx context.Context, root string, files []string) (int64, error) {
	var total int64
	for _, f := range files {
		n, err := controlDataBytes(ctx, root, f)
		if errors.Is(err, errNoControl) {
			return v.dataBytesCLI(ctx, files)
		}
		if err != nil {
			return 0, err
		}
		total += n
	}
	return total, nil
}

func (v *JuiceFS) dataBytesCLI(ctx context.Context, files []string) (int64, error) {
	var total int64
	const batch = 64
	for len(files) > 0 {
		n := min(batch, len(files))
		out, err := v.run(ctx, false, append([]string{"info", "--raw"}, files[:n]...)...)
		if err != nil {
			return 0, err
		}
		data, err := parseInfoData(out)
		if err != nil {
			return 0, fmt.Errorf("juicefs info: %w", err)
		}
		total += data
		files = files[n:]
	}
	return total, nil
}

// parseInfoData sums the length column of the chunks tables of
// `juicefs info --raw FILE...` for slices that hold data (id not 0):
//
//	 chunks:
//	+------------+---------+---------+--------+---------+
//	| chunkIndex | sliceId |    size | offset |  length |
//	+------------+---------+---------+--------+---------+
//	|          0 |       1 | 4194304 |      0 | 4194304 |
func parseInfoData(out []byte) (int64, error) {
	sc := bufio.NewScanner(bytes.NewReader(out))
	inChunks := false
	var cols []string
	var total int64
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		switch {
		case line == "chunks:": // one table per file: each has its header
			inChunks, cols = true, nil
			continue
		case strings.HasSuffix(line, ":") && !strings.HasPrefix(line, "|"):
			inChunks = false
			continue
		case !inChunks || !strings.HasPrefix(line, "|"):
			continue
		}
		cells := strings.Split(strings.Trim(line, "|"), "|")
		for i := range cells {
			cells[i] = strings.TrimSpace(cells[i])
		}
		if cols == nil {
			cols = cells
			continue
		}
		var id, length int64 = -1, -1
		for i, c := range cols {
			if i >= len(cells) {
				break
			}
			n, err := strconv.ParseInt(cells[i], 10, 64)
			if err != nil {
				return 0, fmt.Errorf("parse chunk row %q: %w", line, err)
			}
			switch c {
			case "sliceId":
				id = n
			case "length":
				length = n
			}
		}
		if id < 0 || length < 0 {
			return 0, fmt.Errorf("chunk table without sliceId and length: %q", cols)
		}
		if id != 0 {
			total += length
		}
	}
	return total, sc.Err()
}

// SliceBytes maps each slice file p references to the bytes of it that
// the file shows (asked through the read-only mount). Clones share
// slices: one that no other file references is data that only p holds,
// freed with it.
func (v *JuiceFS) SliceBytes(ctx context.Context, p Path) (map[uint64]int64, error) {
	root, hp, err := v.readHost(p)
	if err != nil {
		return nil, fmt.Errorf("slices of %s: %w", p, err)
	}
	info, err := controlSlices(ctx, root, hp)
	if err != nil {
		return nil, fmt.Errorf("slices of %s: %w", p, err)
	}
	out := map[uint64]int64{}
	for _, c := range info.Chunks {
		if c.ID != 0 {
			out[c.ID] += int64(c.Len)
		}
	}
	return out, nil
}
