#!/bin/sh
# /init of den's guest initramfs (busybox sh, PID 1).
#
# Loads the virtio (and, where they are modules, filesystem) drivers listed
# in /etc/modules.load in that order, waits a bounded time for the root disk,
# mounts it and switch_roots into it. Any failure prints one line starting
# "den-initramfs: FATAL:" on the console and powers the VM off (or, without
# ACPI, reboots it): it never hangs silently.
#
# Kernel command line (all optional):
#   root=/dev/vda        root block device (a /dev path; no LABEL=/UUID=)
#   rootfstype=ext4      filesystem type
#   rootflags=OPTS       extra mount options
#   ro | rw              mount read-only or read-write (default rw)
#   init=/sbin/init      program to exec in the root filesystem
#   den.rootwait=SECS    how long to wait for the root device (default 10)
#   den.shell            on failure, start a shell on the console instead of
#                        powering off (debugging only)

export PATH=/bin:/sbin:/usr/bin:/usr/sbin

mount -t devtmpfs -o mode=0755,nosuid devtmpfs /dev 2>/dev/null
exec </dev/console >/dev/console 2>&1
mount -t proc -o nosuid,nodev,noexec proc /proc
mount -t sysfs -o nosuid,nodev,noexec sysfs /sys

uptime() { read -r up _ </proc/uptime; echo "$up"; }
log() { echo "den-initramfs: $* (at $(uptime)s)"; }

shell_on_fail=
fail() {
	echo "den-initramfs: FATAL: $*"
	if [ -n "$shell_on_fail" ]; then
		echo "den-initramfs: den.shell given: starting a shell"
		setsid cttyhack sh
	fi
	sync
	# Without ACPI the kernel cannot power off and would only halt, so
	# reboot instead: a VMM run with -no-reboot (QEMU) then exits as well.
	if [ -d /sys/firmware/acpi ]; then
		echo "den-initramfs: powering off"
		poweroff -f
	fi
	echo "den-initramfs: rebooting (no ACPI power off)"
	reboot -f
	sleep 5
	echo b >/proc/sysrq-trigger
	exit 1
}

root=/dev/vda
rootfstype=ext4
rootflags=
rwmode=rw
init=/sbin/init
rootwait=10
set -f
for arg in $(cat /proc/cmdline); do
	case $arg in
	root=*) root=${arg#root=} ;;
	rootfstype=*) rootfstype=${arg#rootfstype=} ;;
	rootflags=*) rootflags=${arg#rootflags=} ;;
	ro) rwmode=ro ;;
	rw) rwmode=rw ;;
	init=*) init=${arg#init=} ;;
	den.rootwait=*) rootwait=${arg#den.rootwait=} ;;
	den.shell) shell_on_fail=1 ;;
	esac
done
set +f
case $rootwait in '' | *[!0-9]*) rootwait=10 ;; esac

log "start (kernel $(uname -r))"

n=0
while read -r mod; do
	case $mod in '' | '#'*) continue ;; esac
	if [ -d "/sys/module/${mod%.ko}" ]; then
		continue
	fi
	out=$(insmod "/lib/modules/$mod" 2>&1) || fail "insmod $mod: $out"
	n=$((n + 1))
done </etc/modules.load
log "loaded $n modules"

# Wait for the root device, polling every 0.1 s up to rootwait seconds.
tries=$((rootwait * 10))
while [ ! -b "$root" ]; do
	tries=$((tries - 1))
	if [ "$tries" -le 0 ]; then
		echo "den-initramfs: block devices: $(ls /sys/class/block 2>/dev/null | tr '\n' ' ')"
		fail "root device $root did not appear within ${rootwait}s"
	fi
	usleep 100000
done
dev=$root
log "root device $dev"

opts=$rwmode
[ -n "$rootflags" ] && opts="$opts,$rootflags"
mkdir -p /newroot
out=$(mount -t "$rootfstype" -o "$opts" "$dev" /newroot 2>&1) ||
	fail "mount $dev ($rootfstype, $opts) on /newroot: $out"

if [ ! -x "/newroot$init" ] && [ ! -L "/newroot$init" ]; then
	fail "$init not found or not executable in the root filesystem on $dev"
fi

# Hand /dev (devtmpfs) to the new root; unmount what the init sets up
# itself. A systemd or agent init finds /dev already mounted.
if [ -d /newroot/dev ]; then
	mount --move /dev /newroot/dev || umount /dev
else
	umount /dev
fi
log "switch_root to $init"
umount /sys
umount /proc
# If switch_root cannot exec the init it prints why and exits, and the
# kernel panics with "Attempted to kill init" (visible; with panic=-1 on the
# command line the VM then stops).
exec switch_root /newroot "$init" "$@"
