#!/usr/bin/env bash
# The balanced order (foscar_decode.cuh, ItemOrder) against the plain order and against the
# previous tree's library, in one device call: timed at the paper point and at 128K, batch 1's
# one-head kernels, then timelines. OLD=<path of the previous tree's libfoscar.so>.
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=. FOSCAR_CACHE_DIR=$PWD/.foscar-cache
OUT=${OUT:-out}; mkdir -p "$OUT"
OLD=${OLD:?the previous tree's libfoscar.so}
smi() { nvidia-smi --query-gpu=name,uuid,clocks.sm,clocks.mem,temperature.gpu,power.draw,clocks_throttle_reasons.active --format=csv,noheader; }
lab() { timeout "$1" python3 scripts/kernel_lab.py "${@:2}" 2>&1 | grep -v '^{' | tail -12; }
echo "== start $(date -u +%T) $(smi)"
lab 200 --variant d= --prebuilt v22="$OLD" --balance -,0,0.05,0.1,0.15 --configs 4ct,2ct --batch 128 --kv-len 32768 \
    --rounds 2 --json "$OUT/bal_b128_32k.json"
echo "== b128 128K $(date -u +%T) $(smi)"
lab 150 --variant d= --prebuilt v22="$OLD" --balance -,0.05,0.1 --configs 4ct,2ct --batch 128 --kv-len 131072 \
    --json "$OUT/bal_b128_128k.json"
echo "== b1 $(date -u +%T) $(smi)"
lab 90 --variant d= --prebuilt v22="$OLD" --balance -,0.1 --configs 4ct,2ct --batch 1 --kv-len 131072 --rounds 2 \
    --json "$OUT/bal_b1_128k.json"
lab 60 --variant d= --prebuilt v22="$OLD" --configs 4ct --batch 1 --kv-len 4096 --rounds 2 --json "$OUT/bal_b1_4k.json"
echo "== timelines $(date -u +%T) $(smi)"
lab 120 --variant tl=FOSCAR_TIMELINE=1 --timeline tl --balance -,0.1 --configs 4ct,2ct --batch 128 --kv-len 32768 \
    --json "$OUT/tl_b128_32k.json"
echo "== end $(date -u +%T) $(smi)"
