#!/usr/bin/env bash
# A den cluster on this machine, end to end: a real PostgreSQL (den's
# registry and the volume's metadata) and a real MinIO (the volume's
# data), three hosts (den daemons with state dirs of their own) sharing
# them, their peer listeners on loopback over mutual TLS. A VM made on one
# host is used through another, moved to a third, and when its host is
# killed (kill -9 of its daemon, fence guard and VMMs, as a power cut)
# the other hosts take its VMs over: one boots at once (--on-host-loss
# restart), the other is lost and waits for a person (den wake boots it
# from its disk).
# Prints what each step took. Run by `make demo-cluster` after deps,
# build, image. DEN_DEMO_KEEP=1 keeps its directory (logs) on success.
set -euo pipefail
cd "$(dirname "$0")/.."

name=demo-cluster
hosts=(host-a host-b host-c)
# shellcheck source=scripts/cluster-lib.sh
. scripts/cluster-lib.sh

step "start PostgreSQL" start_postgres
step "start MinIO" start_minio
step "the cluster's CA and configs" configure
for h in "${hosts[@]}"; do
	step "start $h (den daemon --cluster $h.json)" start_host "$h"
done
step "the hosts, seen from host-c" on host-c hosts

step "create box on host-a" on host-a create box --memory 256M --idle-timeout 0
step "write a file, start a process" on host-a exec box -- sh -c 'echo made on host-a > /root/note; sync; sleep 100000 </dev/null >/dev/null 2>&1 &'
step "use it through host-c (forwarded over mutual TLS)" on host-c exec box -- cat /root/note
step "where it runs, seen from host-c" sh -c "DEN_SOCKET=$work/host-c/den.sock $den info box | head -n 2"
step "move it to host-b (sleep on host-a, wake on host-b)" on host-c move box --to host-b
step "its file and process came along" on host-a exec box -- sh -c 'cat /root/note; grep -q "10000[0]" /proc/[0-9]*/cmdline 2>/dev/null && echo "the process runs on"'
step "create svc on host-b, restarted elsewhere if host-b is lost" on host-b create svc --memory 256M --idle-timeout 0 --on-host-loss restart
step "host-b dies" kill_host host-b
step "another host takes box over: lost with host-b" wait_for host-a box lost
step "and boots svc at once" wait_for host-c svc running
step "box waits for a person: den wake boots it from its disk" on host-c wake box
step "its file is there" on host-c exec box -- cat /root/note
step "the hosts now" on host-a hosts

printf '\n\033[1m== what each step took (%s)\033[0m\n' "$(on host-a info --json | sed -n 's/.*"accel": "\(.*\)",/\1/p')"
printf '   %s\n' "${timings[@]}"
