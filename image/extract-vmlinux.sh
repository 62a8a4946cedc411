#!/usr/bin/env bash
# extract-vmlinux.sh BZIMAGE OUT: writes the ELF vmlinux inside a bzImage
# to OUT, for Cloud Hypervisor's PVH boot. The protected-mode part starts at
# (setup_sects+1)*512 (setup_sects: the byte at 0x1f1; 0 means 4); the setup
# header holds payload_offset and payload_length (little-endian u32 at 0x248
# and 0x24c), relative to that start. Debian's payload is legacy LZ4; gzip,
# xz and zstd are handled too. Fails unless the result is an ELF with the Xen
# PVH entry note (XEN_ELFNOTE_PHYS32_ENTRY, type 0x12).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/lib.sh"
in=$1 out=$2
need readelf

u8() { od -An -tu1 -j "$1" -N1 "$in" | tr -d ' '; }
u32() { od -An -tu4 -j "$1" -N4 --endian=little "$in" | tr -d ' '; }

[ "$(dd if="$in" bs=1 skip=$((0x202)) count=4 status=none)" = HdrS ] ||
	die "vmlinux: $in is not a bzImage (no HdrS at 0x202)"
ss=$(u8 $((0x1f1)))
[ "$ss" -eq 0 ] && ss=4
pm=$(((ss + 1) * 512))
off=$(u32 $((0x248)))
len=$(u32 $((0x24c)))
[ "$len" -gt 0 ] || die "vmlinux: $in has an empty payload"

payload() { dd if="$in" iflag=skip_bytes,count_bytes skip=$((pm + off)) count="$len" bs=1M status=none; }
magic=$(od -An -tx1 -j $((pm + off)) -N4 "$in" | tr -d ' ')
case $magic in
02214c18) need lz4; dec=(lz4 -dc) ;;
1f8b*) dec=(gzip -dc) ;;
fd377a58) need xz; dec=(xz -dc) ;;
28b52ffd) need zstd; dec=(zstd -qdc) ;;
*) die "vmlinux: unknown payload compression in $in (magic $magic)" ;;
esac
# Some formats carry trailing data (the 4-byte size); decompressors that
# complain about it still wrote the whole image, so judge by the ELF.
payload | "${dec[@]}" >"$out" 2>/dev/null || true
readelf -h "$out" >/dev/null 2>&1 ||
	die "vmlinux: ${dec[0]} of the payload of $in did not give an ELF"
if ! readelf -n "$out" | grep -E '^[[:space:]]*Xen[[:space:]]' | grep -iE '0x00000012|PHYS32_ENTRY' >/dev/null; then
	die "vmlinux: $out has no Xen PVH entry note (XEN_ELFNOTE_PHYS32_ENTRY): Cloud Hypervisor cannot boot it"
fi
