#!/usr/bin/env bash
# The GPU bundle's runner: `make gpu-bundle` copies it to .gpu/run.sh beside
# the binaries it runs. On the GPU machine (driver, Python 3 with a CUDA torch
# and pytest; no Go), from the directory that holds .gpu/:
#
#   bash .gpu/run.sh            every part below, then a summary
#   bash .gpu/run.sh tests      only the named parts (any of: tests bench
#                               replay python-bench extra)
#
# Parts:
#   tests         gpu.test (the device tests and the cache end to end),
#                 replay.test -test.run TestVerifyOnCUDA, the Python
#                 package's tests (python/tests) and CUDA tests
#                 (python/tests_cuda) against the CUDA library
#   bench         BenchmarkStaging: COUNT runs (default 6) of the ops the
#                 targets compare (plain-pinned, cache-staging,
#                 cache-pipelined and its MirrorDirect variants),
#                 COUNT_OTHER runs (default 2) of every other op
#   replay        omnicache replay --device cuda on its defaults, then the
#                 synthetic trace under --verify
#   python-bench  the Python step cost with host and CUDA tensors
#                 (python -m omnicache._bench --cuda)
#   extra         every other benchmark binary in .gpu/extra/ (ad hoc runs)
#
# Logs go to .gpu/logs/ (and, when $OUT is set, as on the device tool, into
# $OUT/gpu-logs.tgz). Exit status: 0 when every part run passed.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
logs=$here/logs
mkdir -p "$logs"
COUNT=${COUNT:-6}
COUNT_OTHER=${COUNT_OTHER:-2}
MAIN_OPS='plain-pinned|cache-staging|cache-pipelined|cache-pipelined-direct|cache-pipelined-direct-owned'
OTHER_OPS='plain-pinned-gap|device-pinned|cache|cache-owned|cache-staging-owned|cache-staging-owned-w4|cache-staging-memalloc'
OTHER_OPS+='|cache-pipelined-hostalloc|cache-pipelined-allcores|cache-direct|cache-pipelined-materialize'
OTHER_OPS+='|cache-pipelined-direct-materialize' 
PY=${PYTHON:-python3}
parts=("$@")
[ ${#parts[@]} -eq 0 ] && parts=(tests bench replay python-bench extra)
declare -a summary
fail=0

note() { summary+=("$(printf '%-44s %s' "$1" "$2")"); }

# step NAME LOG CMD...: runs CMD with its output in LOG (and on stdout).
step() {
	local name=$1 log=$logs/$2
	shift 2
	echo "== $name: $*"
	local t0=$SECONDS
	"$@" >"$log" 2>&1
	local rc=$?
	cat "$log"
	local secs=$((SECONDS - t0))
	if [ $rc -eq 0 ]; then
		note "$name" "ok   (${secs}s) $(summarize "$log")"
	else
		note "$name" "FAIL rc=$rc (${secs}s) $(summarize "$log")"
		fail=1
	fi
}

# summarize LOG: the counts a reader wants from a go test -v or pytest log.
summarize() {
	local log=$1
	if grep -Eq '(passed|failed|error|skipped).* in [0-9.]+s' "$log"; then
		grep -E '(passed|failed|error|skipped).* in [0-9.]+s' "$log" | tail -1 | sed 's/=//g; s/^ *//'
		return
	fi
	local pass fail skip
	pass=$(grep -c -- '^\s*--- PASS' "$log")
	fail=$(grep -c -- '^\s*--- FAIL' "$log")
	skip=$(grep -c -- '^\s*--- SKIP' "$log")
	echo "pass=$pass fail=$fail skip=$skip"
}

env_report() {
	echo "== machine"
	nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1
	echo "cores: $(nproc)  load: $(cut -d' ' -f1-3 /proc/loadavg)"
	$PY -c 'import sys, torch; print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.cuda.is_available())' 2>&1
}

# The Python package: the CUDA library as its library, and the _fast
# extension built here for this interpreter when a C compiler and its headers
# are there (else the package calls through ctypes).
py_setup() {
	local pkg=$here/python/omnicache
	mkdir -p "$pkg/_lib"
	cp "$here/libomnicache-cuda.so" "$pkg/_lib/libomnicache.so"
	cp "$here/omnicache.h" "$pkg/_lib/omnicache.h"
	local inc ext
	inc=$($PY -c 'import sysconfig; print(sysconfig.get_paths()["include"])')
	ext=$($PY -c 'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX"))')
	if [ ! -f "$pkg/_fast$ext" ] && [ -f "$inc/Python.h" ] && command -v cc >/dev/null; then
		cc -O2 -Wall -fPIC -shared -I"$inc" -o "$pkg/_fast$ext" "$pkg/_fast.c" || rm -f "$pkg/_fast$ext"
	fi
	if [ -f "$pkg/_fast$ext" ]; then echo "python: the _fast extension"; else echo "python: ctypes (no Python.h or cc for $PY)"; fi
}

run_tests() {
	step "gpu.test (device tests)" gpu-test.log "$here/gpu.test" -test.v -test.count 1
	step "replay.test TestVerifyOnCUDA" replay-verify.log "$here/replay.test" -test.run TestVerifyOnCUDA -test.v
	py_setup
	pushd "$here/python" >/dev/null
	step "python/tests (CUDA library)" pytest-host.log env PYTHONPATH=. OMNICACHE_CUDA_BUILD=1 $PY -m pytest -q -p no:cacheprovider tests
	step "python/tests_cuda" pytest-cuda.log env PYTHONPATH=. $PY -m pytest -q -p no:cacheprovider tests_cuda
	popd >/dev/null
}

run_bench() {
	step "BenchmarkStaging main ops x$COUNT" staging.txt "$here/gpu.test" -test.run '^$' \
		-test.bench "BenchmarkStaging/^op=($MAIN_OPS)\$" -test.count "$COUNT"
	step "BenchmarkStaging other ops x$COUNT_OTHER" staging-other.txt "$here/gpu.test" -test.run '^$' \
		-test.bench "BenchmarkStaging/^op=($OTHER_OPS)\$" -test.count "$COUNT_OTHER"
	echo "== BenchmarkStaging medians (GB/s) and the share of plain-pinned"
	cat "$logs/staging.txt" "$logs/staging-other.txt" >"$logs/staging-all.txt"
	staging_table "$logs/staging-all.txt" | tee "$logs/staging-table.txt"
	while read -r line; do note "  $line" ""; done <"$logs/staging-table.txt"
}

# staging_table FILE: per op, the median MB/s as GB/s with the range over
# the runs, and the median's share of op=plain-pinned's (POSIX awk and sort:
# the device has mawk).
staging_table() {
	local f=$1 ops op base med
	ops=$(grep -o '^BenchmarkStaging/op=[^/]*' "$f" | sed 's/.*op=//' | sort -u)
	base=$(staging_median "$f" plain-pinned | cut -d' ' -f1)
	for op in $ops; do
		read -r med lo hi <<<"$(staging_median "$f" "$op")"
		awk -v op="$op" -v m="$med" -v lo="$lo" -v hi="$hi" -v b="$base" 'BEGIN {
			printf "%-28s %6.1f GB/s (%.1f-%.1f) %5.1f%% of plain-pinned\n", op, m/1000, lo/1000, hi/1000, b ? 100*m/b : 0 }'
	done
}

# staging_median FILE OP: "median min max" of OP's MB/s.
staging_median() {
	awk -v op="$2" '$1 ~ "^BenchmarkStaging/op=" op "/" { for (i=2; i<NF; i++) if ($(i+1)=="MB/s") print $i }' "$1" |
		sort -g | awk '{ v[NR]=$1 } END { if (NR==0) { print "0 0 0"; exit }
			m = (NR%2) ? v[(NR+1)/2] : (v[NR/2]+v[NR/2+1])/2; print m, v[1], v[NR] }'
}

