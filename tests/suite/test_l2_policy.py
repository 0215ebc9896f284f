"""The sweep's L2 policy per shape (suite.runner.plan_l2) with the real backends' byte
models, on the CPU: every backend of a shape rotates or every one flushes, whatever else the
sweep holds; the bundled grid's changes against the per-backend rule of records made before."""
from __future__ import annotations

import pytest

from baselines.base import all_backends, get_backend
from core.case import Case
from suite import timing
from suite.runner import MAX_ROTATE_COPIES, MAX_ROTATE_COPIES_SHAPE, l2_reference_bytes, plan_l2

H200_L2 = 60 << 20  # as torch reports it
L2_50MB = 50 * 10**6
GRID = ("foscar-int4", "foscar-int2", "flashinfer-bf16-tc", "trtllm-xqa-fp8")


def _backend_cases(batch: int, kv_len: int, names=GRID):
    """(backend, its case, its bytes) for every named backend that pairs with the shape."""
    out = []
    for name in names:
        backend = get_backend(name)
        for bits in (4, 2):
            case = backend.case_for(Case(batch=batch, kv_len=kv_len, bits=bits))
            if case is not None and all(c != case for _, c, _ in out):
                out.append((backend, case, backend.traffic(case).total))
    return out


def _kind(plan: timing.L2Plan) -> str:
    return "flush" if plan.policy == "flush" else "rotate"


def test_the_reference_is_the_shapes_bf16_cache_from_the_byte_model():
    case = Case(batch=1, kv_len=4096)
    assert l2_reference_bytes(case) == 2 * 4096 * 8 * 128 * 2 == 16_777_216
    assert l2_reference_bytes(case) == get_backend("flashinfer-bf16-tc").traffic(
        get_backend("flashinfer-bf16-tc").case_for(case)).kv_total
    # the format's axes, the page size and the seed do not enter it: one reference per shape
    for other in (case.with_(bits=2), case.with_(k_mode="token", group_size=64), case.with_(page_size=128),
                  case.with_(seed=3), case.with_(num_q_heads=64, model="llama3-70b")):
        assert l2_reference_bytes(other) == l2_reference_bytes(case)


def test_batch1_4k_rotates_for_every_backend_and_128_tokens_flushes():
    rows = _backend_cases(1, 4096)
    assert {b.name for b, _, _ in rows} == set(GRID)
    for backend, case, nbytes in rows:
        plan = plan_l2(case, nbytes, L2_50MB)
        assert plan.rule == timing.RULE_SHAPE_ROTATES and plan.policy.startswith("rotate:"), (backend.name, plan)
        assert "(shape rotates: its BF16 cache of 16.8 MB needs 12 copies)" in plan.detail
    int4 = next(plan_l2(c, n, L2_50MB) for b, c, n in rows if b.name == "foscar-int4")
    assert int4.policy == "rotate:45" and int4.copies == 45  # the per-backend rule flushed it (45 > 32)
    for backend, case, nbytes in _backend_cases(1, 128):
        plan = plan_l2(case, nbytes, L2_50MB)
        assert (plan.policy, plan.rule) == ("flush", timing.RULE_SHAPE_FLUSHES), backend.name
        assert plan.detail.startswith("flush (shape flushes: its BF16 cache of 0.5 MB would need 382 copies, over 32)")


@pytest.mark.parametrize("l2", [H200_L2, L2_50MB, None])
def test_every_backend_of_a_shape_gets_the_same_policy(l2):
    shapes = [(b, kv) for b in (1, 2, 8, 32, 128) for kv in (128, 512, 1024, 2048, 4096, 8192, 16384, 131072)]
    for batch, kv_len in shapes:
        rows = _backend_cases(batch, kv_len, [b.name for b in all_backends()])
        plans = [plan_l2(c, n, l2) for _, c, n in rows]
        assert len({_kind(p) for p in plans}) == 1, (batch, kv_len, [(b.name, p.policy) for (b, _, _), p in zip(rows, plans)])
        assert len({p.rule for p in plans}) == 1
        # none of these formats needs more copies than the cap where the BF16 cache rotates
        assert all(p.rule != timing.RULE_OVER_CAP for p in plans)
        # a backend's plan is its own bytes and the shape's, nothing else the sweep holds
        for (_, case, nbytes), plan in zip(rows, plans):
            assert plan == plan_l2(case, nbytes, l2)


def test_a_backend_over_the_cap_flushes_and_the_others_still_rotate():
    case = Case(batch=1, kv_len=4096)
    tiny = plan_l2(case, 100_000, H200_L2)  # a format of 100 KB on a 16.8 MB BF16 shape: 2517 copies
    assert (tiny.policy, tiny.rule) == ("flush", timing.RULE_OVER_CAP)
    assert f"over the cap of {MAX_ROTATE_COPIES_SHAPE}: flushed instead" in tiny.detail
    assert plan_l2(case, 4472964, H200_L2).policy == "rotate:57"


def test_the_cap_covers_int2_wherever_the_bf16_cache_rotates():
    """The smallest format timed, INT2 at g128, on the smallest shape that rotates."""
    bf16_per_token = 2 * 8 * 128 * 2
    smallest = -(-4 * H200_L2 // MAX_ROTATE_COPIES // bf16_per_token)  # tokens of a batch-1 shape needing 32 copies
    case = get_backend("foscar-int2").case_for(Case(batch=1, kv_len=smallest, bits=2))
    plan = plan_l2(case, get_backend("foscar-int2").traffic(case).total, H200_L2)
    assert plan.rule == timing.RULE_SHAPE_ROTATES and MAX_ROTATE_COPIES < plan.copies <= MAX_ROTATE_COPIES_SHAPE


def test_the_bundled_grid_changes_only_batch1_4k_for_our_kernels():
    """Batch {1, 8, 32, 128} x KV {4K, 16K, 32K, 128K}, Llama-3-8B heads, on an H200's L2: only
    INT4 and INT2 at batch 1 / 4K move, from a flush to rotation (57 and 106 copies, as the
    bundled records of grid-h200-521101d would have needed)."""
    changed = {}
    for batch in (1, 8, 32, 128):
        for kv_len in (4096, 16384, 32768, 131072):
            for backend, case, nbytes in _backend_cases(batch, kv_len):
                old = timing.l2_plan(nbytes, H200_L2, MAX_ROTATE_COPIES).policy
                new = plan_l2(case, nbytes, H200_L2).policy
                if old != new:
                    changed[(batch, kv_len, backend.name)] = (old, new)
    assert changed == {(1, 4096, "foscar-int4"): ("flush", "rotate:57"),
                       (1, 4096, "foscar-int2"): ("flush", "rotate:106")}
