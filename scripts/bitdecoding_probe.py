"""Is BitDecoding's INT2 (and INT4) output its quantizer's, or is something lost between its
packer and its decoder? Three measurements, all through BitDecoding's own two calls
(kvcache_pack_int, fwd_kvcache_int) with the buffers of its own test:

1. error: at a decode shape, BitDecoding's output against float64 attention over the
   unquantized fp16 K/V, beside plain min-max quantization at the same group
   (baselines.bitdecoding.emulate_quant) against the same, and the two against each other;
2. layout: K and V that quantize exactly (one 1 per row, zeros elsewhere) read back through
   the kernel, so a code that lands on the wrong token or channel shows as a permutation;
3. values: random K and V read back through the kernel (V rows by one-hot attention, K
   columns by log-softmax), compared code by code with the emulated quantizer.

GPU only for the real library (scripts/h200_bitdecoding.sh builds it and runs this):
    python scripts/bitdecoding_probe.py --json out/bitdecoding_probe.json
The functions take the module and a device, so tests run them on the CPU against a stand-in.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from baselines.bitdecoding import emulate_quant  # noqa: E402
from foscar.reference import attention_f64  # noqa: E402

READ_LEN = 256  # one INT2 pack block (two INT4 ones): the readouts cover a whole block
SELECT_LOGIT = 30.0  # exp(-30) x 256 tokens is far below fp16: one token takes all the weight


def decode(bd: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bits: int, group: int,
           sm_scale: float) -> torch.Tensor:
    """BitDecoding's output [b, hq, d] for fp16 q [b, hq, d], k/v [b, s, hkv, d], packed and
    decoded exactly as its own test does."""
    b, s, hkv, d = k.shape
    pn = 16 // bits
    dev = k.device
    k_pack = torch.zeros(b, s // pn, hkv, d, dtype=torch.uint16, device=dev)
    k_params = torch.zeros(b, s // group, hkv, d, dtype=torch.float32, device=dev)
    v_pack = torch.zeros(b, s, hkv, d // pn, dtype=torch.uint16, device=dev)
    v_params = torch.zeros(b, d // group, hkv, s, dtype=torch.float32, device=dev)
    cu = torch.arange(0, (b + 1) * s, s, dtype=torch.int32, device=dev)
    bd.kvcache_pack_int(k.half().contiguous(), k_pack, k_params, v.half().contiguous(), v_pack, v_params,
                        None, cu, s, "k-channel", group, bits)
    out = bd.fwd_kvcache_int(q.half().unsqueeze(1).contiguous(), k_pack, k_params, v_pack, v_params,
                             None, sm_scale, "k-channel", group, bits)
    if isinstance(out, (tuple, list)):
        out = out[0]
    return out.reshape(b, q.shape[1], d).float()


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm())


# --- 1. error against unquantized attention ----------------------------------------------
def errors(bd, bits: int, group: int, heads: tuple[int, int], batch: int, kv_len: int, device, seed: int = 0) -> dict:
    hq, hkv = heads
    gen = torch.Generator(device=device).manual_seed(seed)
    q = torch.randn(batch, hq, 128, generator=gen, device=device).half()
    k = torch.randn(batch, kv_len, hkv, 128, generator=gen, device=device).half()
    v = torch.randn(batch, kv_len, hkv, 128, generator=gen, device=device).half()
    lens = torch.full((batch,), kv_len, device=device)
    sm = 1 / math.sqrt(128)
    exact = attention_f64(q, k, v, lens, sm)
    minmax = attention_f64(q, emulate_quant(k, bits, group, "token"), emulate_quant(v, bits, group, "channel"), lens, sm)
    out = decode(bd, q, k, v, bits, group, sm)
    return {"bitdecoding_vs_exact": rel(out, exact), "minmax_vs_exact": rel(minmax, exact),
            "bitdecoding_vs_minmax": rel(out, minmax)}


# --- 2 and 3. the cache read back through the kernel -------------------------------------
def read_v(bd, v: torch.Tensor, bits: int, group: int, hq: int) -> torch.Tensor:
    """V [L, hkv, d] as the kernel dequantizes it: sequence t's K is zero except a code at
    token t (channel 0) that its query selects, so its output is V's row t."""
    L, hkv, d = v.shape
    levels = (1 << bits) - 1
    k = torch.zeros(L, L, hkv, d, dtype=torch.float16, device=v.device)
    k[torch.arange(L), torch.arange(L), :, 0] = levels  # exact: codes 0 and `levels`, scale 1
    q = torch.zeros(L, hq, d, dtype=torch.float16, device=v.device)
    q[:, :, 0] = SELECT_LOGIT * math.sqrt(d) / levels
    out = decode(bd, q, k, v.unsqueeze(0).expand(L, L, hkv, d), bits, group, 1 / math.sqrt(d))
    return out.view(L, hkv, hq // hkv, d).mean(2)


def read_k(bd, k: torch.Tensor, bits: int, group: int, hq: int, logit_span: float = 0.5) -> torch.Tensor:
    """K [L, hkv, d] as the kernel dequantizes it, centred over tokens: sequence c queries
    channel c alone, V rows are one-hot by token (two passes of d tokens), so output
    channel t is softmax weight t, whose log is K[t, c] x scale up to a constant."""
    L, hkv, d = k.shape
    assert L <= 2 * d, "two passes of head_dim tokens each"
    sm = 1 / math.sqrt(d)
    beta = logit_span / sm
    q = torch.zeros(d, hq, d, dtype=torch.float16, device=k.device)
    q[torch.arange(d), :, torch.arange(d)] = beta
    logp = torch.empty(L, hkv, d, device=k.device)
    for half in range(-(-L // d)):
        lo, hi = half * d, min(L, (half + 1) * d)
        v = torch.zeros(L, hkv, d, dtype=torch.float16, device=k.device)
        v[torch.arange(lo, hi), :, torch.arange(hi - lo)] = 1.0  # exact: one 1 per row
        out = decode(bd, q, k.unsqueeze(0).expand(d, L, hkv, d), v.unsqueeze(0).expand(d, L, hkv, d), bits, group, sm)
        w = out.view(d, hkv, hq // hkv, d).mean(2)  # [channel c, hkv, token t - lo]
        logp[lo:hi] = torch.log(w[:, :, : hi - lo].clamp_min(1e-30)).permute(2, 1, 0)
    k_read = logp / logit_span
    return k_read - k_read.mean(0, keepdim=True)


def permutation(read: torch.Tensor) -> dict:
    """Where the single 1 of each row [L, hkv, d] of an identity-like tensor came back."""
    L, hkv, d = read.shape
    got = read.abs().argmax(-1)  # [L, hkv]
    want = (torch.arange(L, device=read.device) % d)[:, None].expand(L, hkv)
    wrong = (got != want)
    first = [(int(t), int(want[t, 0]), int(got[t, 0])) for t in range(L) if bool(wrong[t, 0])][:16]
    return {"rows": L * hkv, "misplaced": int(wrong.sum()), "first_misplaced (token, channel, came back at)": first}


def _identity(L: int, hkv: int, d: int, value: float, device) -> torch.Tensor:
    x = torch.zeros(L, hkv, d, dtype=torch.float16, device=device)
    x[torch.arange(L), :, torch.arange(L) % d] = value
    return x


def layout(bd, bits: int, group: int, heads: tuple[int, int], device, read_len: int = READ_LEN) -> dict:
    """Identity-like K and V (exact under any min-max grouping) read back. The K readout
    goes through V, so it is measured only when V reads back right."""
    hq, hkv = heads
    v = permutation(read_v(bd, _identity(read_len, hkv, 128, 1.0, device), bits, group, hq))
    if v["misplaced"]:
        return {"v": v, "k": {"channels": hkv * 128, "misplaced": None, "note": "not read: V does not read back right"}}
    levels = (1 << bits) - 1
    k_id = _identity(read_len, hkv, 128, float(levels), device)
    # token t holds channel t % d, so each channel's code sits at token c (and c + d)
    top = read_k(bd, k_id, bits, group, hq).argmax(0)  # [hkv, d]
    want = torch.arange(128, device=device)[None, :].expand(hkv, 128)
    k_wrong = ((top != want) & (top != want + 128)).sum()
    return {"v": v, "k": {"channels": hkv * 128, "misplaced": int(k_wrong)}}


def values(bd, bits: int, group: int, heads: tuple[int, int], device, seed: int = 1,
           read_len: int = READ_LEN) -> dict:
    """Random K and V read back and compared code by code with the emulated quantizer:
    the share of values within a tenth of a quantization step, and the worst, in steps."""
    hq, hkv = heads
    gen = torch.Generator(device=device).manual_seed(seed)
    k = torch.randn(read_len, hkv, 128, generator=gen, device=device).half()
    v = torch.randn(read_len, hkv, 128, generator=gen, device=device).half()
    levels = (1 << bits) - 1
    v_emul = emulate_quant(v.unsqueeze(0), bits, group, "channel")[0]
    v_step = v.float().view(read_len, hkv, -1, group)
    v_step = ((v_step.amax(-1) - v_step.amin(-1)) / levels).repeat_interleave(group, -1)
    v_err = (read_v(bd, v, bits, group, hq) - v_emul).abs() / v_step.clamp_min(1e-6)
    k_emul = emulate_quant(k.unsqueeze(0), bits, group, "token")[0]
    k_emul = k_emul - k_emul.mean(0, keepdim=True)
    k_step = k.float().view(-1, group, hkv, 128)
    k_step = ((k_step.amax(1) - k_step.amin(1)) / levels).repeat_interleave(group, 0)
    k_err = (read_k(bd, k, bits, group, hq) - k_emul).abs() / k_step.clamp_min(1e-6)
    return {
        "v_within_0.1_step": float((v_err <= 0.1).float().mean()), "v_worst_steps": float(v_err.max()),
        "k_within_0.1_step": float((k_err <= 0.1).float().mean()), "k_worst_steps": float(k_err.max()),
    }


def verdict(res: dict) -> str:
    """One sentence from the three measurements."""
    e, lay, val = res["errors"], res["layout"], res["values"]
    moved = lay["v"]["misplaced"] + (lay["k"]["misplaced"] or 0)
    if moved:
        return (f"codes land on the wrong token or channel ({lay['v']['misplaced']} V rows, {lay['k']['misplaced']} K "
                "channels): the packer and the decoder disagree on the layout, inside the library")
    if min(val["v_within_0.1_step"], val["k_within_0.1_step"]) < 0.99:
        return ("the layout holds but values differ from a min-max quantizer at this group "
                f"(V {100 * val['v_within_0.1_step']:.1f}%, K {100 * val['k_within_0.1_step']:.1f}% within a tenth "
                "of a step): read its quantizer again")
    if e["bitdecoding_vs_minmax"] <= 0.1 * e["minmax_vs_exact"]:
        return "BitDecoding computes its min-max quantizer's attention: its error is the quantization's"
    return "the cache reads back right but the attention output does not: the decode kernel loses accuracy"


def probe(bd, device, bits_list=(4, 2), groups=(128,), heads_list=((32, 8), (32, 32)), batch: int = 4,
          kv_len: int = 32768) -> list[dict]:
    results = []
    for bits in bits_list:
        for group in groups:
            for heads in heads_list:
                res = {"bits": bits, "group": group, "heads": list(heads), "batch": batch, "kv_len": kv_len}
                res["errors"] = errors(bd, bits, group, heads, batch, kv_len, device)
                res["layout"] = layout(bd, bits, group, heads, device)
                res["values"] = values(bd, bits, group, heads, device)
                res["verdict"] = verdict(res)
                results.append(res)
                print(json.dumps(res), flush=True)
    return results


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", type=Path, help="write every result here")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--kv-len", type=int, default=32768)
    ap.add_argument("--groups", default="128", help="comma list: 128, 32")
    args = ap.parse_args()
    import bit_decode

    results = probe(bit_decode, torch.device("cuda"), groups=tuple(int(g) for g in args.groups.split(",")),
                    batch=args.batch, kv_len=args.kv_len)
    for r in results:
        e = r["errors"]
        print(f"INT{r['bits']} g{r['group']} heads {r['heads'][0]}/{r['heads'][1]}: vs exact {e['bitdecoding_vs_exact']:.3g} "
              f"(min-max {e['minmax_vs_exact']:.3g}), vs min-max {e['bitdecoding_vs_minmax']:.3g}: {r['verdict']}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
