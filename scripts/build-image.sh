#!/usr/bin/env bash
# build-image.sh [DIR]: builds den's guest images into DIR (default
# $DEN_IMAGE_DIR, else <repo>/build/images):
#
#   bzImage          Debian's cloud kernel as shipped (QEMU -kernel)
#   vmlinux          the same kernel as a PVH ELF (Cloud Hypervisor)
#   initramfs.img    busybox /init that loads the virtio modules, mounts
#                    /dev/vda and switch_roots into it
#   minimal.ext4     busybox + den-agent as /sbin/init (boots in seconds)
#   debian.ext4      Debian bookworm with systemd and den-agent.service
#   manifest.json    artifacts, sizes, keys, kernel version (see image/image.go)
#   cache/           the kernel .deb and the debootstrap tarball
#
# Every artifact has a key: a hash of its build scripts and inputs (kernel
# package version, busybox version, den-agent binary, package list). An
# artifact whose key is unchanged is not rebuilt. Work happens in a temporary
# directory inside DIR and finished files are renamed into place.
#
# Environment:
#   DEN_AGENT_BIN       the den-agent binary (default <repo>/bin/den-agent)
#   DEN_IMAGE_ONLY      build only these steps, e.g. "kernel initramfs minimal"
#                       (default: kernel initramfs minimal debian)
#   DEN_KERNEL_DEB      use this linux-image-*-cloud-amd64 .deb instead of
#                       the one apt resolves (offline builds)
#   DEN_DEBIAN_MIRROR   debootstrap mirror (default http://deb.debian.org/debian)
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
here=$repo/image
. "$here/lib.sh"

