#!/usr/bin/env bash
# Nsight Compute's source page (per-SASS instruction metrics: warp-stall samples, executed instructions, with the
# kernel source line each came from) for one launch of a kernel in a tools/ncu_cases.py case, as CSV under $OUT,
# for tools/ncu_lines.py to sum by source line. Run after tools/gpu_session.sh's install (or any install).
#
#     bash tools/ncu_lines.sh CASE KERNEL_REGEX [LAUNCH_SKIP]      e.g. bash tools/ncu_lines.sh flash_t8192 kda_intra
set -uo pipefail
cd "$(dirname "$0")/.."
case=$1 kernel=$2 skip=${3:-0}
out=${OUT:-/tmp}
rep="$out/${case}_${kernel}"
ncu --profile-from-start off -k "regex:$kernel" --launch-skip "$skip" --launch-count 1 --set full \
    --import-source yes -f -o "$rep" python3 tools/ncu_cases.py "$case" > "$rep.log" 2>&1 || { tail -20 "$rep.log"; exit 1; }
ncu -i "$rep.ncu-rep" --page source --csv --print-source cuda,sass > "$rep.csv" 2> "$rep.err" \
    || ncu -i "$rep.ncu-rep" --page source --csv --print-source sass > "$rep.csv" 2>> "$rep.err"
ncu -i "$rep.ncu-rep" --page details --csv > "$rep.details.csv" 2>> "$rep.err"
rm -f "$rep.ncu-rep"
echo "$rep.csv: $(wc -l < "$rep.csv") lines"; head -c 1500 "$rep.csv"; echo; tail -5 "$rep.err"
