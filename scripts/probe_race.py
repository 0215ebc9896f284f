"""Launches one decode many times on the same inputs and counts the launches whose output differs
bit for bit from the first: the kernels are deterministic, so any difference is a race. For each
differing (sequence, KV head) it names the partial attention (no BF16 tail, one chunk or one
warp's 16 tokens left out) the wrong output is nearest to.

The inputs are test_batch_129_and_forced_splits's (tests/foscar/test_kernels_gpu.py, seed
488434680): batch 129, 8 KV heads, 4 query heads per KV head (paired items), page 256, lengths up
to 549 tokens with BF16 tails. Before v31 (a fence before each stage's release) the paired K
token-wise / V channel-wise kernels gave a wrong output there in 0.03-8 % of launches, INT4 and
INT2 (docs/PERFORMANCE.md, twelfth session).

    python3 scripts/probe_race.py --launches 2000 --modes 4tc [--no-tail] \\
        [--library prev=.foscar-cache/<key>/libfoscar.so] [--json out.json]
"""
from __future__ import annotations

import argparse
import ctypes
import json
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import torch  # noqa: E402

import foscar  # noqa: E402
from foscar import kernels  # noqa: E402
from foscar.testcases import case_inputs, gpu_case  # noqa: E402

SEED, BATCH, RATIO, DIM = 488434680, 129, 4, 128
MODES = {"t": "token", "c": "channel"}


def inputs(bits: int, k_mode: str, v_mode: str, no_tail: bool):
    """The GPU test's case (foscar.testcases), its lengths cut to whole groups with no_tail."""
    config, lens, hkv, ratio = gpu_case(bits, 128, k_mode, v_mode, SEED, batch=BATCH, ratio=RATIO)
    if no_tail:
        lens = [max(128, n - n % 128) for n in lens]
    q, cache = case_inputs(config, lens, hkv, ratio, SEED, device="cuda")
    return q, cache, lens


def nearest_partial(q, cache, lens, b: int, kvh: int, out) -> str:
    """Which partial attention of (sequence b, KV head kvh) the output is nearest to."""
    kd, vd = foscar.dequantize(cache, batch_indices=[b], dtype=torch.float64)
    n = lens[b]
    packed = n - n % cache.config.group_size
    qh = q[b, kvh * RATIO:(kvh + 1) * RATIO].double()

    def attend(keep):
        s = qh @ kd[0, :n, kvh][keep].T / math.sqrt(DIM)
        return torch.softmax(s, dim=-1) @ vd[0, :n, kvh][keep]

    cands = {"full": torch.ones(n, dtype=torch.bool, device="cuda")}
    cands["no tail"] = torch.arange(n, device="cuda") < packed
    for c in range(packed // 64):
        for w in [None, 0, 1, 2, 3]:
            lo, hi = (64 * c, 64 * c + 64) if w is None else (64 * c + 16 * w, 64 * c + 16 * w + 16)
            m = torch.ones(n, dtype=torch.bool, device="cuda")
            m[lo:hi] = False
            cands[f"no chunk {c}" + ("" if w is None else f" warp {w}")] = m
    got = out[b, kvh * RATIO:(kvh + 1) * RATIO].double()
    errs = {}
    for name, m in cands.items():
        ref = attend(m)
        errs[name] = ((got - ref).norm(dim=-1) / ref.norm(dim=-1)).max().item()
    best = sorted(errs.items(), key=lambda x: x[1])[:2]
    return f"len {n}, nearest: " + "; ".join(f"{name} {e:.1e}" for name, e in best)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--launches", type=int, default=1000)
    ap.add_argument("--modes", default="4tc", help="comma list of width and K / V modes, e.g. 4tc,4ct,2tc")
    ap.add_argument("--no-tail", action="store_true", help="cut every length to whole groups (no BF16 tail)")
    ap.add_argument("--library", action="append", default=[],
                    help="NAME=PATH of a built libfoscar.so (default: this tree's build, named 'tree')")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    libs = {"tree": kernels.load_library()} if not args.library else {}
    for spec in args.library:
        name, _, path = spec.partition("=")
        libs[name] = kernels.bind(ctypes.CDLL(path), "foscar")
    rows = []
    for mode in args.modes.split(","):
        bits, km, vm = int(mode[0]), MODES[mode[1]], MODES[mode[2]]
        q, cache, lens = inputs(bits, km, vm, args.no_tail)
        for name, lib in libs.items():
            first, bad, seen = None, 0, []
            for r in range(args.launches):
                out = torch.full_like(q, float("nan"))
                foscar.decode(q, cache, out=out, library=lib)
                torch.cuda.synchronize()
                if first is None:
                    first = out.clone()
                    continue
                if not torch.equal(out, first):
                    bad += 1
                    for b, h in sorted({(b, h // RATIO) for b, h in (out != first).any(dim=-1).nonzero().tolist()}):
                        if len(seen) < 6:
                            seen.append(f"launch {r} seq {b} kv {h}: {nearest_partial(q, cache, lens, b, h, out)}")
            row = {"mode": mode, "library": name, "no_tail": args.no_tail, "launches": args.launches,
                   "differing": bad, "examples": seen}
            rows.append(row)
            print(f"{mode} {name}{' no tail' if args.no_tail else ''}: {bad} of {args.launches - 1} launches differ "
                  "from the first", flush=True)
            for line in seen:
                print("   ", line, flush=True)
    if args.json:
        args.json.write_text(json.dumps({"gpu": torch.cuda.get_device_name(), "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
