#!/usr/bin/env bash
# A Hopper other than the H200 (docs/PERFORMANCE.md, "What the next device session runs"): the hot
# instruction cache's size (scripts/probe_icache.cu capacity), item 1's lab (FOSCAR_COOP_MERGE's
# second form against the tree's library and a copy of it), ncu's source page of the tree's
# library at batch 1 / 4K (the code such a launch runs: scripts/ncu_footprint.py), then the tree's
# library through the harness: GPU tests, grid, targets (SHORT=1: the tests alone). All but the
# harness's record comes back in $OUT/extras.tar.gz (a call brings back at most 8 files).
set -u
source "$(dirname "${BASH_SOURCE[0]}")/snap.sh"
require_snap
FINAL=$OUT; X=$(mktemp -d)
pack() { tar -C "$X" -czf "$FINAL/extras.tar.gz" .; }
icache_probe "$X/icache_capacity.json"; pack
KEY=$(cat .snap/lib_key) COOP=$(cat .snap/coop2_key)
unpack_main lib.tar.xz coop2.tar.xz
mkdir -p /tmp/copy
BASE=.foscar-cache/sm_90a-$KEY/libfoscar.so
cp "$BASE" /tmp/copy/libfoscar.so  # a copy: the same path would load as the same module
SHAPES="1 4096 4ct,2ct 2;1 32768 4ct,2ct 2;1 131072 2ct 2;8 4096 4ct,2ct 2" TAG=coop2 OUT=$X \
    LAB_ARGS="--prebuilt base=$BASE --prebuilt copy=/tmp/copy/libfoscar.so --prebuilt coop2=.foscar-cache/sm_90a-$COOP/libfoscar.so" \
    bash scripts/h200_shapes.sh 2>&1 | tail -30; pack
VARIANTS="" TIMING=0 PROFILE=lib CONFIGS=4ct,2ct OUT=$X/ncu_b1 LAB_ARGS="--prebuilt lib=$BASE --batch 1 --kv-len 4096" \
    bash scripts/h200_lab.sh 2>&1 | tail -12; pack
STAGES=${STAGES:-tests grid targets}; [[ -n ${SHORT:-} ]] && STAGES=tests
STAGES="$STAGES" OUT=$FINAL FOSCAR_GIT_SHA=$(cat "$ROOT/.snap/sha") bash scripts/h200_record.sh 2>&1 | tail -70
