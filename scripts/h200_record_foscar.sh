#!/usr/bin/env bash
# Short device call: our kernels alone at the `paper` point (bf16 operands, the default),
# recorded into a store with their ALU/DRAM figures under ncu. No FlashInfer JIT needed.
set -uo pipefail
export PYTHONUNBUFFERED=1 FOSCAR_CACHE_DIR=${FOSCAR_CACHE_DIR:-/tmp/fcache} PYTHONPATH=.
OUT=${OUT:-out}; mkdir -p "$OUT"
python3 -c "from foscar.build import build; print(build('sm_90a').so_path)" | tail -1
B=foscar-int4,foscar-int2,foscar-dequant-int4,foscar-dequant-int2
timeout 100 python3 -m suite sweep --preset paper --backends "$B" --db "$OUT/foscar.sqlite" --no-progress --no-read-ceiling 2>&1 | tail -12
RUN=$(python3 -c "from suite.store import ResultStore; print(ResultStore('$OUT/foscar.sqlite').latest_run())")
timeout 80 python3 -m suite alu -b "$B" --batch 128 --kv-len 32768 --iters 2 --run "$RUN" --db "$OUT/foscar.sqlite" --json-out "$OUT/alu_foscar.json" 2>&1 | tail -12
