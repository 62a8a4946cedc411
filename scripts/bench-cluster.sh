#!/usr/bin/env bash
# make bench, its cluster part: den's figures across hosts on this
# machine, with a real PostgreSQL and MinIO and the hosts on loopback
# (scripts/cluster-lib.sh), medians over BENCH_CLUSTER_RUNS runs (5):
#   - den move of a 512 MiB and a 2 GiB guest (a quarter of their memory written)
#     between two hosts: the sleep (with its digests), the wake on the
#     other host, the whole;
#   - a wake on the host that put the VM to sleep beside a wake on the
#     other host, in turn, each once the sleep's digests are written;
#   - a wake storm: BENCH_CLUSTER_STORM (50) sleeping VMs (forks of one
#     checkpoint) woken at once by an exec each, through three hosts in
#     turn: the whole, each wake's median and slowest, failures, and
#     where the VMs ran;
#   - takeover: from kill -9 of a host (daemon, fence guard, VMMs) to its
#     VM made with --on-host-loss restart running on a live host, with
#     the lease at 6 s;
#   - scale: den bench --scale on a host of the cluster: 1,000 sleeping
#     VMs recorded in PostgreSQL, their files on the shared volume.
# BENCH_CLUSTER_PARTS names the parts to run (default: all of them).
# Prints a Markdown table (docs/benchmarks.md keeps the latest).
set -euo pipefail
cd "$(dirname "$0")/.."

name=bench-cluster
hosts=(host-a host-b)
# shellcheck source=scripts/cluster-lib.sh
. scripts/cluster-lib.sh
runs=${BENCH_CLUSTER_RUNS:-5}
storm=${BENCH_CLUSTER_STORM:-50}
parts=${BENCH_CLUSTER_PARTS:-move wake storm takeover scale}

# part NAME: whether BENCH_CLUSTER_PARTS names this part.
part() { [[ " $parts " == *" $1 "* ]]; }

# since T0: milliseconds since T0 (date +%s%N).
since() { echo $((($(date +%s%N) - $1) / 1000000)); }

# median: of the numbers on stdin, one a line.
median() { sort -n | awk '{v[NR] = $1} END {if (NR % 2) print v[(NR + 1) / 2]; else print int((v[NR / 2] + v[NR / 2 + 1]) / 2)}'; }

# unheld VM: until no host holds VM's lease (the digests of its sleep are
# written: any host may wake it).
unheld() {
	local holder
	for _ in $(seq 1 1200); do
		holder=$(PGPASSWORD=$pg_pw "$pgbin/psql" -tA -h 127.0.0.1 -p "$pg_port" -U postgres -d den \
			-c "SELECT host FROM leases WHERE vm = '$1'")
		[ -z "$holder" ] && return 0
		sleep 0.1
	done
	echo "$name: host $holder never let $1 go" >&2
	return 1
}

# field JSON NAME: a number field of den's --json output.
field() { sed -n "s/^  \"$2\": \([0-9]*\),\{0,1\}$/\1/p" <<<"$1"; }

# where VM: the host it runs on.
where() { on host-a info "$1" --json | sed -n 's/^  "host": "\(.*\)",\{0,1\}$/\1/p'; }

# fill HOST VM MIB: write MIB MiB of non-zero data into the guest's memory.
fill() { on "$1" exec "$2" -- sh -c "yes den | head -c $(($3 << 20)) > /dev/shm/fill"; }

say() { printf '\033[1m== %s\033[0m\n' "$*" >&2; }

say "setup: PostgreSQL, MinIO, ${hosts[*]}"
start_postgres >/dev/null
start_minio >/dev/null
configure >/dev/null
for h in "${hosts[@]}"; do start_host "$h"; done

rows=()
row() { rows+=("$(printf '| %s | %s | %s |' "$@")"); }