run_replay() {
	step "replay --device cuda (defaults)" replay.txt "$here/omnicache" replay --device cuda --check
	step "replay --device cuda --mirror-direct" replay-direct.txt "$here/omnicache" replay --device cuda --mirror-direct \
		--workloads "${DIRECT_WORKLOADS:-P1024_h50_c64|P4096_h0_c1|P16384_h0_c64|long_doc_qa}"
	step "replay --device cuda --trace --verify" replay-verify.txt "$here/omnicache" replay --device cuda \
		--trace "$here/synthetic_trace.jsonl" --verify --repeat 1
	step "replay --device cuda --trace --verify --mirror-direct" replay-verify-direct.txt "$here/omnicache" replay \
		--device cuda --trace "$here/synthetic_trace.jsonl" --verify --repeat 1 --mirror-direct
}

run_python_bench() {
	py_setup
	pushd "$here/python" >/dev/null
	step "python step cost (host and CUDA)" python-bench.txt env PYTHONPATH=. $PY -m omnicache._bench --cuda
	popd >/dev/null
}

run_extra() {
	local f
	for f in "$here"/extra/*.test; do
		[ -e "$f" ] || continue
		step "extra $(basename "$f")" "extra-$(basename "$f").txt" "$f" -test.run '^$' -test.bench . -test.count "${EXTRA_COUNT:-1}"
	done
}

env_report | tee "$logs/machine.txt"
for p in "${parts[@]}"; do
	case $p in
	tests) run_tests ;;
	bench) run_bench ;;
	replay) run_replay ;;
	python-bench) run_python_bench ;;
	extra) run_extra ;;
	*) echo "run.sh: unknown part $p (tests bench replay python-bench extra)" >&2; exit 2 ;;
	esac
done
echo
echo "== summary"
grep -v '^==' "$logs/machine.txt" || true
printf '%s\n' "${summary[@]}" | tee "$logs/summary.txt"
if [ -n "${OUT:-}" ]; then tar czf "$OUT/gpu-logs.tgz" -C "$here" logs; fi
exit $fail
