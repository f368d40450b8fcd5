#!/usr/bin/env bash
# Runs every case of tests/test_tma_gpu.py in its own process (a fault poisons the CUDA context of the process it
# happens in, so one shared pytest run reports every later case as failed too), 8 at a time. Prints one line per
# case (PASS / FAIL(exit code)), logs under ${OUT:-/tmp}/tma_cases/.
set -uo pipefail
cd "$(dirname "$0")/.."
logs="${OUT:-/tmp}/tma_cases"
mkdir -p "$logs"
python3 -m pytest --collect-only -q -p no:cacheprovider tests/test_tma_gpu.py | grep '::' > "$logs/cases.txt"
run_case() {
    name=$(echo "$1" | tr -c 'A-Za-z0-9_.-' '_' | cut -c1-120)
    timeout 180 python3 -m pytest -q -x -p no:cacheprovider "$1" > "$2/$name.log" 2>&1
    rc=$?
    [ $rc -eq 0 ] && echo "PASS $1" || echo "FAIL($rc) $1"
}
export -f run_case
xargs -P 8 -I{} bash -c 'run_case "$@"' _ {} "$logs" < "$logs/cases.txt" | sort
