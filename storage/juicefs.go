package storage

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// JuiceFSVersion is the juicefs release den is built and tested with (see
// tools/juicefs/go.mod and scripts/deps-tools.sh).
const JuiceFSVersion = "1.4.1"

// FindJuiceFS returns the juicefs binary to run: explicit if set, else
// $DEN_JUICEFS, else juicefs beside the running executable (den's bin/),
// else juicefs in PATH.
func FindJuiceFS(explicit string) (string, error) {
	for _, p := range []string{explicit, os.Getenv("DEN_JUICEFS")} {
		if p != "" {
			if _, err := os.Stat(p); err != nil {
				return "", fmt.Errorf("find juicefs: %w", err)
			}
			return p, nil
		}
	}
	if exe, err := os.Executable(); err == nil {
		p := filepath.Join(filepath.Dir(exe), "juicefs")
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
	}
	p, err := exec.LookPath("juicefs")
	if err != nil {
		return "", errors.New("find juicefs: not in DEN_JUICEFS, beside den or in PATH: run `make deps` (scripts/deps-tools.sh builds bin/juicefs)")
	}
	return p, nil
}

// Patched is in the version of the juicefs that `make deps` builds
// (scripts/deps-tools.sh): JuiceFS with den's patch that runs a metadata
// transaction again when PostgreSQL restarts (tools/juicefs/patch).
const Patched = "+den.pgretry"

// warnUnpatched logs a warning when bin, run on metadata in PostgreSQL,
// is not the juicefs `make deps` builds: a restart of PostgreSQL then
// fails the disks of running VMs for good.
func warnUnpatched(ctx context.Context, bin string) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, bin, "--version").Output()
	if err == nil && strings.Contains(string(out), Patched) {
		return
	}
	slog.Warn("storage: this juicefs is not den's build (make deps): a restart of PostgreSQL will fail the disks of running vms (docs/cluster.md)",
		"juicefs", bin, "version", strings.TrimSpace(string(out)), "err", err)
}

// run runs one juicefs command to completion. On failure the error carries
// the last meaningful lines of its output.
func (v *JuiceFS) run(ctx context.Context, format bool, args ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, v.bin, append([]string{"--no-color"}, args...)...)
	cmd.Env = v.cfg.env(format)
	var out, errb bytes.Buffer
	cmd.Stdout = &out
	cmd.Stderr = &errb
	if err := cmd.Run(); err != nil {
		if ctx.Err() != nil {
			err = ctx.Err()
		}
		return out.Bytes(), fmt.Errorf("juicefs %s: %w: %s", args[0], err, lastLines(errb.String()+out.String(), 3))
	}
	return out.Bytes(), nil
}

// lastLines keeps the last n non-empty lines of juicefs output, without the
// timestamp and pid prefix of its log lines.
func lastLines(s string, n int) string {
	var keep []string
	for _, l := range strings.Split(s, "\n") {
		l = strings.TrimSpace(l)
		if l == "" {
			continue
		}
		// 2026/11/21 08:00:00.123456 juicefs[123] <FATAL>: msg [fn@file.go:12]
		if i := strings.Index(l, "juicefs["); i >= 0 {
			if j := strings.Index(l[i:], ">: "); j >= 0 {
				l = strings.TrimSpace(l[i+j+3:])
			}
		}
		if j := strings.LastIndex(l, " ["); j > 0 && strings.HasSuffix(l, "]") && strings.Contains(l[j:], ".go:") {
			l = l[:j]
		}
		keep = append(keep, l)
	}
	if len(keep) > n {
		keep = keep[len(keep)-n:]
	}
	if len(keep) == 0 {
		return "no output"
	}
	return strings.Join(keep, "; ")
}

// mountInfo is one line of /proc/self/mountinfo.
type mountInfo struct {
	Minor  int    // device minor: /sys/fs/fuse/connections/<minor>
	Dev    uint64 // st_dev of the mount
	Point  string
	FSType string
	Source string
}

// IsMountPoint says whether a file system is mounted at dir.
func IsMountPoint(dir string) (bool, error) {
	_, ok, err := findMount(dir)
	return ok, err
}

// findMount returns the mount at point, if any (the last one mounted there).
func findMount(point string) (mountInfo, bool, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return mountInfo{}, false, err
	}
	defer f.Close()
	var found mountInfo
	ok := false
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	for sc.Scan() {
		// 36 35 0:52 / /mnt rw,relatime shared:1 - fuse.juicefs den rw,...
		fields := strings.Fields(sc.Text())
		if len(fields) < 10 {
			continue
		}
		if unescapeMount(fields[4]) != point {
			continue
		}
		sep := -1
		for i := 6; i < len(fields); i++ {
			if fields[i] == "-" {
				sep = i
				break
			}
		}
		if sep < 0 || sep+2 >= len(fields) {
			continue
		}
		maj, min, _ := strings.Cut(fields[2], ":")
		ma, _ := strconv.Atoi(maj)
		mi, _ := strconv.Atoi(min)
		found = mountInfo{
			Minor:  mi,
			Dev:    unix.Mkdev(uint32(ma), uint32(mi)),
			Point:  point,
			FSType: fields[sep+1],
			Source: fields[sep+2],
		}
		ok = true
	}
	return found, ok, sc.Err()
}

// unescapeMount undoes the octal escapes (\040 for space) of mountinfo.
func unescapeMount(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}