# den move, both ways in turn.
if part move; then
	for size in 512M 2G; do
		vm=move-${size,,}
		part=$([ "$size" = 512M ] && echo 128 || echo 512)
		say "den move of a $size guest ($part MiB written), $runs runs"
		on host-a create "$vm" --memory "$size" --idle-timeout 0 >/dev/null
		fill host-a "$vm" "$part"
		sleeps=() wakes=() totals=()
		to=host-b
		for i in $(seq 1 "$runs"); do
			out=$(on host-a move "$vm" --to "$to" --json)
			sleeps+=("$(field "$out" sleep_ms)") wakes+=("$(field "$out" wake_ms)") totals+=("$(field "$out" total_ms)")
			echo "   run $i: to $to: sleep ${sleeps[-1]} ms, wake ${wakes[-1]} ms, total ${totals[-1]} ms" >&2
			to=$([ "$to" = host-b ] && echo host-a || echo host-b)
		done
		row "den move, $size guest ($part MiB written): sleep incl. digests" "$(printf '%s\n' "${sleeps[@]}" | median) ms" "$runs"
		row "den move, $size guest ($part MiB written): wake on the other host" "$(printf '%s\n' "${wakes[@]}" | median) ms" "$runs"
		row "den move, $size guest ($part MiB written): whole" "$(printf '%s\n' "${totals[@]}" | median) ms" "$runs"
		on host-a rm --force "$vm" >/dev/null
	done
fi

# Wakes on the same host and on the other one, in turn.
if part wake; then
	say "wake on the host that slept it, and on the other, in turn, $runs runs"
	on host-a create wk --memory 512M --idle-timeout 0 >/dev/null
	fill host-a wk 128
	same=() cross=()
	for i in $(seq 1 "$runs"); do
		here=$(where wk)
		there=$([ "$here" = host-a ] && echo host-b || echo host-a)
		on "$here" sleep wk >/dev/null
		unheld wk
		t0=$(date +%s%N)
		on "$here" wake wk >/dev/null
		same+=("$(since "$t0")")
		on "$here" sleep wk >/dev/null
		unheld wk
		t0=$(date +%s%N)
		on "$there" wake wk >/dev/null
		cross+=("$(since "$t0")")
		got=$(where wk)
		if [ "$got" != "$there" ]; then
			echo "$name: a wake through $there ran wk on $got" >&2
			exit 1
		fi
		echo "   run $i: on $here ${same[-1]} ms, on $there ${cross[-1]} ms" >&2
	done
	s=$(printf '%s\n' "${same[@]}" | median)
	c=$(printf '%s\n' "${cross[@]}" | median)
	row "wake, 512 MiB guest (128 MiB written), on the host that slept it" "$s ms" "$runs"
	row "wake, same guest, on another host" "$c ms ($(awk "BEGIN {printf \"%.2f\", $c / $s}")x)" "$runs"
	on host-a rm --force wk >/dev/null
fi

