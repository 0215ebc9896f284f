"""The CPU model of the Tensor Cores' accumulation against outputs recorded on the H200."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from foscar import tcmodel

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))
import probe_tc  # noqa: E402

RECORDED = np.load(ROOT / "docs" / "data" / "probe_tc_h200.npz")
CASES = [c for c in probe_tc.cases() if f"{c[0]}__{c[1]}__{c[2]}" in RECORDED]


def _replay(model, case):
    instr, dtype, family, m, chain, n_inst, seed = case
    a, b, c = probe_tc.make_operands(family, dtype, m, n_inst, chain, seed)
    gpu = RECORDED[f"{instr}__{dtype}__{family}"].astype(np.float64)
    n = gpu.shape[0]  # the file keeps the first chains of each probe
    got = probe_tc.model_outputs(model, a[: n * chain], b[: n * chain], c[:n], dtype, chain)
    return got, gpu


def test_every_probe_is_recorded():
    assert len(CASES) == len(list(probe_tc.cases())) == 33


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}-{c[1]}-{c[2]}")
def test_h200_model_is_bit_exact(case):
    got, gpu = _replay(tcmodel.h200(case[1]), case)
    assert np.isfinite(gpu).all()
    mismatch = np.flatnonzero(got != gpu)
    assert mismatch.size == 0, f"{mismatch.size} of {gpu.size} outputs differ, first at {mismatch[:5]}"


@pytest.mark.parametrize("model", [tcmodel.MmaModel(3, "operands", "rz"), tcmodel.MmaModel(2, "product", "rz"),
                                   tcmodel.MmaModel(2, "operands", "rne"), tcmodel.MmaModel(3, "product", "rz"),
                                   tcmodel.MmaModel(2, "operands", "rz", subnormal_lead=-15)],
                         ids=lambda m: m.name)
def test_neighbouring_models_are_told_apart(model):
    """The recorded outputs pin the model down: each neighbour of it misses some of them."""
    missed = 0
    for case in CASES:
        got, gpu = _replay(model, case)
        missed += int((got != gpu).sum())
    assert missed > 0


def test_round_f32_towards_zero_and_nearest():
    x = np.array([1 + 2.0**-24 * 1.5, -(1 + 2.0**-24 * 1.5), 3.0])
    assert tcmodel.round_f32(x, "rz").tolist() == [1.0, -1.0, 3.0]
    assert tcmodel.round_f32(x, "rne").tolist() == [1 + 2.0**-23, -(1 + 2.0**-23), 3.0]


def test_small_addends_are_cut_at_the_alignment_of_the_largest():
    """1.0 + 16 products of 2^-26: each is below the 2^-25 quantum of the sum, so all vanish."""
    model = tcmodel.H200_MMA
    a = np.full((1, 16), 2.0**-13)
    b = np.full((1, 16), 2.0**-13)
    assert model.dot(np.array([1.0]), a, b)[0] == 1.0
    # The same products with no large addend are kept exactly.
    assert model.dot(np.array([0.0]), a, b)[0] == 16 * 2.0**-26


@pytest.mark.parametrize("model", [m for m in tcmodel.candidates() if m.lead == "operands"], ids=lambda m: m.name)
def test_operand_exponents_summed_before_broadcast_equal_masked_products(model, monkeypatch):
    """MmaModel.dot sums a's and b's int32 exponents (zeros far below any real one) instead of
    masking the broadcast products that are zero, and may take k off the last axis: the same
    values as the masked products on the last axis, on operands with zeros, fp16 subnormals and
    all-zero rows."""
    rng = np.random.default_rng(7)
    for dtype in ("bf16", "fp16"):
        def operand(shape):
            x = rng.standard_normal(shape) * 2.0 ** rng.integers(-30, 12, shape)
            x[rng.random(shape) < 0.25] = 0.0
            return tcmodel.operand_values(tcmodel.operand_bits(x, dtype), dtype)
        a, b = operand((6, 9, 1, 16)), operand((6, 1, 5, 16))
        a[:, 3] = 0.0
        b[2] = 0.0
        c = tcmodel.round_f32(rng.standard_normal((6, 9, 5)) * 2.0 ** rng.integers(-20, 20, (6, 9, 5)), "rne")
        c[rng.random(c.shape) < 0.3] = 0.0
        fast = model.dot(c, a, b)
        k_first = model.dot(c, np.moveaxis(a, -1, 1), np.moveaxis(b, -1, 1), axis=1)
        with monkeypatch.context() as m:
            m.setattr(tcmodel.MmaModel, "_operand_leads", lambda *args: None)
            masked = model.dot(c, a, b)
        assert np.array_equal(fast, masked) and np.array_equal(k_first, masked), dtype


def test_operand_bits_round_trip():
    values = np.array([1.0, -2.5, 128.0 + 7, 3e-5, 0.0])
    for dtype in ("bf16", "fp16"):
        back = tcmodel.operand_values(tcmodel.operand_bits(values, dtype), dtype)
        assert np.allclose(back, values, rtol=2**-7, atol=1e-7)


def test_fp16_subnormals_are_aligned_by_their_exponent_field():
    """A subnormal fp16 operand counts as 2^-14 when the products are aligned (the V operands
    since v23): the normalised model keeps bits that the H200 cuts."""
    fp16 = [c for c in CASES if c[2] == "subnormal"]
    assert len(fp16) == 3
    for case in fp16:
        normalised, gpu = _replay(tcmodel.H200_MMA, case)
        assert (normalised != gpu).mean() > 0.5
    assert tcmodel.h200("fp16").subnormal_lead == -14 and tcmodel.h200("bf16").subnormal_lead is None
