"""A CPU model of the Tensor Cores' fp32 accumulation, bit for bit (numpy, float64 inside).

One MMA instruction computes, for every output element, d = c + sum_k a_k b_k over its K
(16 for bf16/fp16 operands). The hardware does not round like IEEE fp32 arithmetic: each
product is exact, the addends are aligned to the largest exponent among them and cut to a
fixed number of bits (truncation: towards zero), the aligned values are summed exactly and
the sum is rounded once to fp32 (Fasi, Higham, Mikaitis and Pranesh, "Numerical behavior of
NVIDIA tensor cores", PeerJ CS 2021, describe this family on V100-A100). Which member the
H200 implements - how many bits past fp32's 24 the alignment keeps, which exponent a product
is aligned by, how the sum is rounded - was measured by scripts/probe_tc.py (H200_MMA below;
the recorded outputs are docs/data/probe_tc_h200.npz, and tests/foscar/test_tcmodel.py
replays them through the model bit for bit).

Why it matters here: an operand built by mantissa injection carries a large constant bias
(128 + c in bf16). A chain of MMAs over such operands accumulates a sum dominated by the
bias, and cutting every addend towards zero relative to that sum loses a part of the signal
that has one sign: it does not average out, so the relative error of decode attention grows
with the context (docs/PERFORMANCE.md, "v4 at long context").
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

ROUNDINGS = ("rz", "rne")
LEADS = ("operands", "product")
_NONE = -(1 << 40)  # the leading exponent of a zero: below every real one
_ZERO_LEAD32 = -(1 << 29)  # the same for int32 exponents; any sum of two stays inside int32


@dataclass(frozen=True)
class MmaModel:
    """One member of the family.

    extra_bits: bits kept past fp32's 24-bit significand, counted from the alignment point.
    lead: the exponent a product is aligned by: "operands" is e_a + e_b (the product's
        exponent before normalisation, so a product whose significands multiply to 2 or more,
        leading at e_a + e_b + 1, keeps one bit more), "product" its true leading exponent.
    rounding: how the exact sum of the cut addends becomes fp32 ("rz": towards zero,
        "rne": to nearest even).
    subnormal_lead: None, an operand's exponent is its leading bit's; n, an operand below 2^n
        (an fp16 subnormal, n = -14) counts as 2^n: its exponent field, not normalised. Only
        with lead="operands" (a product's own leading exponent knows no operand fields).
    The accumulator c is aligned together with the K products, by its own exponent.
    """

    extra_bits: int = 2
    lead: str = "operands"
    rounding: str = "rz"
    subnormal_lead: int | None = None

    def __post_init__(self) -> None:
        if self.rounding not in ROUNDINGS:
            raise ValueError(f"rounding={self.rounding!r}; expected one of {ROUNDINGS}")
        if self.lead not in LEADS:
            raise ValueError(f"lead={self.lead!r}; expected one of {LEADS}")
        if self.subnormal_lead is not None and self.lead != "operands":
            raise ValueError(f"subnormal_lead={self.subnormal_lead} with lead={self.lead!r}: an operand's exponent "
                             "field only enters the alignment with lead='operands'; pass subnormal_lead=None.")

    @property
    def name(self) -> str:
        sub = "" if self.subnormal_lead is None else f"-sub{self.subnormal_lead}"
        return f"e{self.extra_bits}-{self.lead}-{self.rounding}{sub}"

    def dot(self, c: np.ndarray, a: np.ndarray, b: np.ndarray, axis: int = -1) -> np.ndarray:
        """c [...] plus sum_k a[..., k] b[..., k] as one MMA computes it (values, float64).

        `axis`: where k lies in a and b (c has no such axis), the last by default. A caller whose
        broadcast a * b is long in some other axis puts k first there (precision._run_chains), so
        that numpy's inner loops run over that axis, not over 16 elements; every output element
        goes through the same operations either way (the cut addends are integers, so their sum
        is exact in any order), so the values are the same."""
        c = np.asarray(c, dtype=np.float64)
        products = a * b  # exact: 8x8 or 11x11 significand bits fit a double
        lead_p = None
        if self.lead == "operands" and products.dtype == np.float64:
            lead_p = self._operand_leads(a, b, axis)
        if lead_p is None:
            lead_p = self._max_lead(products, a, b, axis)
        e_max = np.maximum(lead_p, _lead(c))
        e_max = np.where(e_max == _NONE, 0, e_max)
        quantum = np.ldexp(1.0, e_max - 23 - self.extra_bits)
        cut = np.trunc(products / np.expand_dims(quantum, axis)).sum(axis=axis) + np.trunc(c / quantum)
        return round_f32(cut * quantum, self.rounding)

    def _operand_leads(self, a: np.ndarray, b: np.ndarray, axis: int) -> np.ndarray | None:
        """lead="operands": the largest e_a + e_b over k of the nonzero products (_NONE where
        there is none), summed from int32 exponents of a and b as they are, before they are
        broadcast; a zero operand carries _ZERO_LEAD32, far enough below any real exponent that
        every sum with it stays under _ZERO_LEAD32 / 2. That equals taking the products that are
        not zero as long as no product of nonzero operands underflows to zero, which needs
        exponents summing below -1074 (never so for bf16 or fp16 values) and no operand is
        infinite or NaN (0 times it is no zero product); where that could happen, or where a or b
        is all zeros, None (the caller masks the products themselves)."""
        nz_a, nz_b = np.asarray(a) != 0, np.asarray(b) != 0
        if not (nz_a.any() and nz_b.any() and np.isfinite(a).all() and np.isfinite(b).all()):
            return None
        la, lb = _lead(a), _lead(b)
        if int(la[nz_a].min()) + int(lb[nz_b].min()) < -1074:
            return None
        la = np.where(nz_a, self._aligned(la), _ZERO_LEAD32).astype(np.int32)
        lb = np.where(nz_b, self._aligned(lb), _ZERO_LEAD32).astype(np.int32)
        top = (la + lb).max(axis=axis)
        return np.where(top < _ZERO_LEAD32 // 2, _NONE, top.astype(np.int64))

    def _aligned(self, lead: np.ndarray) -> np.ndarray:
        """An operand's leading exponent as the Tensor Core aligns it: at least subnormal_lead."""
        return lead if self.subnormal_lead is None else np.maximum(lead, self.subnormal_lead)

    def _max_lead(self, products: np.ndarray, a: np.ndarray, b: np.ndarray, axis: int) -> np.ndarray:
        """The largest leading exponent over k of the nonzero products, as the model aligns them
        (_NONE where every product is zero): dot's general path."""
        if self.lead == "operands":
            return np.where(products != 0, self._aligned(_lead(a)) + self._aligned(_lead(b)), _NONE).max(axis=axis)
        return _lead(products).max(axis=axis)



def _lead(x: np.ndarray) -> np.ndarray:
    """Exponent of the leading bit of each value (int64); _NONE for zeros."""
    _, exp = np.frexp(x)  # x = m 2^exp with 0.5 <= |m| < 1
    return np.where(x != 0, exp.astype(np.int64) - 1, _NONE)


def round_f32(x: np.ndarray, rounding: str) -> np.ndarray:
    """float64 -> the nearest fp32 value (rne) or the fp32 value next towards zero (rz)."""
    x = np.asarray(x, dtype=np.float64)
    f = x.astype(np.float32)
    if rounding == "rz":
        over = np.abs(f.astype(np.float64)) > np.abs(x)
        f = np.where(over, np.nextafter(f, np.float32(0)), f)
    return f.astype(np.float64)


def operand_values(bits: np.ndarray, dtype: str) -> np.ndarray:
    """Raw 16-bit patterns (uint16) -> float64 values of a bf16 or fp16 operand."""
    bits = np.asarray(bits, dtype=np.uint16)
    if dtype == "bf16":
        return (bits.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    if dtype == "fp16":
        return bits.view(np.float16).astype(np.float64)
    raise ValueError(f"dtype={dtype!r}; expected 'bf16' or 'fp16'")


def operand_bits(values: np.ndarray, dtype: str) -> np.ndarray:
    """float values -> uint16 patterns, rounded to nearest (for making test operands)."""
    values = np.asarray(values, dtype=np.float64)
    if dtype == "fp16":
        return values.astype(np.float16).view(np.uint16)
    f = values.astype(np.float32).view(np.uint32)
    rounded = f + 0x7FFF + ((f >> 16) & 1)  # round to nearest even on the top 16 bits
    return (rounded >> 16).astype(np.uint16)


def mma(model: MmaModel, a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
    """D = A B + C for stacks of tiles: a [..., M, K], b [..., K, N], c [..., M, N] (values)."""
    return model.dot(c, a[..., :, None, :], np.swapaxes(b, -1, -2)[..., None, :, :])


def mma_chain(model: MmaModel, a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
    """The accumulator through a chain of MMAs: a [chains, steps, M, K], b [chains, steps, K, N]."""
    d = np.asarray(c, dtype=np.float64)
    for s in range(a.shape[1]):
        d = mma(model, a[:, s], b[:, s], d)
    return d


def candidates() -> list[MmaModel]:
    """The family members the probe's data is fitted against."""
    return [MmaModel(extra_bits=e, lead=lead, rounding=rnd, subnormal_lead=sub) for e in range(0, 7) for lead in LEADS
            for rnd in ROUNDINGS for sub in ((None, -14) if lead == "operands" else (None,))]


# What scripts/probe_tc.py measured on the H200 (docs/PERFORMANCE.md, "the Tensor Cores'
# arithmetic"); tests/foscar/test_tcmodel.py replays the recorded outputs through it.
# All K = 16 products and the accumulator aligned at once to the largest of (e_a + e_b) and
# c's exponent, 2 bits kept past fp32's 24, every addend cut towards zero, the sum cut
# towards zero: bit-exact on every recorded output of mma.sync.m16n8k16 and wgmma.m64n8k16
# (bf16 and fp16 operands, single instructions and chains of 8 in one commit group).
H200_MMA = MmaModel(extra_bits=2, lead="operands", rounding="rz")
# fp16 operands below 2^-14 (subnormals, the V operands since v23) are aligned by their exponent
# field, -14, not by their leading bit: a product of a subnormal is cut as if it were up to 2^10
# larger (scripts/probe_tc.py's `subnormal` family, bit-exact on mma.sync, wgmma and chains of
# 8). bf16's subnormals lie below 2^-126, where no operand of ours goes.
H200_MMA_FP16 = MmaModel(extra_bits=2, lead="operands", rounding="rz", subnormal_lead=-14)


def h200(dtype: str) -> MmaModel:
    """The H200's MMA for operands of `dtype` ('bf16' or 'fp16')."""
    if dtype not in ("bf16", "fp16"):
        raise ValueError(f"dtype={dtype!r}; expected 'bf16' or 'fp16'")
    return H200_MMA_FP16 if dtype == "fp16" else H200_MMA
