#!/usr/bin/env bash
# Everything the H200 has to say about the work since the last GPU run, in ONE device call, most important first
# (device time is scarce: 30 minutes per session counting earlier tries). Run from the repository root:
#
#     bash tools/gpu_session.sh [STEP ...]        # default: every step below, in order
#
# Steps (each time-boxed, each logged to $OUT/<step>.log, a summary table last):
#   tests      pytest -m gpu on the files that changed since the last GPU run (GPU_TESTS overrides)
#   kda        tools/kda_decode_ab.py     KDA replay decode variants vs fla T=1 pool (issue 6)
#   kdabench   benchmarks/bench_kda_decode.py  the issue's full KDA table (k = 0, 1, 3, 7; KDA_BENCH_ARGS)
#   flashbench benchmarks/bench_flash_kda.py   the issue's five-shape FlashKDA table (FLASH_BENCH_ARGS; carry a
#              .mtcache from `python tools/prebuild_cache.py 1x32768x96 1x32768x16 8x4096x32 1x8192x12 1x131072x4`)
#   warp       tools/warp_decode_ab.py    WarpDecode variants vs triton_kernels (issue 7)
#   gemm       tools/gemm_ab.py           GEMM variants (cp.async ring, TMA ring, warp specialized) vs cuBLAS (issue 4)
#   flash      tools/flash_kda_variants.py  FlashKDA phase-1 variants per kernel vs fla (issue 5)
#   sanitize   tools/sanitize.sh          compute-sanitizer memcheck / racecheck on every kernel family
#   ncu        tools/ncu_profile.sh       Nsight Compute: speed of light, occupancy, stall reasons per K3 / GEMM kernel
#   lines      tools/ncu_lines.sh         Nsight Compute's per-instruction stall samples (CSV, for tools/ncu_lines.py)
#              of NCU_LINES="CASE:KERNEL_REGEX:LAUNCH_SKIP ..." (default flash_t8192:kda_intra:0)
# LIMIT_<step>=SECONDS overrides a step's time box, e.g. LIMIT_warp=200. KDA_ARGS / KDA_BENCH_ARGS / WARP_ARGS /
# GEMM_ARGS / FLASH_ARGS replace a tool's arguments, NCU_CASES the profiled cases; GPU_TESTS the test files (none: only
# the FlashKDA tests), FLASH_TESTS_K the FlashKDA tests' -k filter (none: skip them), GPU_MARK the tests' -m
# expression (default "gpu and not probe": the opt-in variants measured slower are left out; "gpu": all).
# A missing tool is reported and skipped. Exits non-zero when any step failed.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/gpu_session}
mkdir -p "$OUT"