# A wake storm through three hosts.
if part storm; then
	say "a storm of $storm wakes through three hosts: making $storm sleeping VMs"
	hosts+=(host-c)
	configure_host host-c
	start_host host-c
	on host-a create st-0 --memory 128M --idle-timeout 0 >/dev/null
	cp=$(on host-a checkpoint st-0 | tail -n 1)
	for i in $(seq 1 $((storm - 1))); do
		on host-a fork "st-0@$cp" "st-$i" >/dev/null
		on host-a sleep "st-$i" >/dev/null
		printf '\r   %d/%d' "$i" "$((storm - 1))" >&2
	done
	echo >&2
	on host-a sleep st-0 >/dev/null
	for i in $(seq 0 $((storm - 1))); do unheld "st-$i"; done
	say "a storm of $storm wakes through three hosts: waking"
	ring=(host-a host-b host-c)
	t0=$(date +%s%N)
	wakers=()
	for i in $(seq 0 $((storm - 1))); do
		(
			s=$(date +%s%N)
			if err=$(on "${ring[i % 3]}" exec "st-$i" -- true 2>&1); then
				echo "ok $(since "$s")"
			else
				echo "failed $(since "$s") $err"
			fi
		) >"$work/storm-$i" &
		wakers+=($!)
	done
	wait "${wakers[@]}" # (not the hosts' daemons)
	whole=$(since "$t0")
	ok=$(cat "$work"/storm-* | awk '$1 == "ok" {print $2}')
	failed=$(cat "$work"/storm-* | grep -c '^failed' || true)
	cat "$work"/storm-* | grep '^failed' | head -3 >&2 || true
	placed=$(for i in $(seq 0 $((storm - 1))); do where "st-$i"; done | sort | uniq -c | awk '{printf "%s%s %d", sep, $2, $1; sep = ", "}')
	echo "   $storm wakes in $whole ms; $failed failed; running on: $placed" >&2
	row "wake storm: $storm sleeping 128 MiB VMs woken at once through 3 hosts: all" "$whole ms ($failed failed; on $placed)" 1
	row "wake storm: one wake, median" "$(median <<<"$ok") ms" 1
	row "wake storm: one wake, slowest" "$(sort -n <<<"$ok" | tail -n 1) ms" 1
	for i in $(seq 0 $((storm - 1))); do on host-a rm --force "st-$i" >/dev/null; done
fi

# Takeover: a fresh host each run, killed with its VM running.
if part takeover; then
	say "takeover after kill -9 of a host (lease 6 s), $runs runs"
	takes=()
	for i in $(seq 1 "$runs"); do
		h=victim-$i
		hosts+=("$h")
		configure_host "$h"
		start_host "$h"
		on "$h" create "svc-$i" --memory 256M --idle-timeout 0 --on-host-loss restart >/dev/null
		kill_host "$h" >/dev/null
		t0=$(date +%s%N)
		ok=
		for _ in $(seq 1 1200); do
			# (Running on a live host: until the takeover, the record still
			# says running on the killed host.)
			at=$(where "svc-$i" 2>/dev/null || true)
			if [ -n "$at" ] && [ "$at" != "$h" ]; then
				ok=1
				break
			fi
			sleep 0.1
		done
		[ -n "$ok" ] || { echo "$name: svc-$i never ran again after $h was killed" >&2; exit 1; }
		takes+=("$(since "$t0")")
		echo "   run $i: svc-$i running on $(where "svc-$i") $((takes[-1])) ms after $h was killed" >&2
		on host-a rm --force "svc-$i" >/dev/null
	done
	row "takeover: kill -9 of a host to its VM booted elsewhere (lease 6 s)" "$(printf '%s\n' "${takes[@]}" | median) ms" "$runs"
fi

# A host of the cluster with many sleeping VMs: den bench --scale on a
# host of its own (host-s), its records in PostgreSQL, its files on the
# shared volume.
scale_table=
if part scale; then
	say "1,000 sleeping VMs on a host of the cluster (den bench --scale), $runs runs"
	configure_host host-s
	scale_table=$("$den" bench --scale --cluster "$work/host-s.json" --runs "$runs" --images "$PWD/build/images" \
		--image "$IMAGE" --out "$work/scale")
fi

accel=$(on host-a info --json | sed -n 's/.*"accel": "\(.*\)",/\1/p')
printf '\nden cluster figures: %s, %s, %d cores, hosts on loopback, PostgreSQL %s, MinIO\n\n' \
	"$(uname -m)" "$accel" "$(nproc)" "$("$pgbin/postgres" --version | awk '{print $3}')"
echo '| figure | median | runs |'
echo '|---|---|---|'
printf '%s\n' "${rows[@]}"
if [ -n "$scale_table" ]; then
	printf '\nden bench --scale on a host of the cluster (host-s), its VMs recorded in PostgreSQL:\n\n%s\n' "$scale_table"
fi
