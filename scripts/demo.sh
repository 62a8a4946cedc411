#!/usr/bin/env bash
# den's main job, end to end, on a temporary state dir: start a daemon with
# the embedded volume, create a VM, use it, wreck it and roll it back, fork
# it, let it sleep and wake it, use its network (a page from a server
# outside, an egress denial, its URL waking it), reach it through the SSH
# gateway, clean up. The daemon runs in a network namespace of its own,
# joined by a veth pair to a second one standing for the internet: the
# host's own network is left as it is.
# Prints what each step took. Run by `make demo` after deps, build, image.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "$(id -u)" -ne 0 ]; then
	echo "demo: den needs root (FUSE, VMs): run make demo as root" >&2
	exit 1
fi
IMAGE=${DEN_DEMO_IMAGE:-debian}
work=$(mktemp -d /tmp/den-demo-XXXXXX)
chmod 0711 "$work" # VMMs run as den-vm, which must pass through to their run dirs
export DEN_SOCKET=$work/den.sock
den=$PWD/bin/den
daemon_pid=
wan_pid=
key=$work/id_ed25519
ns_den=dendemo-den
ns_wan=dendemo-wan

cleanup() {
	status=$?
	set +e
	if [ -n "$daemon_pid" ] && kill -0 "$daemon_pid" 2>/dev/null; then
		for vm in $("$den" ls --json 2>/dev/null | sed -n 's/^    "name": "\(.*\)",$/\1/p'); do
			"$den" rm --force "$vm" >/dev/null 2>&1
		done
		kill -TERM "$daemon_pid"
		for _ in $(seq 1 100); do kill -0 "$daemon_pid" 2>/dev/null || break; sleep 0.1; done
	fi
	# den's tmpfs for guest RAM outlives the daemon (VMs outlive it too).
	umount -l "$work/state/ram" 2>/dev/null
	[ -n "$wan_pid" ] && kill "$wan_pid" 2>/dev/null
	ip netns del "$ns_den" 2>/dev/null
	ip netns del "$ns_wan" 2>/dev/null
	if [ $status -eq 0 ]; then
		rm -rf "$work"
	else
		echo "demo: failed; daemon log: $work/daemon.log" >&2
		tail -n 20 "$work/daemon.log" >&2
	fi
	exit $status
}
trap cleanup EXIT

# shellcheck source=scripts/steps.sh
. scripts/steps.sh

# The network: the daemon's namespace (its VMs' TAPs, NAT and nftables
# table, its listeners) and "the internet", a namespace with a web server
# on 10.99.0.2, joined by a veth pair.
make_net() {
	ip netns del "$ns_den" 2>/dev/null || true
	ip netns del "$ns_wan" 2>/dev/null || true
	ip netns add "$ns_den" && ip netns add "$ns_wan" &&
		ip link add vd netns "$ns_den" type veth peer name vw netns "$ns_wan" &&
		ip -n "$ns_den" addr add 10.99.0.1/24 dev vd && ip -n "$ns_den" link set vd up &&
		ip -n "$ns_den" link set lo up && ip -n "$ns_den" route add default via 10.99.0.2 &&
		ip -n "$ns_wan" addr add 10.99.0.2/24 dev vw && ip -n "$ns_wan" link set vw up &&
		ip -n "$ns_wan" link set lo up &&
		mkdir -p "$work/www" && echo "a page from a server outside the host's VMs" >"$work/www/index.html"
}
make_net
ip netns exec "$ns_wan" busybox httpd -f -p 10.99.0.2:80 -h "$work/www" &
wan_pid=$!
in_den() { ip netns exec "$ns_den" "$@"; }

ssh_port=$((20000 + RANDOM % 20000))
gateway="--ssh-listen 127.0.0.1:$ssh_port"
# start_daemon: den daemon in the background, waiting for its socket.
start_daemon() {
	"$den" daemon --state-dir "$work/state" --socket "$DEN_SOCKET" --images "$PWD/build/images" \
		--default-image "$IMAGE" $gateway --netns "$ns_den" --net tap --http-listen 127.0.0.1:8081 --e2b-listen 127.0.0.1:3000 \
		>"$work/daemon.log" 2>&1 &
	echo $! >"$work/daemon.pid"
	for _ in $(seq 1 300); do
		[ -S "$DEN_SOCKET" ] && return 0
		sleep 0.1
	done
	echo "daemon did not start"
	return 1
}
step "start the daemon (embedded JuiceFS volume)" start_daemon
daemon_pid=$(cat "$work/daemon.pid")
"$den" info | sed 's/^/   /'

