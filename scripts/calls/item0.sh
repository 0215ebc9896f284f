#!/usr/bin/env bash
# Item 0 on an H200 (docs/PERFORMANCE.md, "What the next device session runs"): the hot
# instruction cache's size, then scripts/h200_rules.sh on HEAD's tree as .snap holds it (so that
# files edited here meanwhile do not travel): the small-launch row's lab shapes on the tree's
# library, the harness on main's tree (tests grid paper floor targets) and on the row's (grid paper
# floor targets). SHORT=1: the 4-minute form (two lab shapes; tests grid paper targets; the row's grid).
# TIGHT=1 (under about 330 s of device time): main's grid, GPU tests and targets alone, no lab.
set -u
source "$(dirname "${BASH_SOURCE[0]}")/snap.sh"
require_snap
icache_probe "$OUT/icache_capacity.json"
if [[ -n ${SHORT:-} ]]; then
    export LAB="1 16384 plan,32 own;2 4096 plan,16 own" STAGES="tests grid paper targets" ROW_STAGES=grid
fi
KEY=$(cat .snap/lib_key)
unpack_main lib.tar.xz
if [[ -n ${TIGHT:-} ]]; then
    STAGES="grid tests targets" FOSCAR_GIT_SHA=$(cat .snap/sha) exec bash scripts/h200_record.sh
fi
LIB=.foscar-cache/sm_90a-$KEY/libfoscar.so FOSCAR_GIT_SHA=$(cat .snap/sha) \
    ROW_TREE=.snap/code_row.tar.gz ROW_SHA=$(cat .snap/sha_row) bash scripts/h200_rules.sh
