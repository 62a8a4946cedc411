#!/usr/bin/env bash
# debootstrap.sh OUT LOG: debootstraps Debian bookworm (minbase plus
# image/debian-packages.txt) and writes the tree as a tar.lz4 to OUT, the
# cache that image/rootfs-debian.sh starts from. debootstrap's own output
# goes to LOG. Needs root. Self-contained on purpose: its hash (with the
# package list, suite and mirror) is the cache key.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
out=$1 log=$2
suite=bookworm
mirror=${DEN_DEBIAN_MIRROR:-http://deb.debian.org/debian}

work=$(mktemp -d "${out}.work.XXXXXX")
trap 'rm -rf "$work"' EXIT
pkgs=$(sed -e 's/#.*//' -e '/^[[:space:]]*$/d' "$here/debian-packages.txt" | tr -s ' \n' ',' | sed 's/,$//')
if ! debootstrap --variant=minbase --components=main --include="$pkgs" \
	"$suite" "$work/root" "$mirror" >"$log" 2>&1; then
	tail -n 5 "$log" | sed 's/^/image: debootstrap: /' >&2
	echo "image: error: debootstrap $suite from $mirror failed (full log: $log)" >&2
	exit 1
fi
# Downloaded .debs and package lists are not part of the image.
rm -rf "$work/root/var/cache/apt/archives/"*.deb "$work/root/var/lib/apt/lists/"*
tar --numeric-owner --xattrs --xattrs-include='*' --acls -C "$work/root" -cf - . | lz4 -1 -q >"$out"
