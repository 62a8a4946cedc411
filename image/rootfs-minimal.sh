#!/usr/bin/env bash
# rootfs-minimal.sh AGENT OUT SIZE: the "minimal" root filesystem as a raw
# sparse ext4 image: static busybox with its applet links, den-agent as
# /sbin/init (PID 1 mounts /proc, /sys and friends itself), root in
# /etc/passwd with /bin/sh, and an empty /etc/den/. Needs root (device nodes,
# ownership).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/lib.sh"
agent=$1 out=$2 size=$3
need mkfs.ext4
bb=$(busybox_bin)

work=$(mktemp -d "${out}.work.XXXXXX")
trap 'rm -rf "$work"' EXIT
r=$work/root
mkdir -p "$r"/{bin,sbin,usr/bin,usr/sbin,usr/local/bin,dev,proc,sys,run,tmp,var/tmp,var/log,root,mnt,etc/den}
chmod 0755 "$r"
chmod 1777 "$r/tmp" "$r/var/tmp"
chmod 0700 "$r/root"

cp "$bb" "$r/bin/busybox"
# Applets where busybox says they live (bin/ls, sbin/ip, usr/bin/env...);
# never init or linuxrc: /sbin/init is the agent.
for a in $("$bb" --list-full); do
	case $a in bin/busybox | sbin/init | linuxrc) continue ;; esac
	rel=$(dirname "$a" | sed 's|[^/]*|..|g')
	mkdir -p "$r/$(dirname "$a")"
	ln -sf "$rel/bin/busybox" "$r/$a"
done

install -m 0755 "$agent" "$r/usr/local/bin/den-agent"
ln -sf ../local/bin/den-agent "$r/usr/sbin/den-agent"
ln -sf ../usr/local/bin/den-agent "$r/sbin/init"

cat >"$r/etc/passwd" <<'X'
root:x:0:0:root:/root:/bin/sh
nobody:x:65534:65534:nobody:/nonexistent:/bin/false
X
cat >"$r/etc/group" <<'X'
root:x:0:
nogroup:x:65534:
X
# No password works for root: shells come through the agent.
printf 'root:*:19000:0:99999:7:::\nnobody:*:19000:0:99999:7:::\n' >"$r/etc/shadow"
chmod 0640 "$r/etc/shadow"
echo den >"$r/etc/hostname"
printf '127.0.0.1\tlocalhost\n127.0.1.1\tden\n::1\t\tlocalhost ip6-localhost ip6-loopback\n' >"$r/etc/hosts"
: >"$r/etc/resolv.conf"
cat >"$r/etc/profile" <<'X'
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
export HOME=${HOME:-/root}
PS1='\u@\h:\w\$ '
X
printf 'den minimal\n' >"$r/etc/den/image"
mknod -m 0600 "$r/dev/console" c 5 1
mknod -m 0666 "$r/dev/null" c 1 3

rm -f "$out"
truncate -s "$size" "$out"
mkfs.ext4 -q -F -L den-minimal -d "$r" "$out"
