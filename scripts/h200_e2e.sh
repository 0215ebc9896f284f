#!/usr/bin/env bash
# The device calls of `foscar-bench e2e` (docs/E2E.md), in stages that each fit one call:
#   STAGES=tests bash scripts/h200_e2e.sh   the GPU tests: captured appends, each format's logits check, one point
#   bash scripts/h200_e2e.sh                the numbers: checks, capacity and the grid, Llama-3-8B shapes
#   STAGES=70b bash scripts/h200_e2e.sh     llama3-70b shapes, cut to the layers that fit (labelled so)
# Everything lands in $OUT/e2e.tar.gz (e2e.sqlite, e2e.json, the logs). The device copy has no
# .git: pass FOSCAR_GIT_SHA=<commit>. The FlashInfer wheels travel in .whl (carry it).
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/limit.sh"  # limit: timeout that says so in the log
export PYTHONUNBUFFERED=1 PYTHONPATH=. FOSCAR_CACHE_DIR=${FOSCAR_CACHE_DIR:-$PWD/.foscar-cache}
OUT=${OUT:-out}; W=$OUT/e2e; mkdir -p "$W"
LOG=$W/e2e.log
STAGES=${STAGES:-e2e}
pack() { tar -C "$OUT" -czf "$OUT/e2e.tar.gz" e2e; }  # a call cut short keeps what was written
trap pack EXIT
if ls .whl/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        && export PYTHONPATH=/tmp/site:.
fi
smi() { nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu,power.draw,memory.used --format=csv,noheader; }
echo "== start $(date -u +%FT%TZ) stages: $STAGES; $(smi)" | tee -a "$LOG"
for stage in $STAGES; do
    echo "== $stage $(date -u +%T) $(smi)" | tee -a "$LOG"
    case $stage in
    tests)
        limit 540 python3 -m pytest -q -p no:cacheprovider tests/foscar/test_append_graph.py \
            tests/suite/test_e2e_gpu.py 2>&1 | tee "$W/pytest_gpu.txt" | tail -15 | tee -a "$LOG" ;;
    e2e)
        limit 570 python3 -m suite e2e --model llama3-8b --db "$W/e2e.sqlite" --json "$W/e2e.json" 2>&1 \
            | tee "$W/e2e_8b.log" | tail -40 >> "$LOG" ;;
    70b)
        limit 570 python3 -m suite e2e --model llama3-70b --batch 1,8,32 --kv-len 4k,32k --db "$W/e2e.sqlite" \
            --json "$W/e2e_70b.json" 2>&1 | tee "$W/e2e_70b.log" | tail -40 >> "$LOG" ;;
    *) echo "unknown stage $stage (tests e2e 70b)" | tee -a "$LOG" ;;
    esac
    pack
done
echo "== end $(date -u +%T) $(smi)" | tee -a "$LOG"
n=$(limit_failures "$LOG"); (( n == 0 )) || { echo "== $n stage(s) timed out or failed" | tee -a "$LOG"; exit 1; }
