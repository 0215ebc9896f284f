"""Accuracy of the kernels on the CPU: the emulated kernels (foscar.emu) over every mode, width
and group size, against float64 attention over the same dequantized cache.

  PYTHONPATH=. python scripts/emu_accuracy.py [--seeds 2] [--define FOSCAR_PV_SPLIT=1]

Cases are the tests' kind (tests/foscar/test_kernels_emu.py: random lengths, GQA ratio, pages,
keys with per-channel outliers) but with fixed seeds, so figures in docs/PERFORMANCE.md can be
reproduced. The emulator accumulates MMAs as the H200's Tensor Cores do (foscar_emu.h's tc_dot,
the model foscar/tcmodel.py fits to scripts/probe_tc.py's recordings), so its errors are the
GPU's within the rounding of the order of the sums. --define takes the kernels' knobs
(foscar.build.known_knobs); a name the sources do not read is refused.
"""
from __future__ import annotations

import argparse
import itertools
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "foscar"))
import test_kernels_emu as cases  # noqa: E402 - the tests' case generator


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


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=2)
    ap.add_argument("--define", action="append", default=[], help="kernel knob NAME=VALUE (repeatable)")
    args = ap.parse_args()
    emulated(args.seeds, tuple(f"-D{d}" for d in args.define))
    return 0


if __name__ == "__main__":
    sys.exit(main())
