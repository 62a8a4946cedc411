# step TITLE CMD...: run a step of a demo, show its output indented and
# its time, and keep the time in timings (sourced by scripts/demo.sh and
# scripts/cluster-lib.sh).
step() {
	local title=$1
	shift
	printf '\n\033[1m== %s\033[0m\n   $ %s\n' "$title" "$*"
	local start end
	start=$(date +%s%N)
	"$@" 2>&1 | sed 's/^/   /'
	end=$(date +%s%N)
	printf '   (%d ms)\n' $(((end - start) / 1000000))
	timings+=("$(printf '%-56s %6d ms' "$title" $(((end - start) / 1000000)))")
}
timings=()
