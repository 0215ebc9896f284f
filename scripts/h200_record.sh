#!/usr/bin/env bash
# The device calls that produce what docs/PERFORMANCE.md and the bundled results quote, in
# stages that each fit one call (under 10 minutes):
#   STAGES="tests lab profile" bash scripts/h200_record.sh   are the kernels right, how fast, why
#   STAGES="accuracy" bash scripts/h200_record.sh            the error at 4K-256K tokens, every mode
#   STAGES="paper alu" bash scripts/h200_record.sh           every backend at the paper point
#   STAGES="tokenk" bash scripts/h200_record.sh              our kernels at the paper point with token-wise K
#   STAGES="full" RESUME=<run id> bash scripts/h200_record.sh  the full grid, resumable
#   STAGES="tests grid paper accuracy floor alu" FOSCAR_GIT_SHA=<sha> BACKENDS_PAPER=foscar-int4,foscar-int2 \
#     ALU_BACKENDS=foscar-int4,foscar-int2 bash scripts/h200_record.sh
#                                 a kernel version through the harness in one call (about 4 minutes):
#                                 the 16-case grid (runs grid-<gpu>-<sha>, paper-<gpu>-<sha>) and its read floor
#   STAGES="... targets"                                  last: the targets scorecard over this call's grid and paper runs
#   STAGES="ceiling nvfp4" bash scripts/h200_record.sh       the searched read ceiling; FlashInfer NVFP4 vs its own timer
#   STAGES="bdbuild bdprobe" bash scripts/h200_record.sh     build BitDecoding (carried in .bitdecoding/), probe INT4/INT2
# With .bitdecoding/build present (bdbuild), `paper` times BitDecoding too. The `ceiling`
# stage keeps its result in .foscar-cache/ceiling.json, and `paper` and `full` (in this call
# or a later one on the same machine) reuse it instead of searching again; CEILING=<json>
# names another.
# Everything lands in $OUT/record.tar.gz (the call brings back at most 8 files) and the log
# in $OUT/record.log. The device copy has no .git: pass FOSCAR_GIT_SHA=<commit> for the store.
# The FlashInfer wheels travel in .whl (scripts/../shared/gpu/wheelhouse.sh fills it).
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/limit.sh"  # limit: timeout that says so in the log
export PYTHONUNBUFFERED=1 PYTHONPATH=. FOSCAR_CACHE_DIR=${FOSCAR_CACHE_DIR:-$PWD/.foscar-cache}
OUT=${OUT:-out}; W=$OUT/record; mkdir -p "$W"
LOG=$OUT/record.log
STAGES=${STAGES:-tests lab profile}
SHA=${FOSCAR_GIT_SHA:-local}
# The run ids name the card that ran them (grid-h200-<sha>, grid-h100-<sha>, ...); GPU_TAG overrides.
GPU=${GPU_TAG:-$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1 | grep -oiE 'H[0-9]{3}|B[0-9]{3}|A[0-9]{3}' | head -1 | tr 'A-Z' 'a-z')}
GPU=${GPU:-gpu}
checkpoint() {  # fold each store's write-ahead log into it, so that the tarball holds whole databases
    for db in "$W"/*.sqlite; do [[ -e $db ]] && python3 -c "import sqlite3, sys; sqlite3.connect(sys.argv[1]).execute('pragma wal_checkpoint(TRUNCATE)')" "$db"; done
}
pack() { checkpoint; tar -C "$OUT" -czf "$OUT/record.tar.gz" record; }  # after every stage: a cut-off call keeps the rest
trap pack EXIT
if ls .whl/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        && export PYTHONPATH=/tmp/site:.
fi
if [[ -d .bitdecoding/build ]]; then export PYTHONPATH=$PWD/.bitdecoding/build:$PWD/.bitdecoding:$PYTHONPATH; fi
smi() { nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu,power.draw,clocks_throttle_reasons.active --format=csv,noheader; }
echo "== start $(date -u +%FT%TZ) stages: $STAGES; $(smi)" | tee "$LOG"

LAB_VARIANTS=${LAB_VARIANTS:-"v7="}  # c2, c4 and deeper rings lost (docs/PERFORMANCE.md)
BACKENDS_PAPER=${BACKENDS_PAPER:-flashinfer-bf16-tc,flashinfer-bf16,flashinfer-fp8,trtllm-xqa-fp8,flashinfer-nvfp4-tc,trtllm-nvfp4,bitdecoding-int4,bitdecoding-int2,foscar-int4,foscar-int2,foscar-dequant-int4,foscar-dequant-int2}
ALU_BACKENDS=${ALU_BACKENDS:-foscar-int4,foscar-int2,foscar-dequant-int4,foscar-dequant-int2,flashinfer-bf16-tc,trtllm-xqa-fp8}
GRID_KV=${GRID_KV:-4096,16384,32768,131072}  # the 16 cases issue 11's geo-means are taken over
BACKENDS_FULL=${BACKENDS_FULL:-flashinfer-bf16-tc,trtllm-xqa-fp8,foscar-int4,foscar-int2}

[[ -z "${CEILING:-}" && -s "$FOSCAR_CACHE_DIR/ceiling.json" ]] && CEILING=$FOSCAR_CACHE_DIR/ceiling.json
for stage in $STAGES; do
    [[ -z "${CEILING:-}" && -s "$FOSCAR_CACHE_DIR/ceiling.json" ]] && CEILING=$FOSCAR_CACHE_DIR/ceiling.json
    echo "== $stage $(date -u +%T) $(smi)" | tee -a "$LOG"
    case $stage in
    tests)  # the kernels' and the harness's GPU tests, default build
        limit 240 python3 -m pytest -q -p no:cacheprovider tests/foscar/test_kernels_gpu.py \
            tests/foscar/test_cache_gpu.py tests/suite/test_gpu.py tests/suite/test_readfloor.py 2>&1 | tee "$W/pytest_gpu.txt" | tail -15 | tee -a "$LOG" ;;
    lab)    # build variants, check each at the headline shape, time them interleaved; then every mode
        VARIANTS="$LAB_VARIANTS" CONFIGS=4ct,2ct OUT="$W/lab" LAB_TIMEOUT=200 bash scripts/h200_lab.sh 2>&1 | tail -14 | tee -a "$LOG"
        VARIANTS="v7=" CONFIGS=4tt,4tc,4cc,2tt,2tc,2cc,4ctd,2ctd OUT="$W/modes" LAB_TIMEOUT=200 \
            bash scripts/h200_lab.sh 2>&1 | tail -12 | tee -a "$LOG" ;;
    profile)  # stall reasons per SASS instruction, the default build at the headline shape
        VARIANTS="v7=" PROFILE=v7 CONFIGS=4ct,2ct OUT="$W/ncu" LAB_TIMEOUT=120 bash scripts/h200_lab.sh 2>&1 \
            | grep -E "Duration|Issued Warp|Eligible|Warp Cycles|^== (TIMED OUT|FAILED|[0-9]+ step)" | tee -a "$LOG" ;;
    accuracy)  # error against float64 at 4K-256K, every mode and width, batch 1 (docs/PERFORMANCE.md, v7)
        limit 300 python3 scripts/accuracy_long.py --bits 2,4 --modes ct,tt,tc,cc --kv-len 4k,32k,128k,256k \
            --batch 1 --json "$W/acc_b1.json" 2>&1 | tail -34 | tee -a "$LOG" ;;
    paper)
        limit 540 python3 -m suite sweep --preset paper --backends "$BACKENDS_PAPER" --db "$W/paper.sqlite" --run-id "${PAPER_RUN:-paper-$GPU-$SHA}" \
            ${CEILING:+--ceiling-from "$CEILING"} --no-progress 2>&1 | tail -24 | tee -a "$LOG" ;;
    tokenk)  # the paper point with token-wise K (both V modes): the grid and `paper` are K channel-wise
        limit 300 python3 -m suite sweep --preset paper --backends foscar-int4,foscar-int2 --k-mode token --v-mode token,channel \
            --db "$W/paper.sqlite" --run-id "paper-tokenk-$GPU-$SHA" ${CEILING:+--ceiling-from "$CEILING"} --no-progress 2>&1 | tail -12 | tee -a "$LOG" ;;
    alu)
        RUN=$(python3 -c "from core.store import ResultStore; print(ResultStore('$W/paper.sqlite', readonly=True).latest_run())")
        limit 240 python3 -m suite alu -b "$ALU_BACKENDS" \
            --batch 128 --kv-len 32768 --iters 2 --run "$RUN" --db "$W/paper.sqlite" --json-out "$W/alu.json" 2>&1 | tail -16 | tee -a "$LOG" ;;
    full)
        limit 540 python3 -m suite sweep --preset full --backends "$BACKENDS_FULL" --db "$W/full.sqlite" \
            ${RESUME:+--resume "$RESUME"} ${CEILING:+--ceiling-from "$CEILING"} --no-progress 2>&1 | tail -20 | tee -a "$LOG" ;;
    grid)  # the 16 cases of issue 11's geo-means, every backend that has them
        limit 400 python3 -m suite sweep --preset full --kv-len "$GRID_KV" --backends "$BACKENDS_FULL" --db "$W/grid.sqlite" \
            --run-id "grid-$GPU-$SHA" ${CEILING:+--ceiling-from "$CEILING"} --no-progress 2>&1 | tail -24 | tee -a "$LOG" ;;
    floor)  # the fastest cold read of each grid case's bytes: what bounds the geo-means (docs/MEASUREMENT.md)
        limit 200 python3 -m suite ceiling --floor --db "$W/grid.sqlite" --run "grid-$GPU-$SHA" \
            --json-out "$W/floor_${GPU}_grid_$SHA.json" 2>&1 | tail -24 | tee -a "$LOG" ;;
    targets)  # the targets scorecard over this call's grid and paper runs, on the card that ran them
        dbs=(); runs=()  # each run where this call's stages wrote its store (a call without `paper` has no paper run)
        [[ -s $W/grid.sqlite ]] && dbs+=(--db "$W/grid.sqlite") && runs+=(--run "grid-$GPU-$SHA")
        [[ -s $W/paper.sqlite ]] && dbs+=(--db "$W/paper.sqlite") && runs+=(--run "${PAPER_RUN:-paper-$GPU-$SHA}")
        (( ${#dbs[@]} )) && limit 120 python3 -m suite targets "${dbs[@]}" "${runs[@]}" --gpu "$GPU" \
            --json-out "$W/targets.json" 2>&1 | tail -40 | tee -a "$LOG" ;;
    ceiling)  # the read ceiling, searched over kernels and launch shapes, with its spread
        limit 300 python3 -m suite ceiling --json "$W/ceiling.json" 2>&1 | tail -14 | tee -a "$LOG"
        # later stages, and later calls on the same machine, reuse it
        [[ -s "$W/ceiling.json" ]] && mkdir -p "$FOSCAR_CACHE_DIR" && cp "$W/ceiling.json" "$FOSCAR_CACHE_DIR/ceiling.json" ;;
    nvfp4)  # flashinfer-nvfp4-tc against FlashInfer's own timer and benchmark configuration
        limit 540 python3 scripts/flashinfer_nvfp4_check.py --json "$W/nvfp4_check.json" 2>&1 | tail -10 | tee -a "$LOG" ;;
    bdbuild)  # BitDecoding's extension for sm_90 (about 2.5 minutes); kept in .bitdecoding/build
        limit 560 python3 scripts/bitdecoding_build.py --src .bitdecoding 2>&1 | tail -5 | tee -a "$LOG"
        export PYTHONPATH=$PWD/.bitdecoding/build:$PWD/.bitdecoding:$PYTHONPATH ;;
    bdprobe)  # its error against unquantized attention beside plain min-max, and its cache read back
        limit 420 python3 scripts/bitdecoding_probe.py --json "$W/bitdecoding_probe.json" 2>&1 | grep -v '^{' \
            | tee -a "$LOG" ;;
    *) echo "unknown stage $stage (tests lab profile accuracy paper tokenk alu full grid floor ceiling nvfp4 bdbuild bdprobe)" | tee -a "$LOG" ;;
    esac
    pack
done
echo "== end $(date -u +%T) $(smi)" | tee -a "$LOG"
n=$(limit_failures "$LOG"); (( n == 0 )) || { echo "== $n stage step(s) timed out or failed" | tee -a "$LOG"; exit 1; }
