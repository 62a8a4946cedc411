#!/usr/bin/env bash
# rootfs-debian.sh TARBALL AGENT UNIT MODDIR OUT SIZE: the "debian" root
# filesystem as a raw sparse ext4 image, from the debootstrap cache TARBALL
# (image/debootstrap.sh): den-agent at /usr/local/bin/den-agent (linked
# from /usr/sbin/den-agent) with its systemd unit UNIT enabled, the kernel's modules from MODDIR
# (lib/modules/<release>, depmod'ed), root's password locked, no machine-id
# (first boot makes one), and no periodic timers that would wake an idle VM.
# Needs root.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/lib.sh"
tarball=$1 agent=$2 unit=$3 moddir=$4 out=$5 size=$6
need mkfs.ext4 lz4

work=$(mktemp -d "${out}.work.XXXXXX")
trap 'rm -rf "$work"' EXIT
r=$work/root
mkdir -p "$r"
lz4 -dc "$tarball" | tar --numeric-owner --xattrs --xattrs-include='*' --acls -C "$r" -xf -

# The agent (also as /usr/sbin/den-agent, where its unit starts it) and its
# unit, enabled.
install -m 0755 "$agent" "$r/usr/local/bin/den-agent"
ln -sf ../local/bin/den-agent "$r/usr/sbin/den-agent"
install -m 0644 "$unit" "$r/etc/systemd/system/den-agent.service"
exe=$(sed -n 's/^ExecStart=[-@:+!]*\([^ ]*\).*/\1/p' "$unit" | head -n 1)
[ -n "$exe" ] && [ -x "$r$exe" ] ||
	die "debian: $unit starts ${exe:-nothing}, which the image does not have"
chroot "$r" systemctl enable --quiet den-agent.service
mkdir -p "$r/etc/den"
printf 'den debian\n' >"$r/etc/den/image"

# The kernel's modules (the initramfs loads the virtio ones; the rest, e.g.
# fuse, overlay, tun, nf_tables, are here for modprobe).
kver=$(basename "$moddir")
mkdir -p "$r/usr/lib/modules"
cp -a "$moddir" "$r/usr/lib/modules/$kver"
chroot "$r" depmod -a "$kver"

# Identity: set by the agent at boot (hostname) and by systemd on first boot
# (machine-id); nothing of the build host leaks in.
echo den >"$r/etc/hostname"
cat >"$r/etc/hosts" <<'X'
127.0.0.1	localhost
127.0.1.1	den
::1		localhost ip6-localhost ip6-loopback
ff02::1		ip6-allnodes
ff02::2		ip6-allrouters
X
: >"$r/etc/resolv.conf"
: >"$r/etc/machine-id"
rm -f "$r/var/lib/dbus/machine-id"
ln -s /etc/machine-id "$r/var/lib/dbus/machine-id"
echo '/dev/vda / ext4 rw,relatime,errors=remount-ro 0 0' >"$r/etc/fstab"
cat >"$r/etc/apt/sources.list" <<'X'
deb http://deb.debian.org/debian bookworm main
deb http://deb.debian.org/debian bookworm-updates main
deb http://deb.debian.org/debian-security bookworm-security main
X

# Root cannot log in with a password (shells come through the agent).
sed -i 's/^root:[^:]*:/root:*:/' "$r/etc/shadow"

# A login shell without a terminal (an E2B program's every command is
# bash -l -c) runs no mesg: it has no terminal to guard, and under TCG
# each program run costs tens of milliseconds.
sed -i 's/^mesg n 2> \/dev\/null || true$/if [ -t 0 ]; then mesg n 2>\/dev\/null || true; fi/' "$r/root/.profile"
grep -q '^if \[ -t 0 \]; then mesg n' "$r/root/.profile" ||
	{ echo "rootfs-debian: /root/.profile has no 'mesg n' line to guard" >&2; exit 1; }

# Nothing periodic wakes an idle VM; no VGA console on a microVM.
for u in apt-daily.timer apt-daily-upgrade.timer dpkg-db-backup.timer \
	e2scrub_all.timer fstrim.timer man-db.timer getty@tty1.service; do
	rm -f "$r"/etc/systemd/system/*.wants/"$u"
done

rm -rf "$r/tmp/"* "$r/var/tmp/"* "$r/var/log/"*.log "$r/var/cache/apt/"*.bin
rm -f "$out"
truncate -s "$size" "$out"
mkfs.ext4 -q -F -L den-debian -d "$r" "$out"
