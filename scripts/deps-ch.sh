#!/usr/bin/env bash
# Installs the pinned Cloud Hypervisor release into bin/ where it can be
# downloaded, verified by its sha256. Never fails: without Cloud Hypervisor
# den uses QEMU. Keep the pins in step with vmm/cloudhypervisor/binary.go.
set -uo pipefail
cd "$(dirname "$0")/.."

version="v53.0"
base="https://github.com/cloud-hypervisor/cloud-hypervisor/releases/download/$version"
case "$(uname -m)" in
x86_64)
	asset="cloud-hypervisor-static"
	sha256="448af3d4e59b22c2987f7df94c213ad40fb53a10d437e42b5ee6c4fce7c29ecc" ;;
aarch64)
	asset="cloud-hypervisor-static-aarch64"
	sha256="f192b510eea1c710cbc439d716bb0573c223fc463dbe3e6523788a2b7ef62850" ;;
*)
	echo "deps: cloud-hypervisor has no release for $(uname -m); QEMU will be used"
	exit 0 ;;
esac

report() { # path
	local v
	v=$("$1" --version 2>/dev/null | awk '$1 == "cloud-hypervisor" { print $2; exit }')
	if [ "$v" = "$version" ] || [ "$v" = "$version.0" ]; then
		echo "deps: cloud-hypervisor $v at $1"
	else
		echo "deps: cloud-hypervisor ${v:-of unknown version} at $1 (den pins $version; den doctor will say so)"
	fi
}

for c in "${DEN_CH_BINARY:-}" "$PWD/bin/cloud-hypervisor" "$(command -v cloud-hypervisor 2>/dev/null)"; do
	if [ -n "$c" ] && [ -x "$c" ]; then
		report "$c"
		exit 0
	fi
done

if ! command -v curl >/dev/null || ! command -v sha256sum >/dev/null; then
	echo "deps: cloud-hypervisor not downloadable here (curl or sha256sum missing); QEMU will be used"
	exit 0
fi
if [ -z "$sha256" ]; then
	echo "deps: cloud-hypervisor not installed: no checksum pinned for $asset $version, refusing an unverified binary; QEMU will be used"
	exit 0
fi

mkdir -p bin
tmp=$(mktemp bin/.cloud-hypervisor.XXXXXX)
trap 'rm -f "$tmp"' EXIT
# A short connect timeout: where the network refuses, say so at once. A
# transfer slower than 10 KB/s for 10 s is abandoned too.
if ! err=$(curl -fsSL --connect-timeout 10 --speed-limit 10240 --speed-time 10 --max-time 300 \
	-o "$tmp" "$base/$asset" 2>&1); then
	echo "deps: cloud-hypervisor not downloadable here ($(echo "$err" | tail -n1)); QEMU will be used"
	exit 0
fi
got=$(sha256sum "$tmp" | awk '{ print $1 }')
if [ "$got" != "$sha256" ]; then
	echo "deps: cloud-hypervisor download REJECTED: sha256 $got, want $sha256 ($base/$asset); not installed, QEMU will be used" >&2
	exit 0
fi
chmod 755 "$tmp"
mv "$tmp" bin/cloud-hypervisor
trap - EXIT
report bin/cloud-hypervisor
