"""Measure the Tensor Cores' arithmetic and fit foscar/tcmodel.py to it.

On the GPU box (builds scripts/probe_tc.cu with nvcc, runs every probe, writes the outputs):
    PYTHONPATH=. python3 scripts/probe_tc.py run --out $OUT/probe_tc.npz
On any machine (replays the recorded outputs through every candidate model):
    PYTHONPATH=. python3 scripts/probe_tc.py fit docs/data/probe_tc_h200.npz

Operands are made here from a seed (numpy), so the file holds only the seeds and the GPU's
outputs. Families of operands: `wide` (random signs and exponents), `sensitive` (products
spread over ~60 binades, so the alignment cut shows), `cancel` (the accumulator cancels the
products: the rounding of a small result shows), `biased` (the kernels' case: injected codes
128 + f c or 1024 + f c against positive probabilities, a large positive accumulator),
`centred` (codes f (c - mid), signed) and, fp16 only, `subnormal` (the kernels' V operands since
v23: the fp16 patterns f c, worth f c 2^-24, against positive probabilities spread over 24
binades, from a zero accumulator as the kernels' one-k-step products).
Instructions: mma.sync.m16n8k16, wgmma.m64n8k16 (A in registers, B in shared memory through
the kernels' own descriptor), and chains of 8 wgmma into one accumulator in one commit group.
"""
from __future__ import annotations

import argparse
import ctypes
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from foscar import tcmodel  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
FAMILIES = ("wide", "sensitive", "cancel", "biased", "centred", "subnormal")
DTYPES = ("bf16", "fp16")
# instruction -> (rows M, instructions per chain, instances)
INSTRUCTIONS = {"mma_sync": (16, 1, 1024), "wgmma": (64, 1, 256), "wgmma_chain8": (64, 8, 256 * 8)}


