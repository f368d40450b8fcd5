#!/usr/bin/env bash
# The one script to run on the H200 machine, from anywhere:  tools/gpu_check.sh [BENCHMARK_TABLE ...]
#
#   1. installs the wheels carried in .whl/ (pure-Python packages the machine lacks, e.g. lark) into /tmp/site;
#   2. installs MiniTriton in editable mode (no dependencies: the machine has torch, triton, cuda-bindings);
#   3. runs the GPU tests (pytest -m gpu), each test file in its own process: a kernel fault loses the CUDA context
#      of the process it happens in, and would fail every later test of a shared run. GPU_TESTS="a.py b.py"
#      limits the files; logs go to $OUT/gpu_tests/ when $OUT is set;
#   4. runs the benchmark tables named as arguments (python -m benchmarks.run NAME ...; `all` for every one),
#      copying benchmarks/results/* to $OUT when it is set;
#   5. prints a short summary last: one line per test file and each benchmark table.
# Exits non-zero when a test file or a benchmark failed (after printing the summary).
set -uo pipefail
cd "$(dirname "$0")/.."

if compgen -G ".whl/*.whl" > /dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site .whl/*.whl || exit 1
    export PYTHONPATH="/tmp/site:$PWD/.whl${PYTHONPATH:+:$PYTHONPATH}"
fi
python3 -m pip install -q --no-deps --no-build-isolation -e . || exit 1
nvidia-smi -L

logs="${OUT:-/tmp}/gpu_tests"
mkdir -p "$logs"
files=${GPU_TESTS:-$(grep -l "mark.gpu" tests/test_*.py | sort)}
summary=()
tests_status=0
for f in $files; do
    name=$(basename "$f" .py)
    python3 -m pytest -m gpu -q -p no:cacheprovider "$f" > "$logs/$name.log" 2>&1
    rc=$?
    last=$(tail -n 1 "$logs/$name.log")
    [ $rc -eq 0 ] || [ $rc -eq 5 ] || tests_status=1   # 5: nothing collected (no GPU test in the file)
    summary+=("$(printf "%-28s %s" "$name" "$last")")
    echo "${summary[-1]}"
    [ $rc -eq 0 ] || [ $rc -eq 5 ] || grep -E "^(FAILED|ERROR)" "$logs/$name.log" | head -20
done

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
printf "%s\n" "${summary[@]}"
if [ "$#" -gt 0 ]; then
    printf "%-28s %s\n" "benchmarks" "$([ "$bench_status" -eq 0 ] && echo "ran: $*" || echo "FAILED (exit $bench_status)")"
    python3 -m benchmarks.run --summary "$@" 2>/dev/null || true
fi
[ "$tests_status" -eq 0 ] && [ "$bench_status" -eq 0 ]