dir=${1:-${DEN_IMAGE_DIR:-$repo/build/images}}
agent=${DEN_AGENT_BIN:-$repo/bin/den-agent}
only=" $(echo "${DEN_IMAGE_ONLY:-kernel initramfs minimal debian}" | tr ',' ' ') "
mirror=${DEN_DEBIAN_MIRROR:-http://deb.debian.org/debian}
minimal_size=256M
debian_size=4G

want() { [[ $only == *" $1 "* ]]; }
need sha256sum readelf objcopy lz4 cpio gzip mkfs.ext4 dpkg-deb flock
bb=$(busybox_bin)
bbver=$(dpkg-query -W -f='${Version}' busybox-static 2>/dev/null || "$bb" --help 2>&1 | sed -n 1p)

is_root() { [ "$(id -u)" -eq 0 ]; }
require_root() {
	is_root || die "building guest images needs root (debootstrap, device nodes, file ownership): run 'make image' as root"
}

if ! mkdir -p "$dir" 2>/dev/null || [ ! -w "$dir" ]; then
	die "cannot write the image directory $dir (building guest images needs root: run 'make image' as root)"
fi
dir=$(cd "$dir" && pwd)
exec 9>"$dir/.lock"
if ! flock -n 9; then
	log "waiting for another image build in $dir"
	flock 9
fi
rm -rf "$dir"/.tmp.*
tmp=$(mktemp -d "$dir/.tmp.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$dir/cache" "$dir/.keys"

# --- state of an artifact ---------------------------------------------------
# .keys/NAME holds "KEY BUILT-AT"; it is removed before and written after the
# artifact's files are renamed into place.
key_of() { cut -d' ' -f1 "$dir/.keys/$1" 2>/dev/null || true; }
built_at() { cut -d' ' -f2 "$dir/.keys/$1" 2>/dev/null || true; }
uptodate() { # NAME KEY FILE...
	local name=$1 key=$2 f
	shift 2
	[ "$(key_of "$name")" = "$key" ] || return 1
	for f in "$@"; do [ -f "$dir/$f" ] || return 1; done
}
commit() { # NAME KEY FILE... (each FILE from $tmp/out/FILE)
	local name=$1 key=$2 f
	shift 2
	rm -f "$dir/.keys/$name"
	for f in "$@"; do mv -f "$tmp/out/$f" "$dir/$f"; done
	echo "$key $(date -u +%Y-%m-%dT%H:%M:%SZ)" >"$dir/.keys/$name.new"
	mv -f "$dir/.keys/$name.new" "$dir/.keys/$name"
	built=$((built + 1))
	write_manifest
}
mkdir -p "$tmp/out"
built=0

# --- manifest.json -----------------------------------------------------------
# Rewritten after every artifact, so it always matches the keys on disk.
entry() { # NAME FILE KIND STEP
	local f=$dir/$2 key
	key=$(key_of "$4")
	[ -f "$f" ] && [ -n "$key" ] || return 0
	printf '    {"name": "%s", "file": "%s", "kind": "%s", "size": %s, "disk_usage": %s, "key": "%s", "built": "%s"},\n' \
		"$1" "$2" "$3" "$(stat -c %s "$f")" "$(($(stat -c '%b * %B' "$f")))" "$key" "$(built_at "$4")"
}
write_manifest() {
	{
		printf '{\n  "format": 1,\n'
		printf '  "kernel": {"package": "%s", "version": "%s", "release": "%s"},\n' "$kpkg" "$kver" "$krel"
		printf '  "artifacts": [\n'
		{
			entry bzImage bzImage kernel kernel
			entry vmlinux vmlinux kernel kernel
			entry initramfs initramfs.img initramfs initramfs
			entry minimal minimal.ext4 rootfs minimal
			entry debian debian.ext4 rootfs debian
		} | sed '$ s/},$/}/'
		printf '  ]\n}\n'
	} >"$tmp/manifest.json"
	if ! cmp -s "$tmp/manifest.json" "$dir/manifest.json"; then
		mv -f "$tmp/manifest.json" "$dir/manifest.json"
		manifest_written=1
	fi
}
manifest_written=

# --- kernel package ------------------------------------------------------------
if [ -n "${DEN_KERNEL_DEB:-}" ]; then
	[ -f "$DEN_KERNEL_DEB" ] || die "DEN_KERNEL_DEB=$DEN_KERNEL_DEB: no such file"
	kpkg=$(dpkg-deb -f "$DEN_KERNEL_DEB" Package)
	kver=$(dpkg-deb -f "$DEN_KERNEL_DEB" Version)
else
	resolve_kernel() {
		apt-cache depends linux-image-cloud-amd64 2>/dev/null |
			sed -n 's/^ *Depends: \(linux-image-[0-9][^ ]*\)$/\1/p' | head -n 1
	}
	kpkg=$(resolve_kernel)
	if [ -z "$kpkg" ] && is_root; then
		log "apt-get update (no package list knows linux-image-cloud-amd64)"
		apt-get update -qq >/dev/null || die "apt-get update failed"
		kpkg=$(resolve_kernel)
	fi
	[ -n "$kpkg" ] || die "apt knows no linux-image-cloud-amd64: run apt-get update (as root)"
	kver=$(apt-cache show --no-all-versions "$kpkg" 2>/dev/null | sed -n 's/^Version: //p' | head -n 1)
	[ -n "$kver" ] || die "apt has no version of $kpkg"
fi
krel=${kpkg#linux-image-}
kdeb=$dir/cache/${kpkg}_${kver}_amd64.deb
[ -n "${DEN_KERNEL_DEB:-}" ] && kdeb=$DEN_KERNEL_DEB

# kernel_tree: the package extracted once per run into $tmp/kpkg.
ktree=
kernel_tree() {
	[ -n "$ktree" ] && return 0
	if [ ! -f "$kdeb" ]; then
		log "kernel: apt-get download $kpkg=$kver"
		mkdir -p "$tmp/dl"
		(cd "$tmp/dl" && apt-get download -q=2 -o APT::Sandbox::User=root "$kpkg=$kver" >/dev/null) ||
			die "apt-get download $kpkg=$kver failed"
		rm -f "$dir/cache/"linux-image-*.deb
		mv "$tmp/dl/"*.deb "$kdeb"
	fi
	log "kernel: dpkg-deb -x $(basename "$kdeb")"
	dpkg-deb -x "$kdeb" "$tmp/kpkg"
	[ -f "$tmp/kpkg/boot/vmlinuz-$krel" ] || die "kernel: $kdeb has no boot/vmlinuz-$krel"
	[ -d "$tmp/kpkg/lib/modules/$krel" ] || die "kernel: $kdeb has no lib/modules/$krel"
	ktree=$tmp/kpkg
}

# --- den-agent -------------------------------------------------------------------
agent_sha=
unit=
if want minimal || want debian; then
	[ -f "$agent" ] || die "den-agent binary $agent not found: run 'make build' first (or set DEN_AGENT_BIN)"
	if is_static "$agent"; then
		:
	elif [ "$(head -c 2 "$agent")" = '#!' ]; then
		log "warning: den-agent $agent is a script (a stand-in, not the real agent)"
	else
		die "den-agent $agent is not a static executable (build it with CGO_ENABLED=0)"
	fi
	agent_sha=$(sha256sum <"$agent" | cut -d' ' -f1)
	unit=$repo/cmd/den-agent/den-agent.service
	if want debian && [ ! -f "$unit" ]; then
		die "the agent's systemd unit $unit is missing"
	fi
fi

# --- kernel: bzImage + vmlinux ---------------------------------------------------
kkey=$(hash_inputs kernel "$here/lib.sh" "$here/extract-vmlinux.sh" "$kpkg=$kver")
if want kernel; then
	if uptodate kernel "$kkey" bzImage vmlinux; then
		log "kernel up to date (key $kkey, $kpkg $kver)"
	else
		require_root
		kernel_tree
		cp "$ktree/boot/vmlinuz-$krel" "$tmp/out/bzImage"
		log "kernel: extract PVH vmlinux from $kpkg $kver"
		"$here/extract-vmlinux.sh" "$tmp/out/bzImage" "$tmp/out/vmlinux"
		commit kernel "$kkey" bzImage vmlinux
		log "kernel built (key $kkey)"
	fi
fi

# --- initramfs -----------------------------------------------------------------------
ikey=$(hash_inputs initramfs "$here/lib.sh" "$here/initramfs.sh" "$here/init-initramfs.sh" \
	"$here/modules.txt" "$kpkg=$kver" "busybox=$bbver")
if want initramfs; then
	if uptodate initramfs "$ikey" initramfs.img; then
		log "initramfs up to date (key $ikey)"
	else
		require_root
		kernel_tree
		log "initramfs: busybox $bbver, modules of $krel"
		msg=$("$here/initramfs.sh" "$ktree/lib/modules/$krel" "$tmp/out/initramfs.img")
		log "initramfs: $msg"
		commit initramfs "$ikey" initramfs.img
		log "initramfs built (key $ikey)"
	fi
fi

# --- minimal root filesystem -------------------------------------------------------
if want minimal; then
	mkey=$(hash_inputs minimal "$here/lib.sh" "$here/rootfs-minimal.sh" "busybox=$bbver" \
		"agent=$agent_sha" "size=$minimal_size")
	if uptodate minimal "$mkey" minimal.ext4; then
		log "minimal up to date (key $mkey)"
	else
		require_root
		log "minimal: busybox + den-agent as /sbin/init, mkfs.ext4 $minimal_size"
		"$here/rootfs-minimal.sh" "$agent" "$tmp/out/minimal.ext4" "$minimal_size"
		commit minimal "$mkey" minimal.ext4
		log "minimal built (key $mkey)"
	fi
fi

# --- debian root filesystem --------------------------------------------------------
if want debian; then
	dbver=$(dpkg-query -W -f='${Version}' debootstrap 2>/dev/null || echo unknown)
	tkey=$(hash_inputs debootstrap "$here/debootstrap.sh" "$here/debian-packages.txt" \
		"mirror=$mirror" "debootstrap=$dbver")
	tarball=$dir/cache/debootstrap-bookworm-$tkey.tar.lz4
	dkey=$(hash_inputs debian "$here/lib.sh" "$here/rootfs-debian.sh" "tree=$tkey" \
		"agent=$agent_sha" "$unit" "$kpkg=$kver" "size=$debian_size")
	if uptodate debian "$dkey" debian.ext4; then
		log "debian up to date (key $dkey)"
	else
		require_root
		need debootstrap
		if [ -f "$tarball" ]; then
			log "debian: debootstrap tree cached ($(basename "$tarball"))"
		else
			log "debian: debootstrap bookworm from $mirror (a few minutes; log: $dir/cache/debootstrap.log)"
			"$here/debootstrap.sh" "$tmp/tree.tar.lz4" "$dir/cache/debootstrap.log"
			rm -f "$dir/cache/"debootstrap-*.tar.lz4
			mv "$tmp/tree.tar.lz4" "$tarball"
			log "debian: debootstrap tree cached ($(du -h "$tarball" | cut -f1))"
		fi
		kernel_tree
		log "debian: den-agent, $(basename "$unit"), modules of $krel, mkfs.ext4 $debian_size"
		"$here/rootfs-debian.sh" "$tarball" "$agent" "$unit" "$ktree/lib/modules/$krel" \
			"$tmp/out/debian.ext4" "$debian_size"
		commit debian "$dkey" debian.ext4
		log "debian built (key $dkey)"
	fi
fi

write_manifest
[ -n "$manifest_written" ] && log "manifest.json written"
if [ "$built" -eq 0 ]; then
	log "all up to date in $dir"
else
	log "done: $(cd "$dir" && for f in bzImage vmlinux initramfs.img minimal.ext4 debian.ext4; do
		[ -f "$f" ] && printf '%s %s (%s on disk), ' "$f" "$(du -h --apparent-size "$f" | cut -f1)" "$(du -h "$f" | cut -f1)"
	done | sed 's/, $//')"
fi