step "create a VM (first: warms the image's base)" "$den" create box
step "run a command in it" "$den" exec box -- sh -c 'uname -sr; grep -s PRETTY_NAME /etc/os-release || true'
step "exit status passes through" bash -c "'$den' exec box -- sh -c 'exit 3' || echo \"exit status \$?\""
step "create a second VM (restores the warm base)" "$den" create box2
step "write a file and start a process" "$den" exec box -- sh -c 'echo precious > /root/work.txt; sleep 100000 >/dev/null 2>&1 & echo $! > /tmp/worker.pid'
step "checkpoint memory and disk" "$den" checkpoint box -m "work in progress"
step "wreck it" "$den" exec box -- sh -c 'rm -f /root/work.txt; kill $(cat /tmp/worker.pid); echo wrecked'
step "restore the checkpoint" "$den" restore box cp-1
step "file and process are back" "$den" exec box -- sh -c 'cat /root/work.txt; kill -0 $(cat /tmp/worker.pid) && echo "worker alive"'
step "fork it" "$den" fork box@cp-1 experiment
step "the fork has its own identity" "$den" exec experiment -- sh -c 'hostname; cat /root/work.txt'
step "lineage" "$den" checkpoints box
step "sleep (no VMM process, no RAM held)" "$den" sleep box
step "list VMs" "$den" ls
step "exec wakes it" "$den" exec box -- sh -c 'cat /root/work.txt; kill -0 $(cat /tmp/worker.pid) && echo "worker alive"'

step "its network: TAP, address, egress policy" "$den" net log box
step "fetch a page from outside, through its TAP" "$den" exec box -- curl -sS --max-time 10 http://10.99.0.2/
step "deny all egress, live" "$den" net policy box deny-all
step "the same fetch is refused" bash -c "'$den' exec box -- curl -sS --max-time 5 http://10.99.0.2/ || echo \"refused (exit \$?)\""
step "what the policy dropped" "$den" net log box
step "serve a page from the VM" "$den" exec box -- sh -c 'mkdir -p /tmp/www && echo "hello from $(hostname), through its URL" >/tmp/www/index.html && cd /tmp/www && setsid python3 -m http.server 8080 >/dev/null 2>&1 < /dev/null & for i in $(seq 1 150); do curl -s -o /dev/null localhost:8080 && exit 0; sleep 0.2; done; exit 1'
url=$("$den" url box)
step "its private URL" echo "$url"
step "a request without the token is refused" in_den curl -s -o /dev/null -w "%{http_code}\n" http://127.0.0.1:8081/vm/box/
step "sleep it" "$den" sleep box
step "a request to its URL wakes it (the token becomes a cookie)" in_den curl -sS -L -b '' --max-time 60 "$url"

ssh-keygen -q -t ed25519 -N '' -f "$key"
step "add an ssh key for the gateway" "$den" keys add "$key.pub"
sshgw() {
	in_den ssh -p "$ssh_port" -i "$key" -o BatchMode=yes -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null \
		-o LogLevel=ERROR "$@"
}
step "sleep it again" "$den" sleep box
step "ssh through the gateway wakes it (plain OpenSSH)" sshgw box@127.0.0.1 'echo hello from $(hostname); cat /root/work.txt'
step "den verbs over ssh" sshgw den@127.0.0.1 ls

# An E2B program, unchanged, with den's address and a den token.
if [ -f e2e/e2bsdk/node_modules/e2b/package.json ] && command -v node >/dev/null; then
	e2b_key=$("$den" tokens add demo-e2b 2>/dev/null)
	# A function, so that the step's echoed command shows no secret.
	e2b_program() {
		in_den env E2B_API_URL=http://127.0.0.1:3000 E2B_SANDBOX_URL=http://127.0.0.1:3000 \
			E2B_API_KEY="$e2b_key" node e2e/e2bsdk/demo.mjs
	}
	step "an E2B program (the official e2b SDK) against den" e2b_program
else
	echo "demo: no e2b SDK (make deps-node installs it): the E2B step is skipped"
fi

step "change a file and start a project" "$den" exec box -- sh -c 'echo "more work" >> /root/work.txt; mkdir -p /root/project && printf "print(\"hello\")\n" > /root/project/main.py'
step "what ran in box, who ran it, what it wrote and connected to (den activity)" "$den" activity box --last 12
step "what the demo changed in box since its checkpoint (den diff: the disks, read on the host)" "$den" diff box@cp-1 --path /root -p
step "remove the VMs" "$den" rm box box2 experiment

printf '\n\033[1m== what each step took (%s, %s)\033[0m\n' "$("$den" info --json | sed -n 's/.*"vmm": "\(.*\)",/\1/p')" "$("$den" info --json | sed -n 's/.*"accel": "\(.*\)",/\1/p')"
printf '   %s\n' "${timings[@]}"
