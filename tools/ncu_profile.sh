#!/usr/bin/env bash
# Nsight Compute over one call of each case of tools/ncu_cases.py (all in one process), on the H200 after
# tools/gpu_session.sh installed the package: speed of light, memory workload, occupancy, launch statistics, and the
# per-reason warp stall ratios (where the issue slots go). Text report to $OUT/ncu.txt (or /tmp/ncu.txt).
#
#     bash tools/ncu_profile.sh [CASE ...]        (default: every case; `python tools/ncu_cases.py --list`)
set -uo pipefail
cd "$(dirname "$0")/.."
report=${OUT:-/tmp}/ncu.txt
cases=${*:-$(python3 tools/ncu_cases.py --list | cut -d' ' -f2-)}
ncu --profile-from-start off --target-processes all \
    --section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy --section LaunchStats \
    --section WarpStateStats --section SchedulerStats \
    --metrics "regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio" \
    python3 tools/ncu_cases.py $cases > "$report" 2>&1
rc=$?
grep -E "^\s+[a-zA-Z_0-9]+.*\([0-9]+, [0-9]+, [0-9]+\)x|Duration|Memory Throughput|Compute \(SM\) Throughput|Registers Per|Achieved Occupancy|Warp Cycles Per Issued|Issue Slots Busy|No Eligible" "$report" | head -150
echo "ncu exit $rc; full report $report ($(wc -l < "$report") lines)"
exit $rc
