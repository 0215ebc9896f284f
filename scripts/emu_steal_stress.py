"""Random cases of lab knob FOSCAR_STEAL on the emulator, with CTAs running at once, checked
against the float64 reference until the time is up: groups of 32-128, every K/V mode at both
widths, 1-8 query heads per KV head, 1-5 sequences of up to 3000 tokens, forced splits or the
plan's, segments of 1-8 chunks, the plan of 1 or 132 SMs.

    FOSCAR_EMU_CONCURRENT_CTAS=4 FOSCAR_EMU_CLAIM_PAUSE_US=2000 \\
        python3 scripts/emu_steal_stress.py --seconds 300 --seed 3

Prints every case outside the gate (with what rebuilds it) and the count; exits 1 if any was.
"""
from __future__ import annotations

import argparse
import random
import sys
import time

TOLERANCE = 4e-3  # the gate


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=300, help="draw cases until this much time has passed")
    ap.add_argument("--seed", type=int, default=0, help="the draw's seed")
    ap.add_argument("--defines", default="-DFOSCAR_STEAL=1",
                    help="the emulator build's knobs, space-separated (FOSCAR_STEAL=1 among them)")
    args = ap.parse_args(argv)
    defines = tuple(args.defines.split())
    if "-DFOSCAR_STEAL=1" not in defines:
        ap.error(f"--defines {args.defines!r} lacks -DFOSCAR_STEAL=1, the knob this script exercises")

    import torch

    import foscar
    from foscar import emu
    from foscar.config import QuantConfig
    from foscar.reference import attention_f64
    from foscar.testcases import case_inputs

    rng = random.Random(args.seed)
    runs = bad = 0
    t0 = time.time()
    while time.time() - t0 < args.seconds:
        bits, group = rng.choice([4, 2]), rng.choice([32, 64, 128])
        k_mode, v_mode = rng.choice(["token", "channel"]), rng.choice(["token", "channel"])
        ratio, hkv, batch = rng.choice([1, 4, 8]), rng.choice([1, 2]), rng.choice([1, 2, 3, 5])
        page = rng.choice([p for p in (64, 128, 256) if p % group == 0])
        lens = [rng.randrange(1, 3000) for _ in range(batch)]
        splits, seg, sms = rng.choice([None, 1, 2, 3, 7]), rng.choice([1, 2, 3, 8]), rng.choice([132, 1])
        seed = rng.randrange(1 << 30)
        config = QuantConfig(bits=bits, group_size=group, k_mode=k_mode, v_mode=v_mode, page_size=page)
        q, cache = case_inputs(config, lens, hkv, ratio, seed)
        out = torch.full_like(q, float("nan"))
        emu.decode(q, cache, out=out, defines=defines, num_splits=splits, steal_segment_chunks=seg, num_sms=sms)
        kd, vd = foscar.dequantize(cache, dtype=torch.float64)
        ref = attention_f64(q, kd, vd, lens)
        err = ((out.double() - ref).norm() / ref.norm()).item()
        runs += 1
        if not err <= TOLERANCE:
            bad += 1
            print(f"outside the gate: bits={bits} group={group} {k_mode}/{v_mode} ratio={ratio} kv_heads={hkv} "
                  f"lens={lens} page={page} splits={splits} segment={seg} sms={sms} seed={seed}: {err:.3e}", flush=True)
    print(f"{runs} cases, {bad} outside the gate")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