if compgen -G ".whl/*.whl" > /dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site .whl/*.whl || exit 1
    export PYTHONPATH="/tmp/site:$PWD/.whl${PYTHONPATH:+:$PYTHONPATH}"
fi
[ -d .whl/triton_kernels ] && export TRITON_KERNELS_PATH="$PWD/.whl"
python3 -m pip install -q --no-deps --no-build-isolation -e . || exit 1
if [ -d .mtcache ]; then  # kernels compiled on the CPU machine (tools/prebuild_cache.py; carry ".mtcache")
    export MINITRITON_CACHE_DIR=${MINITRITON_CACHE_DIR:-/tmp/mtcache}
    mkdir -p "$MINITRITON_CACHE_DIR" && cp -r .mtcache/. "$MINITRITON_CACHE_DIR"/
    echo "prebuilt kernel cache: $(find .mtcache -name kernel.cubin | wc -l) cubins copied into $MINITRITON_CACHE_DIR"
fi
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader

# The peers' Triton kernels (fla's, triton_kernels') compile and autotune on first use (on a fresh machine
# bench_flash_kda takes ~100 s a shape, probably mostly that; not measured apart). fla keeps its autotune choices in Triton's cache (FLA_CACHE_RESULTS, on by default), so the cache of
# an earlier call, carried as .triton_cache.tgz (git-ignored; the last call left it in $OUT as triton_cache.tgz),
# skips both. It is used only on the GPU model it was made on (its DEVICE file), so the peer keeps its own choices.
export TRITON_CACHE_DIR=${TRITON_CACHE_DIR:-/tmp/triton_cache}
gpu_name=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -n 1)
mkdir -p "$TRITON_CACHE_DIR"
if [ -f .triton_cache.tgz ]; then
    mkdir -p /tmp/triton_cache_in && tar xzf .triton_cache.tgz -C /tmp/triton_cache_in
    if [ "$(cat /tmp/triton_cache_in/DEVICE 2>/dev/null)" = "$gpu_name" ]; then
        cp -r /tmp/triton_cache_in/. "$TRITON_CACHE_DIR"/ && echo "triton cache: carried ($gpu_name)"
    else
        echo "triton cache: carried one is from '$(cat /tmp/triton_cache_in/DEVICE 2>/dev/null)', not '$gpu_name': not used"
    fi
fi
save_triton_cache() {  # into $OUT for the next call, if it fits what comes back (16 MiB a file)
    echo "$gpu_name" > "$TRITON_CACHE_DIR/DEVICE"
    tar czf "$OUT/triton_cache.tgz" -C "$TRITON_CACHE_DIR" . 2>/dev/null || return 0
    local size
    size=$(stat -c %s "$OUT/triton_cache.tgz")
    if [ "$size" -gt $((16 * 1024 * 1024)) ]; then
        rm -f "$OUT/triton_cache.tgz"
        echo "triton cache: $size bytes, over the 16 MiB a returned file may have: not saved"
    else
        echo "triton cache: $size bytes saved as \$OUT/triton_cache.tgz (carry it as .triton_cache.tgz)"
    fi
}

declare -A LIMIT=([tests]=480 [kda]=240 [kdabench]=240 [flashbench]=420 [warp]=300 [gemm]=240 [flash]=420 [sanitize]=420 [ncu]=300 [lines]=400)
for name in "${!LIMIT[@]}"; do  # LIMIT_<step>=seconds overrides a time box (to fit steps into one device call)
    override="LIMIT_$name"
    [ -n "${!override:-}" ] && LIMIT[$name]=${!override}
done
summary=()
status=0
step() {  # name, command...
    local name=$1
    shift
    local t0=$SECONDS
    timeout "${LIMIT[$name]}" "$@" > "$OUT/$name.log" 2>&1
    local rc=$?
    [ $rc -eq 0 ] || status=1
    summary+=("$(printf "%-9s exit %-3s %4ss  %s" "$name" "$rc" "$((SECONDS - t0))" "$(tail -n 1 "$OUT/$name.log")")")
    echo "${summary[-1]}"
}
tool() {  # name, script, args...
    local name=$1 script=$2
    shift 2
    if [ -f "$script" ]; then step "$name" python3 "$script" "$@"; else summary+=("$(printf "%-9s skipped: %s is missing" "$name" "$script")"); fi
}
gpu_tests() {
    # the warp-specialized GEMM last: a protocol bug there hangs (each config runs in a process of its own)
    local files=${GPU_TESTS:-"tests/test_runtime.py tests/test_kda_decode.py tests/test_warp_decode.py tests/test_examples_gpu.py tests/test_barrier.py tests/test_early_return.py tests/test_ptx.py tests/test_pipeline.py tests/test_warp_specialize.py"}
    local rc=0
    [ "$files" = none ] && files=""  # GPU_TESTS=none: only the FlashKDA tests (FLASH_TESTS_K)
    for f in $files; do
        python3 -m pytest -m "${GPU_MARK:-gpu and not probe}" -q -p no:cacheprovider "$f" 2>&1 | tail -n 3 | sed "s|^|$(basename "$f" .py): |"
        [ "${PIPESTATUS[0]}" -eq 0 ] || [ "${PIPESTATUS[0]}" -eq 5 ] || rc=1
    done
    [ "${FLASH_TESTS_K:-}" = none ] && return $rc
    python3 -m pytest -m "${GPU_MARK:-gpu and not probe}" -q -p no:cacheprovider tests/test_flash_kda.py -k "${FLASH_TESTS_K:-1000 or sub16 or sliced}" 2>&1 | tail -n 3
    [ "${PIPESTATUS[0]}" -eq 0 ] || rc=1
    return $rc
}
export -f gpu_tests

steps=${*:-tests kda warp gemm flash sanitize}
for s in $steps; do
    case $s in
        tests) step tests bash -c gpu_tests ;;
        kda) tool kda tools/kda_decode_ab.py ${KDA_ARGS:-} ;;
        kdabench) tool kdabench benchmarks/bench_kda_decode.py --no-save ${KDA_BENCH_ARGS:-} ;;
        flashbench) tool flashbench benchmarks/bench_flash_kda.py --no-save ${FLASH_BENCH_ARGS:-} ;;
        warp) tool warp tools/warp_decode_ab.py ${WARP_ARGS:-} ;;
        gemm) tool gemm tools/gemm_ab.py ${GEMM_ARGS:-} ;;
        flash) tool flash tools/flash_kda_variants.py ${FLASH_ARGS:-1x32768x16 1x8192x12} ;;
        ncu) step ncu bash tools/ncu_profile.sh ${NCU_CASES:-} ;;
        lines) step lines bash -c 'for c in ${NCU_LINES:-flash_t8192:kda_intra:0}; do IFS=: read -r case k skip <<< "$c"; bash tools/ncu_lines.sh "$case" "$k" "${skip:-0}" || exit 1; done' ;;
        sanitize) step sanitize bash tools/sanitize.sh ;;
        *) echo "unknown step $s"; status=1 ;;
    esac
done

save_triton_cache
echo
echo "================================ summary ================================"
printf "%s\n" "${summary[@]}"
for s in $steps; do
    [ -f "$OUT/$s.log" ] && { echo "--- $s (last 25 lines)"; tail -n 25 "$OUT/$s.log"; }
done
exit $status
