#!/usr/bin/env bash
# compute-sanitizer over small cases of every kernel family (run on the H200 after tools/gpu_check.sh installed the
# package): memcheck on the GEMM configs, KDA decode, WarpDecode and FlashKDA; racecheck on the GEMM and FlashKDA
# (the kernels that share shared memory between warps). One line per run: the case and the sanitizer's summary.
# Host API errors are not reported: cuda-bindings probes cuGetProcAddress for symbols this driver lacks at start-up
# (34 CUDA_ERROR_INVALID_VALUE per process on the H200, none from our calls).
# SANITIZE_ONLY=REGEX runs only the cases whose "tool:name" matches it, e.g. SANITIZE_ONLY="memcheck:(kda|warp)".
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="/tmp/site:$PWD/.whl:$PWD${PYTHONPATH:+:$PYTHONPATH}"
status=0
run() {  # tool, name, command...
    local tool=$1 name=$2
    shift 2
    [[ -n "${SANITIZE_ONLY:-}" && ! "$tool:$name" =~ ${SANITIZE_ONLY} ]] && return 0
    local log="${OUT:-/tmp}/sanitize_${tool}_${name}.log"
    timeout 300 compute-sanitizer --tool "$tool" --report-api-errors no --error-exitcode 99 "$@" > "$log" 2>&1
    local rc=$?
    printf "%-10s %-12s exit %-3s %s\n" "$tool" "$name" "$rc" "$(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$log" | tail -1)"
    [ $rc -eq 0 ] || { status=1; grep -E "^=+ (Invalid|Error|Race|.*hazard)" "$log" | head -5; tail -3 "$log"; }
}
pytest_case() { echo python3 -m pytest -q -x -p no:cacheprovider -m gpu "$@"; }
run memcheck gemm python3 tools/gemm_case.py
run racecheck gemm python3 tools/gemm_case.py
run memcheck gemm_m192 python3 tools/gemm_case.py 192 264 136
run racecheck gemm_m192 python3 tools/gemm_case.py 192 264 136
run memcheck kda_decode $(pytest_case tests/test_kda_decode.py -k cuda_graph)
run memcheck warp_decode $(pytest_case tests/test_warp_decode.py -k cuda_graph)
run memcheck flash_kda $(pytest_case "tests/test_flash_kda.py::test_gpu_matches_reference[False-4-1000]")
run racecheck flash_kda $(pytest_case "tests/test_flash_kda.py::test_gpu_matches_reference[False-4-1000]")
exit $status
