#!/usr/bin/env bash
# Records on the H200 box what docs/PERFORMANCE.md and the bundled results quote, in one
# device call: kernel GPU tests, the kernel bench at the headline shape (both operand
# types), the `paper` sweep over every backend, and the ALU/DRAM table under ncu.
#   bash scripts/h200_record.sh      (writes under $OUT, default ./out)
set -uo pipefail
export PYTHONUNBUFFERED=1 FOSCAR_CACHE_DIR=${FOSCAR_CACHE_DIR:-/tmp/fcache}
# The device copy has no .git: pass FOSCAR_GIT_SHA=$(git rev-parse HEAD) in the command.
OUT=${OUT:-out}; mkdir -p "$OUT"
if ls .whl/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
    export PYTHONPATH=/tmp/site:.
else
    export PYTHONPATH=.
fi
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu,power.draw,clocks_throttle_reasons.active --format=csv | tee "$OUT/smi_before.csv"
python3 -c "from foscar.build import build; print(build('sm_90a').so_path)" | tail -1
# mma.sync accumulation precision under an injection bias, and fp16 subnormal operands
nvcc -gencode=arch=compute_90a,code=sm_90a -std=c++17 -O2 -I foscar/csrc scripts/probe_mma_precision.cu -o /tmp/probe \
    && /tmp/probe | tee "$OUT/probe_mma.txt" | tail -8
timeout 120 python3 -m pytest -q tests/foscar/test_kernels_gpu.py tests/suite/test_gpu.py -p no:cacheprovider 2>&1 | tee "$OUT/pytest_gpu.txt" | grep -E "passed|failed|seed=" | head -20
timeout 100 python3 scripts/bench_foscar.py --json "$OUT/bench_bf16.json" 2>&1 | tail -11
FOSCAR_OPERAND=fp16 timeout 100 python3 scripts/bench_foscar.py --json "$OUT/bench_fp16.json" 2>&1 | tail -11
BACKENDS=flashinfer-bf16-tc,flashinfer-bf16,flashinfer-fp8,trtllm-xqa-fp8,flashinfer-nvfp4-tc,trtllm-nvfp4,bitdecoding-int4,bitdecoding-int2,foscar-int4,foscar-int2,foscar-dequant-int4,foscar-dequant-int2,foscar-int4-fp16,foscar-int2-fp16
timeout 200 python3 -m suite sweep --preset paper --backends "$BACKENDS" --db "$OUT/paper.sqlite" --no-progress 2>&1 | tail -22
RUN=$(python3 -c "from suite.store import ResultStore; print(ResultStore('$OUT/paper.sqlite').latest_run())")
timeout 150 python3 -m suite alu -b foscar-int4,foscar-int2,foscar-dequant-int4,foscar-dequant-int2,flashinfer-bf16-tc,trtllm-xqa-fp8 \
    --batch 128 --kv-len 32768 --iters 2 --run "$RUN" --db "$OUT/paper.sqlite" --json-out "$OUT/alu.json" 2>&1 | tail -16
nvidia-smi --query-gpu=clocks.sm,clocks.mem,temperature.gpu,power.draw,clocks_throttle_reasons.active --format=csv | tee "$OUT/smi_after.csv"
