#!/usr/bin/env bash
# Installs the Debian packages den and its tests need, once.
set -euo pipefail
pkgs=(qemu-system-x86 qemu-utils busybox-static fuse3 debootstrap lz4 e2fsprogs diffutils mount cpio
      openssh-client binutils iproute2 ca-certificates postgresql ansible-core nftables iperf3)
missing=()
for p in "${pkgs[@]}"; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
	echo "deps: apt packages present (${#pkgs[@]})"
	exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
	echo "deps: missing apt packages: ${missing[*]}; run as root (or: sudo apt-get install ${missing[*]})" >&2
	exit 1
fi
echo "deps: apt-get install ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq >/dev/null
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
