#!/usr/bin/env bash
# initramfs.sh MODDIR OUT: builds den's guest initramfs (gzip'd cpio newc)
# from the kernel's module tree MODDIR (lib/modules/<release>), the static
# busybox, image/init-initramfs.sh as /init and the modules in
# image/modules.txt plus their dependencies, in load order.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/lib.sh"
moddir=$1 out=$2
need objcopy cpio gzip
bb=$(busybox_bin)

work=$(mktemp -d "${out}.work.XXXXXX")
trap 'rm -rf "$work"' EXIT
stage=$work/root
mkdir -p "$stage"/{bin,sbin,dev,proc,sys,newroot,etc,lib/modules}

# Module index: normalized name (dashes as underscores) -> file.
declare -A path
while IFS= read -r f; do
	n=$(basename "$f"); n=${n%%.ko*}; n=${n//-/_}
	path[$n]=$f
done < <(find "$moddir/kernel" -name '*.ko' -o -name '*.ko.xz' -o -name '*.ko.zst' -o -name '*.ko.gz')
declare -A builtin
if [ -f "$moddir/modules.builtin" ]; then
	while IFS= read -r f; do
		n=$(basename "$f"); n=${n%%.ko*}; builtin[${n//-/_}]=1
	done <"$moddir/modules.builtin"
fi

# ko_plain FILE DEST: the module uncompressed (busybox insmod wants plain .ko).
ko_plain() {
	case $1 in
	*.ko.xz) need xz; xz -dc "$1" >"$2" ;;
	*.ko.zst) need zstd; zstd -qdc "$1" >"$2" ;;
	*.ko.gz) gzip -dc "$1" >"$2" ;;
	*) cp "$1" "$2" ;;
	esac
}

declare -A seen
order=()
# visit NAME: depth-first, dependencies before the module.
visit() {
	local n=${1//-/_} d deps
	[ -n "${seen[$n]:-}" ] && return 0
	seen[$n]=1
	if [ -z "${path[$n]:-}" ]; then
		[ -n "${builtin[$n]:-}" ] && return 0
		die "initramfs: module $n is neither in $moddir nor built in"
	fi
	ko_plain "${path[$n]}" "$stage/lib/modules/$n.ko"
	deps=$(objcopy -O binary --only-section=.modinfo "$stage/lib/modules/$n.ko" /dev/stdout |
		tr '\0' '\n' | sed -n 's/^depends=//p' | tr ',' ' ')
	for d in $deps; do visit "$d"; done
	order+=("$n.ko")
}
skipped=()
while read -r m _; do
	case $m in '' | '#'*) continue ;; esac
	if [ -z "${path[${m//-/_}]:-}" ] && [ -n "${builtin[${m//-/_}]:-}" ]; then
		skipped+=("$m")
	fi
	visit "$m"
done <"$here/modules.txt"
printf '%s\n' "${order[@]}" >"$stage/etc/modules.load"

cp "$bb" "$stage/bin/busybox"
for a in $("$bb" --list); do
	[ "$a" = busybox ] || ln -sf busybox "$stage/bin/$a"
done
install -m 0755 "$here/init-initramfs.sh" "$stage/init"
mknod -m 0600 "$stage/dev/console" c 5 1
mknod -m 0666 "$stage/dev/null" c 1 3

(cd "$stage" && find . -mindepth 1 | LC_ALL=C sort | cpio -o -H newc -R 0:0 --quiet) | gzip -9 >"$out"
echo "${#order[@]} modules (${order[*]%.ko}); built in: ${skipped[*]:-none}"
