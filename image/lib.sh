# shellcheck shell=bash
# Shared helpers for the guest image build scripts (sourced, not run).
# Every step prints one line prefixed "image:"; failures print one line to
# stderr and exit non-zero.

log() { echo "image: $*"; }
die() { echo "image: error: $*" >&2; exit 1; }

# need CMD...: fail with the Debian package to install when a tool is missing.
need() {
	local c
	for c in "$@"; do
		command -v "$c" >/dev/null 2>&1 && continue
		case $c in
		lz4) die "missing $c (apt-get install lz4)" ;;
		readelf|objcopy) die "missing $c (apt-get install binutils)" ;;
		mkfs.ext4|debugfs) die "missing $c (apt-get install e2fsprogs)" ;;
		cpio) die "missing $c (apt-get install cpio)" ;;
		debootstrap) die "missing $c (apt-get install debootstrap)" ;;
		xz) die "missing $c (apt-get install xz-utils)" ;;
		zstd) die "missing $c (apt-get install zstd)" ;;
		*) die "missing $c" ;;
		esac
	done
}

# busybox_bin: the static busybox from busybox-static.
busybox_bin() {
	local b
	for b in /bin/busybox /usr/bin/busybox; do
		[ -x "$b" ] || continue
		if readelf -l "$b" 2>/dev/null | grep INTERP >/dev/null; then
			continue
		fi
		echo "$b"
		return 0
	done
	die "no static busybox (apt-get install busybox-static)"
}

# is_static FILE: an ELF executable without a dynamic loader.
is_static() {
	readelf -h "$1" >/dev/null 2>&1 || return 1
	! readelf -l "$1" 2>/dev/null | grep INTERP >/dev/null
}

# hash_inputs ARG...: one sha256 over the arguments; an argument naming an
# existing file contributes its name and content, anything else its text.
hash_inputs() {
	local a
	for a in "$@"; do
		if [ -f "$a" ]; then
			printf 'file %s %s\n' "$(basename "$a")" "$(sha256sum <"$a" | cut -d' ' -f1)"
		else
			printf 'text %s\n' "$a"
		fi
	done | sha256sum | cut -c1-16
}
