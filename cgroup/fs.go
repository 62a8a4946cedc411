package cgroup

import "golang.org/x/sys/unix"

// isCgroupFS reports whether path is on a cgroup (v1 or v2) filesystem.
func isCgroupFS(path string) bool {
	var st unix.Statfs_t
	if err := unix.Statfs(path, &st); err != nil {
		return false
	}
	return st.Type == unix.CGROUP2_SUPER_MAGIC || st.Type == unix.CGROUP_SUPER_MAGIC
}
