#!/usr/bin/env bash
# The one script to run on the H200 machine, from anywhere:  tools/gpu_check.sh [BENCHMARK_TABLE ...]
#
#   1. installs the wheels carried in .whl/ (pure-Python packages the machine lacks, e.g. lark) into /tmp/site;
#   2. installs MiniTriton in editable mode (no dependencies: the machine has torch, triton, cuda-bindings);
#   3. lists the GPUs, runs the GPU tests (pytest -m gpu -q -x), tee'd to $OUT/gpu_tests.log when $OUT is set;
#   4. runs the benchmark tables named as arguments (python -m benchmarks.run NAME ...; `all` for every one),
#      copying benchmarks/results/* to $OUT when it is set;
#   5. prints a short summary last: the test result line and each benchmark table.
# Exits non-zero when the tests or a benchmark failed (after printing the summary).
set -uo pipefail
cd "$(dirname "$0")/.."

if compgen -G ".whl/*.whl" > /dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl || exit 1
    export PYTHONPATH="/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
fi
python3 -m pip install -q --no-deps --no-build-isolation -e . || exit 1
nvidia-smi -L

test_log=$(mktemp)
python3 -m pytest -m gpu -q -x -p no:cacheprovider 2>&1 | tee "$test_log" ${OUT:+"$OUT/gpu_tests.log"}
tests_status=${PIPESTATUS[0]}
tests_line=$(tail -n 1 "$test_log")

bench_status=0
if [ "$#" -gt 0 ]; then
    python3 -m benchmarks.run "$@" 2>&1 | tee ${OUT:+"$OUT/benchmarks.log"}
    bench_status=${PIPESTATUS[0]}
    if [ -n "${OUT:-}" ] && [ -d benchmarks/results ]; then
        cp -r benchmarks/results "$OUT/benchmark_results"
    fi
fi

echo
echo "================================ summary ================================"
printf "%-12s %s\n" "gpu tests" "$([ "$tests_status" -eq 0 ] && echo passed || echo "FAILED (exit $tests_status)")"
[ -n "$tests_line" ] && printf "%-12s %s\n" "" "$tests_line"
if [ "$#" -gt 0 ]; then
    printf "%-12s %s\n" "benchmarks" "$([ "$bench_status" -eq 0 ] && echo "ran: $*" || echo "FAILED (exit $bench_status)")"
    python3 -m benchmarks.run --summary "$@" 2>/dev/null || true
fi
[ "$tests_status" -eq 0 ] && [ "$bench_status" -eq 0 ]
