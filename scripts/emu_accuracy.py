"""Accuracy of the kernels on the CPU: the emulated kernels (foscar.emu) over every mode, width
and group size, against float64 attention over the same dequantized cache.

  PYTHONPATH=. python scripts/emu_accuracy.py [--seeds 2] [--define FOSCAR_KF16_HIGH=1]
  PYTHONPATH=. python scripts/emu_accuracy.py --k-model    # float64 model of bf16 q~ = q s alone

Cases are the tests' kind (tests/foscar/test_kernels_emu.py: random lengths, GQA ratio, pages,
keys with per-channel outliers) but with fixed seeds, so figures in docs/PERFORMANCE.md can be
reproduced. The emulator accumulates MMAs in double: the GPU's fp32 accumulation adds its own
error on top (scripts/probe_mma_precision.cu).
"""
from __future__ import annotations

import argparse
import itertools
import math
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "foscar"))
import test_kernels_emu as cases  # noqa: E402 - the tests' case generator

import foscar  # noqa: E402
from foscar.cache import gather_params  # noqa: E402
from foscar.config import QuantConfig  # noqa: E402
from foscar.reference import attention_f64  # noqa: E402

F64 = torch.float64


def emulated(seeds: int, defines: tuple[str, ...]) -> None:
    t0 = time.time()
    for bits, group, (k_mode, v_mode) in itertools.product([4, 2], [32, 64, 128], cases.MODES):
        for i in range(seeds):
            seed, config, lens, hkv, ratio = cases._case(bits, group, k_mode, v_mode, seed=i * 7919 + bits * 13 + group)
            q, cache = cases._data(config, lens, hkv, ratio, seed)
            err = cases._error(q, cache, lens, defines=defines)
            flag = "" if err <= cases.TOLERANCE else "  <-- over the gate"
            print(f"int{bits} G{group:3d} K {k_mode:7} V {v_mode:7} seed {seed:6d}: {err:.2e}  lens={lens} "
                  f"kv_heads={hkv} ratio={ratio} page={config.page_size}{flag}", flush=True)
    print(f"{time.time() - t0:.0f} s")


def k_model(seeds: int) -> None:
    """Channel-wise K with only q~ = q * s * scale rounded to bf16 (V exact): the error that
    rounding alone costs, on 512 tokens with channel outliers."""
    for bits in (4, 2):
        for seed in range(seeds):
            gen = torch.Generator().manual_seed(seed)
            batch, heads, ratio, dim, length = 1, 1, 4, 128, 512
            k = torch.randn(batch, length, heads, dim, generator=gen).bfloat16()
            v = torch.randn(batch, length, heads, dim, generator=gen).bfloat16()
            k = k * (1 + 4 * torch.rand(dim, generator=gen)).bfloat16()
            q = torch.randn(batch, heads * ratio, dim, generator=gen).bfloat16()
            cache = foscar.quantize(k, v, [length], QuantConfig(bits=bits, group_size=128, k_mode="channel",
                                                                 v_mode="token", page_size=128))
            kd, vd = foscar.dequantize(cache, dtype=F64)
            ref = attention_f64(q, kd, vd, [length])
            k_scale = gather_params(cache, torch.arange(batch))[0][..., 0].to(F64)  # [b, j, h, d]
            sm = 1 / math.sqrt(dim)
            qg = q.to(F64).view(batch, heads, ratio, dim)
            s_ = k_scale.permute(0, 2, 1, 3)[:, :, None]  # [b, h, 1, j, d]
            q_eff = (qg[:, :, :, None, :] * s_ * sm).to(torch.bfloat16).to(F64) / (s_ * sm)
            x = kd.view(batch, length // 128, 128, heads, dim)
            scores = torch.einsum("bhrjd,bjihd->bhrji", q_eff, x).flatten(-2) * sm
            out = torch.einsum("bhrt,bthd->bhrd", torch.softmax(scores, -1), vd).reshape(batch, -1, dim)
            print(f"int{bits} seed {seed}: bf16 q~ rounding alone {((out - ref).norm() / ref.norm()).item():.2e}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=2)
    ap.add_argument("--define", action="append", default=[], help="kernel knob NAME=VALUE (repeatable)")
    ap.add_argument("--k-model", action="store_true")
    args = ap.parse_args()
    if args.k_model:
        k_model(max(args.seeds, 6))
    else:
        emulated(args.seeds, tuple(f"-D{d}" for d in args.define))
    return 0


if __name__ == "__main__":
    sys.exit(main())