def make_operands(family: str, dtype: str, m: int, n_inst: int, chain: int, seed: int):
    """A [n_inst, m, 16], B [n_inst, 16, 8] as uint16 bits; C [n_inst // chain, m, 8] fp32 values."""
    rng = np.random.default_rng(seed)
    sign = lambda shape: rng.choice([-1.0, 1.0], size=shape)  # noqa: E731
    mant = lambda shape: rng.uniform(1.0, 2.0, size=shape)  # noqa: E731
    a_shape, b_shape, c_shape = (n_inst, m, 16), (n_inst, 16, 8), (n_inst // chain, m, 8)
    big = 14 if dtype == "fp16" else 30
    if family == "wide":
        a = sign(a_shape) * mant(a_shape) * 2.0 ** rng.integers(-8, 8, a_shape)
        b = sign(b_shape) * mant(b_shape) * 2.0 ** rng.integers(-8, 8, b_shape)
        c = sign(c_shape) * mant(c_shape) * 2.0 ** rng.integers(-8, 12, c_shape) * (rng.random(c_shape) > 0.2)
    elif family == "sensitive":
        a = sign(a_shape) * mant(a_shape) * 2.0 ** rng.integers(-big // 2, big // 2, a_shape)
        b = sign(b_shape) * mant(b_shape) * 2.0 ** rng.integers(-big // 2, big // 2, b_shape)
        c = sign(c_shape) * mant(c_shape) * 2.0 ** rng.integers(-big, big, c_shape) * (rng.random(c_shape) > 0.1)
    elif family == "cancel":
        a = sign(a_shape) * mant(a_shape) * 2.0 ** rng.integers(-4, 4, a_shape)
        b = sign(b_shape) * mant(b_shape) * 2.0 ** rng.integers(-4, 4, b_shape)
        c = None  # set below from the exact products
    elif family in ("biased", "centred"):
        bias, f_max, top = (128.0, 16, 3) if dtype == "bf16" else (1024.0, 256, 3)
        codes = rng.integers(0, top + 1, a_shape).astype(np.float64)
        f = 2.0 ** rng.integers(0, int(np.log2(f_max)) + 1, (n_inst, m, 1))
        wide4 = rng.random((n_inst, m, 1)) < 0.5  # half the rows: INT4 codes at factor 1
        codes = np.where(wide4, rng.integers(0, 16, a_shape), codes)
        f = np.where(wide4, 1.0, f)
        a = bias + f * codes if family == "biased" else f * (codes - np.where(wide4, 7.5, 1.5))
        b = rng.uniform(0.001, 1.0, b_shape) * 2.0 ** rng.integers(-6, 3, (n_inst, 1, 8))
        if family == "centred":
            b = b * sign(b_shape)
        c = None
    elif family == "subnormal":
        wide4 = rng.random((n_inst, m, 1)) < 0.5  # half the rows INT4 (f 1 or 16), half INT2 (f 1 to 256)
        codes = np.where(wide4, rng.integers(0, 16, a_shape), rng.integers(0, 4, a_shape)).astype(np.float64)
        f = np.where(wide4, 2.0 ** (4 * rng.integers(0, 2, (n_inst, m, 1))),
                     2.0 ** (2 * rng.integers(0, 5, (n_inst, m, 1))))
        a = f * codes * 2.0**-24
        b = rng.uniform(0.5, 1.0, b_shape) * 2.0 ** rng.integers(-24, 0, b_shape)
        c = np.zeros(c_shape)
    else:
        raise ValueError(family)
    a_bits = tcmodel.operand_bits(a, dtype)
    b_bits = tcmodel.operand_bits(b, dtype)
    if c is None:
        av, bv = tcmodel.operand_values(a_bits, dtype), tcmodel.operand_values(b_bits, dtype)
        exact = (av @ bv).reshape(n_inst // chain, chain, m, 8).sum(axis=1)
        if family == "cancel":
            c = -exact * (1.0 + rng.uniform(-2.0**-10, 2.0**-10, c_shape))
        elif family == "biased":  # the running sum of a chain of such steps: up to 40 of them
            c = exact * rng.uniform(0.0, 40.0, (n_inst // chain, 1, 8))
        else:
            c = exact * rng.uniform(-8.0, 8.0, c_shape)
    c = np.asarray(c, dtype=np.float32)
    return a_bits, b_bits, c


def cases():
    seed = 0
    for instr, (m, chain, n_inst) in INSTRUCTIONS.items():
        for dtype in DTYPES:
            for family in FAMILIES:
                if family == "subnormal":  # seeds of their own: the recorded probes keep theirs
                    if dtype == "fp16":
                        yield instr, dtype, family, m, chain, n_inst, 2000 + list(INSTRUCTIONS).index(instr)
                    continue
                seed += 1
                yield instr, dtype, family, m, chain, n_inst, 1000 + seed


def model_outputs(model: tcmodel.MmaModel, a_bits, b_bits, c, dtype: str, chain: int) -> np.ndarray:
    av, bv = tcmodel.operand_values(a_bits, dtype), tcmodel.operand_values(b_bits, dtype)
    n = av.shape[0] // chain
    av = av.reshape(n, chain, *av.shape[1:])
    bv = bv.reshape(n, chain, *bv.shape[1:])
    return tcmodel.mma_chain(model, av, bv, c.astype(np.float64))


def build_probe(workdir: Path) -> ctypes.CDLL:
    so = workdir / "probe_tc.so"
    cmd = ["nvcc", "-gencode=arch=compute_90a,code=sm_90a", "-O2", "-std=c++17", "-shared", "-Xcompiler", "-fPIC",
           "-I", str(ROOT / "foscar" / "csrc"), str(ROOT / "scripts" / "probe_tc.cu"), "-o", str(so)]
    subprocess.run(cmd, check=True)
    lib = ctypes.CDLL(str(so))
    ptr, i = ctypes.c_void_p, ctypes.c_int
    lib.probe_mma_sync.argtypes = [ptr, ptr, ptr, ptr, i, i]
    lib.probe_wgmma.argtypes = [ptr, ptr, ptr, ptr, i, i, i]
    lib.probe_last_error.restype = ctypes.c_char_p
    return lib


def run(out: Path) -> None:
    import torch

    lib = build_probe(Path(tempfile.mkdtemp()))
    results = {}
    for instr, dtype, family, m, chain, n_inst, seed in cases():
        a, b, c = make_operands(family, dtype, m, n_inst, chain, seed)
        ta = torch.from_numpy(a.view(np.int16)).cuda()
        tb = torch.from_numpy(b.view(np.int16)).cuda()
        tc = torch.from_numpy(c).cuda()
        td = torch.full_like(tc, float("nan"))
        f16 = int(dtype == "fp16")
        if instr == "mma_sync":
            rc = lib.probe_mma_sync(ta.data_ptr(), tb.data_ptr(), tc.data_ptr(), td.data_ptr(), n_inst, f16)
        else:
            rc = lib.probe_wgmma(ta.data_ptr(), tb.data_ptr(), tc.data_ptr(), td.data_ptr(), n_inst, f16, chain)
        if rc:
            raise SystemExit(f"probe {instr}/{dtype}/{family} failed: {lib.probe_last_error().decode()}")
        d = td.cpu().numpy()
        results[f"{instr}/{dtype}/{family}"] = d
        # Layout check: against the exact float64 result, a wrong fragment or descriptor layout
        # shows as an O(1) error, rounding as ~1e-7.
        exact = model_outputs(tcmodel.MmaModel(extra_bits=40, lead="product", rounding="rne"), a, b, c, dtype, chain)
        scale = np.abs(exact).max() + 1e-30
        h200 = model_outputs(tcmodel.h200(dtype), a, b, c, dtype, chain)
        print(f"{instr:13s} {dtype} {family:9s} max |gpu - exact| / max|exact| = {np.abs(d - exact).max() / scale:.2e}, "
              f"outputs unlike the H200 model {(h200 != d).mean():.2%}, relative error per output (median, max) "
              f"{np.median(np.abs(d - exact) / (np.abs(exact) + 1e-300)):.1e}, {(np.abs(d - exact) / (np.abs(exact) + 1e-300)).max():.1e}")
    meta = np.array([f"{k}|{seed}" for k, *_, seed in
                     [(f'{i}/{d}/{f}', m, ch, n, s) for i, d, f, m, ch, n, s in cases()]])
    np.savez_compressed(out, meta=meta, **{k.replace("/", "__"): v for k, v in results.items()})
    print(f"wrote {out}")


def fit(path: Path, limit: int | None = None) -> dict[str, tcmodel.MmaModel | None]:
    """Mismatch rate of every candidate model on every recorded probe; prints the best."""
    data = np.load(path)
    best = {}
    for instr, dtype, family, m, chain, n_inst, seed in cases():
        key = f"{instr}__{dtype}__{family}"
        if key not in data:
            continue
        a, b, c = make_operands(family, dtype, m, n_inst, chain, seed)
        d = data[key].astype(np.float64)
        if limit:  # the first `limit` chains only
            n = min(limit, c.shape[0])
            a, b, c, d = a[: n * chain], b[: n * chain], c[:n], d[:n]
        rows = []
        for model in tcmodel.candidates():
            got = model_outputs(model, a, b, c, dtype, chain)
            rows.append(((got != d).mean(), model))
        rows.sort(key=lambda r: r[0])
        best[key] = rows[0][1] if rows[0][0] == 0 else None
        top = ", ".join(f"{mm.name} {rate:.2%}" for rate, mm in rows[:3])
        print(f"{key:36s} best: {top}")
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="run the probes on the GPU and fit")
    r.add_argument("--out", type=Path, required=True)
    f = sub.add_parser("fit", help="fit the candidate models to recorded outputs")
    f.add_argument("path", type=Path)
    f.add_argument("--limit", type=int, default=None, help="use the first N chains of each probe")
    args = ap.parse_args()
    if args.cmd == "run":
        run(args.out)
    else:
        fit(args.path, args.limit)


if __name__ == "__main__":
    main()
