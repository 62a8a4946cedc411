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
#   den.identity=TOKEN   32 lowercase hex digits, new for every VM: when it
#                        differs from the root's /etc/den/identity, the root
#                        gets a new identity before its init starts (see
#                        den_identity below); a read-only root skips it
#   den.hostname=NAME    the hostname a new identity writes to /etc/hostname

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

# den-identity: begin (image/identity_test.go runs this part on its own)

# write_atomic FILE MODE TEXT: FILE holds TEXT and a newline, or is left as
# it was (a temporary file renamed over it).
write_atomic() {
	local tmp="$1.den-tmp"
	if printf '%s\n' "$3" >"$tmp" && chmod "$2" "$tmp" && mv -fT "$tmp" "$1"; then
		return 0
	fi
	rm -f "$tmp"
	log "identity: cannot write $1"
	return 1
}

# den_identity ROOT TOKEN HOSTNAME: unless TOKEN (den.identity) is the one
# recorded in ROOT/etc/den/identity, give the root filesystem a new
# identity before anything in it can read the old one (a fork cold-booting
# from a copy of its source's disk): HOSTNAME (if set) in etc/hostname and
# etc/hosts, a new machine-id, no SSH host keys (den-agent makes its own
# when it finds none), no saved random seed. The token is recorded last,
# only when every step worked, so a failed step is tried again at the next
# boot. Never fails the boot: problems are logged. The agent does the same
# (agent/guest/identity.go) when it is init and this did not run.
den_identity() {
	local r=$1 token=$2 name=$3 cur= old= mid= ok=1 sshkeys= f out
	case $token in
	*[!0-9a-f]*)
		log "identity: den.identity=$token is not 32 lowercase hex digits: ignored"
		return 0
		;;
	esac
	if [ ${#token} -ne 32 ]; then
		log "identity: den.identity=$token is not 32 lowercase hex digits: ignored"
		return 0
	fi
	case $name in *[!A-Za-z0-9.-]* | -* | .* | *- | *. | *..* | *.-* | *-.*)
		log "identity: invalid den.hostname=$name: hostname kept"
		name=
		;;
	esac
	if [ ${#name} -gt 64 ]; then
		log "identity: den.hostname longer than 64 characters: hostname kept"
		name=
	fi
	[ -f "$r/etc/den/identity" ] && read -r cur <"$r/etc/den/identity"
	[ "$cur" = "$token" ] && return 0
	[ -f "$r/etc/hostname" ] && read -r old <"$r/etc/hostname"

	if [ -n "$name" ]; then
		write_atomic "$r/etc/hostname" 644 "$name" || ok=
		# Rename the old name (and old.domain) in etc/hosts when the old
		# name is a plain host name.
		case $old in
		'' | "$name" | *[!A-Za-z0-9.-]*) ;;
		*)
			if [ -f "$r/etc/hosts" ]; then
				if awk -v old="$old" -v new="$name" '
					{
						line = $0; cmt = ""
						p = index(line, "#")
						if (p) { cmt = substr(line, p); $0 = substr(line, 1, p - 1) }
						c = 0
						for (i = 2; i <= NF; i++)
							if ($i == old || index($i, old ".") == 1) { $i = new substr($i, length(old) + 1); c = 1 }
						if (!c) { print line; next }
						out = $1
						for (i = 2; i <= NF; i++) out = out "\t" $i
						if (cmt != "") out = out "\t" cmt
						print out
					}' "$r/etc/hosts" >"$r/etc/hosts.den-tmp" &&
					chmod 644 "$r/etc/hosts.den-tmp" && mv -fT "$r/etc/hosts.den-tmp" "$r/etc/hosts"; then
					:
				else
					rm -f "$r/etc/hosts.den-tmp"
					log "identity: cannot rename $old in /etc/hosts"
				fi
			fi
			;;
		esac
	else
		name=$old
	fi

	# A new machine-id: 32 hex digits from the kernel's random UUID.
	mid=$(tr -d '-' </proc/sys/kernel/random/uuid)
	if [ ${#mid} -eq 32 ]; then
		write_atomic "$r/etc/machine-id" 444 "$mid" || ok=
		# Older D-Bus keeps a copy (Debian links it to /etc/machine-id).
		if [ -f "$r/var/lib/dbus/machine-id" ] && [ ! -L "$r/var/lib/dbus/machine-id" ]; then
			write_atomic "$r/var/lib/dbus/machine-id" 444 "$mid" || ok=
		fi
	else
		log "identity: no random uuid from the kernel"
		ok=
	fi

	# SSH host keys: den-agent creates its own when it is missing. An
	# OpenSSH server would not start without its keys: they are made anew
	# with ssh-keygen -A (run in the root; /dev is there by now).
	for f in "$r"/etc/ssh/ssh_host_*_key*; do
		[ -e "$f" ] && sshkeys=1
	done
	rm -f "$r"/etc/den/ssh_host_ed25519_key* "$r"/etc/ssh/ssh_host_*_key* || ok=
	if [ -n "$sshkeys" ] && [ -e "$r/usr/sbin/sshd" ] && [ -x "$r/usr/bin/ssh-keygen" ]; then
		if ! out=$(chroot "$r" /usr/bin/ssh-keygen -A 2>&1); then
			log "identity: ssh-keygen -A: $out"
			ok=
		fi
	fi
	# systemd's saved random seed would be the same in every fork.
	rm -f "$r/var/lib/systemd/random-seed" || ok=

	if [ -z "$ok" ]; then
		sync
		log "identity: new identity for ${name:-(unnamed)} incomplete: den.identity not recorded, the next boot tries again"
		return 0
	fi
	mkdir -p "$r/etc/den"
	sync
	write_atomic "$r/etc/den/identity" 644 "$token" || return 0
	sync
	log "new identity for ${name:-(unnamed)}"
}

# den-identity: end

root=/dev/vda
rootfstype=ext4
rootflags=
rwmode=rw
init=/sbin/init
rootwait=10
identity=
hostname=
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
	den.identity=*) identity=${arg#den.identity=} ;;
	den.hostname=*) hostname=${arg#den.hostname=} ;;
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

# A new identity when den.identity says this is another VM than the one
# the root last booted as (after /dev moved: ssh-keygen may run in the root).
if [ -n "$identity" ]; then
	if [ "$rwmode" = ro ]; then
		log "read-only root: den.identity not applied"
	else
		den_identity /newroot "$identity" "$hostname"
	fi
fi

log "switch_root to $init"
umount /sys
umount /proc
# If switch_root cannot exec the init it prints why and exits, and the
# kernel panics with "Attempted to kill init" (visible; with panic=-1 on the
# command line the VM then stops).
exec switch_root /newroot "$init" "$@"
