#!/usr/bin/env bash
# The next device calls of docs/PERFORMANCE.md ("What the next device session runs", items 0-1):
# v35's kernels and v36 (lab knob FOSCAR_STEAL=1) through the GPU tests, batch 128's timeline with
# and without v36, then v36 and v35 timed beside this tree's default build. STEPS picks the parts
# (a call holds at most 10 minutes: "tests timeline" in one, "timing" in the next):
#   STEPS="tests timeline" bash scripts/h200_v36.sh;  STEPS=timing bash scripts/h200_v36.sh
# Libraries built here beforehand travel in .foscar-cache; V35 names v35's (branch v35).
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=. FOSCAR_CACHE_DIR=${FOSCAR_CACHE_DIR:-$PWD/.foscar-cache}
OUT=${OUT:-out}; mkdir -p "$OUT"
C=$FOSCAR_CACHE_DIR
V35=${V35:-$C/sm_90a-a4a8f43c0d9ef15d/libfoscar.so}
STEPS=${STEPS:-"tests timeline"}
has() { [[ " $STEPS " == *" $1 "* ]]; }
if has tests; then
    [[ -f "$V35" ]] || echo "no v35 library at $V35: its tests are skipped"
    if [[ -f "$V35" ]]; then
        FOSCAR_TEST_LIBRARY=$V35 timeout 280 python3 -m pytest -q -p no:cacheprovider tests/foscar/test_kernels_gpu.py \
            -k "not stolen" > "$OUT/pytest_v35.txt" 2>&1
        tail -3 "$OUT/pytest_v35.txt"
    fi
    timeout 200 python3 -m pytest -q -p no:cacheprovider tests/foscar/test_kernels_gpu.py -k stolen \
        > "$OUT/pytest_v36.txt" 2>&1
    tail -3 "$OUT/pytest_v36.txt"
fi
if has timeline; then
    VARIANTS="tl=FOSCAR_TIMELINE=1" TIMELINE=tl TIMING=0 CONFIGS=4ct,4tt,2ct TIMELINE_SHAPES=128:32768 \
        OUT=$OUT/tl bash scripts/h200_lab.sh | tail -12
    VARIANTS="stl=FOSCAR_STEAL=1,FOSCAR_TIMELINE=1" TIMELINE=stl TIMING=0 CONFIGS=4ct,4tt,2ct \
        TIMELINE_SHAPES="128:32768 1:131072" OUT=$OUT/stl bash scripts/h200_lab.sh | tail -12
fi
if has timing; then
    prebuilt=""; [[ -f "$V35" ]] && prebuilt="--prebuilt v35=$V35"
    TAG=v36 SHAPES="128 32768 4ct,4tt,2ct,2tt 3;1 131072 4ct,2ct 2;32 32768 4ct,2ct 2" \
        LAB_ARGS="--variant base= --variant st=FOSCAR_STEAL=1 $prebuilt" bash scripts/h200_shapes.sh
fi
