#!/usr/bin/env bash
# One device call of kernel experiments: time variants (scripts/kernel_lab.py), then profile
# the named ones under ncu (stall reasons per SASS instruction), all under $OUT.
#   VARIANTS="base= c2=FOSCAR_CTAS_INT4=2" PROFILE="base" CONFIGS=4ct,2ct bash scripts/h200_lab.sh
# Optional: TESTS="tests/foscar/test_kernels_gpu.py" runs those GPU tests first; PROBE=1 runs
# scripts/probe_tc.py (the Tensor Cores' arithmetic); PROFILE_CONFIGS limits what ncu profiles;
# TIMELINE=NAME (a variant built with FOSCAR_TIMELINE=1) records one launch's per-CTA phases at
# each of TIMELINE_SHAPES (batch:kv_len, default 1:128 1:4096 1:32768 1:131072) into
# $OUT/timeline_b<batch>_kv<len>.json (packed into $OUT/timelines.tar.gz where the call would
# otherwise bring back more than 8 files); TIMING=0 skips the timed comparison:
#   VARIANTS="tl=FOSCAR_TIMELINE=1" TIMELINE=tl TIMING=0 bash scripts/h200_lab.sh
# Libraries built here beforehand travel in .foscar-cache (FOSCAR_CACHE_DIR); a key that
# does not match the box's nvcc rebuilds there.
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/limit.sh"  # limit: timeout that says so in the log
export PYTHONUNBUFFERED=1 PYTHONPATH=. FOSCAR_CACHE_DIR=${FOSCAR_CACHE_DIR:-$PWD/.foscar-cache}
OUT=${OUT:-out}; mkdir -p "$OUT"
CONFIGS=${CONFIGS:-4ct,2ct}
VARIANTS=${VARIANTS:-base=}
PROFILE=${PROFILE:-}
vargs=(); for v in $VARIANTS; do vargs+=(--variant "$v"); done
smi() { nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu,power.draw,clocks_throttle_reasons.active --format=csv,noheader; }
LOG=$OUT/lab.log
smi | tee "$LOG"
if [[ -n "${PROBE:-}" ]]; then  # the Tensor Cores' arithmetic (docs/PERFORMANCE.md, v5)
    python3 scripts/probe_tc.py run --out "$OUT/probe_tc.npz" 2>&1 | tee -a "$LOG" | tail -32
fi
if [[ -n "${TESTS:-}" ]]; then  # the kernels' GPU tests, default build
    limit 240 python3 -m pytest -q -p no:cacheprovider $TESTS 2>&1 | tee -a "$LOG" | grep -E "passed|failed|Error|seed=" | head -30
fi
if [[ -n "${TIMELINE:-}" ]]; then  # where one launch's time goes, CTA by CTA (docs/PERFORMANCE.md, next list)
    for bk in ${TIMELINE_SHAPES:-1:128 1:4096 1:32768 1:131072}; do
        b=${bk%%:*}; kv=${bk##*:}
        limit 120 python3 scripts/kernel_lab.py "${vargs[@]}" --configs "$CONFIGS" --batch "$b" --kv-len "$kv" \
            --timeline "$TIMELINE" --json "$OUT/timeline_b${b}_kv${kv}.json" ${LAB_ARGS:-} 2>&1 | tee -a "$LOG" | grep -vE '^\{' | tail -20
    done
fi
if [[ "${TIMING:-1}" != 0 ]]; then
    limit "${LAB_TIMEOUT:-300}" python3 scripts/kernel_lab.py "${vargs[@]}" --configs "$CONFIGS" --json "$OUT/lab.json" ${LAB_ARGS:-} 2>&1 | tee -a "$LOG" | grep -vE '^\{'
fi
smi | tee -a "$LOG"
NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
PCONFIGS=${PROFILE_CONFIGS:-$CONFIGS}
for name in $PROFILE; do
    ranges=(); for c in ${PCONFIGS//,/ }; do ranges+=(--nvtx-include "lab_$c/"); done
    limit 240 "$NCU" --clock-control none --nvtx "${ranges[@]}" \
        --section WarpStateStats --section SchedulerStats --section SourceCounters --section Occupancy \
        --section LaunchStats --section SpeedOfLight --section MemoryWorkloadAnalysis --section InstructionStats \
        --section ComputeWorkloadAnalysis \
        -f -o "/tmp/prof_$name" python3 scripts/kernel_lab.py "${vargs[@]}" --configs "$PCONFIGS" --profile "$name" ${LAB_ARGS:-} \
        > "/tmp/ncu_$name.log" 2>&1 || tail -5 "/tmp/ncu_$name.log" | tee -a "$LOG"
    "$NCU" --import "/tmp/prof_$name.ncu-rep" --page raw --csv > "$OUT/ncu_raw_$name.csv" 2>/dev/null
    "$NCU" --import "/tmp/prof_$name.ncu-rep" --page source --csv --print-source sass > "/tmp/src_$name.csv" 2>/dev/null
    gzip -c "/tmp/src_$name.csv" > "$OUT/ncu_src_$name.csv.gz"
    "$NCU" --import "/tmp/prof_$name.ncu-rep" --page details --csv > "$OUT/ncu_details_$name.csv" 2>/dev/null
    grep -E "Warp Cycles Per Issued|Issue Slots Busy|No Eligible|Achieved Occupancy|Duration|DRAM Throughput" \
        "$OUT/ncu_details_$name.csv" | cut -c1-220 | head -24
done
# A device call brings back at most 8 files: past that, the timelines travel as one tarball.
shopt -s nullglob
files=("$OUT"/*); timelines=("$OUT"/timeline_b*.json)
if (( ${#files[@]} > 8 && ${#timelines[@]} > 1 )); then
    tar -C "$OUT" -czf "$OUT/timelines.tar.gz" "${timelines[@]#"$OUT"/}" && rm -f "${timelines[@]}"
fi
n=$(limit_failures "$LOG"); (( n == 0 )) || { echo "== $n step(s) timed out or failed (see $LOG)"; exit 1; }
