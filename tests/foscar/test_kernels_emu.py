"""The CUDA kernels' own source on the CPU (foscar.emu) against the float64 reference over the
same dequantized cache: the GPU tests' cases, sized for a CPU, on every commit.

Shapes are drawn at random from a generator seeded by each test's id, so every run draws
the same ones (each case's seed is in its failure message); outputs are poisoned before each
launch, so an element never written fails. Without a host C++ compiler the file skips; with
one, a failed build of the emulator fails every test here.
"""
from __future__ import annotations

import ctypes
import os
import random
import zlib
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

import foscar
from foscar import emu, kernels
from foscar.build import BuildError
from foscar.config import QuantConfig
from foscar.reference import attention_f64
from foscar.testcases import case_inputs

TOLERANCE = 4e-3  # relative L2 vs float64 over the same dequantized cache: bf16 rounding level
MODES = [("token", "token"), ("token", "channel"), ("channel", "token"), ("channel", "channel")]
RNG = random.Random(0)


# The lab's knob sets test_build_knobs_compute_the_same_function builds the emulator with. The
# tests that load them run groups of 128 alone, so those builds hold that size alone
# (FOSCAR_ONLY_GROUP, about 40 % less compile each) but the last, whose CTA counts
# test_ctas_per_sm_are_the_knobs_where_the_kernel_fits reads at groups of 32 too.
G128 = "-DFOSCAR_ONLY_GROUP=128"
KNOBS = [
    ("-DFOSCAR_STAGES_INT4=2", "-DFOSCAR_STAGES_INT2=2", G128),
    ("-DFOSCAR_CTAS_INT4=2", "-DFOSCAR_CTAS_INT2=2", "-DFOSCAR_STAGES_INT4=6", G128),
    ("-DFOSCAR_PAIR_HEADS=0", G128),  # one KV head per item at every ratio (the lab's baseline)
    ("-DFOSCAR_PV_SPLIT=1", G128),  # a paired trip's V slices split 1 / 3 between its two S groups
    # 2 CTAs per SM with an 8-stage paired ring
    ("-DFOSCAR_CTAS_INT4=2", "-DFOSCAR_CTAS_INT2=2", "-DFOSCAR_PAIR_STAGES_INT4=8", "-DFOSCAR_PAIR_STAGES_INT2=8", G128),
    # 4 CTAs per SM with 4 paired INT4 stages: the kernels whose shared memory holds fewer keep 3
    ("-DFOSCAR_CTAS_INT4=4", "-DFOSCAR_PAIR_STAGES_INT4=4", "-DFOSCAR_CTAS_INT2=4"),
]
TIMELINE = ("-DFOSCAR_TIMELINE=1", G128)
COOP = ("-DFOSCAR_COOP_MERGE=1", G128)
# Every build this file loads but the default, each for a case or two: g++ -O0 (it compiles in
# about 40 % of -O1's time).
LAB_BUILDS = [*KNOBS, TIMELINE, COOP]
LAB_OPT = 0


def _build_quietly(defines):
    try:
        emu.build(defines, opt_level=LAB_OPT)
    except BuildError:
        pass  # the test that loads this build reports it


@pytest.fixture(scope="module", autouse=True)
def _emulator():
    try:
        emu.find_cxx()
    except BuildError as exc:
        pytest.skip(f"no host C++ compiler to build the emulator: {exc}")
    # After a kernel change every build here is compiled anew (g++ -O1, about 40 s each on the CI
    # box, one process each): the knob builds go up front, one per core at a time, instead of
    # one after another as the tests reach them. A failed knob build fails its own test.
    with ThreadPoolExecutor(max_workers=max(1, os.cpu_count() or 1)) as pool:
        default = pool.submit(emu.build)
        list(pool.map(_build_quietly, LAB_BUILDS))
    default.result()
    emu.load()  # anything else that stops the build is a failure, not a skip


@pytest.fixture(autouse=True)
def _seeded_shapes(request):
    RNG.seed(zlib.crc32(request.node.nodeid.encode()))


def _case(bits, group, k_mode, v_mode, *, batch=None, ratio=None, max_len=None, seed=None):
    seed = RNG.randrange(1 << 30) if seed is None else seed
    rng = random.Random(seed)
    batch = batch or rng.choice([1, 2, 3])
    ratio = ratio or rng.choice([1, 4, 8])
    num_kv_heads = rng.choice([1, 2])
    page = rng.choice([p for p in (64, 128, 256) if p % group == 0])
    # Lengths that are not multiples of the group or page size, unequal within the batch.
    lens = [rng.randrange(1, max_len or 2 * page + group + 37) for _ in range(batch)]
    config = QuantConfig(bits=bits, group_size=group, k_mode=k_mode, v_mode=v_mode, page_size=page)
    return seed, config, lens, num_kv_heads, ratio


def _data(config, lens, num_kv_heads, ratio, seed):
    return case_inputs(config, lens, num_kv_heads, ratio, seed)


def _error(q, cache, lens, **kwargs):
    out = torch.full_like(q, float("nan"))  # poison: an element never written fails
    emu.decode(q, cache, out=out, **kwargs)
    assert torch.isfinite(out).all(), "some output elements were never written (or are NaN)"
    kd, vd = foscar.dequantize(cache, dtype=torch.float64)
    ref = attention_f64(q, kd, vd, lens)
    return ((out.double() - ref).norm() / ref.norm()).item()


@pytest.mark.parametrize("bits", [4, 2])
@pytest.mark.parametrize("group", [32, 64, 128])
@pytest.mark.parametrize("k_mode,v_mode", MODES)
def test_fold_matches_reference(bits, group, k_mode, v_mode):
    seed, config, lens, hkv, ratio = _case(bits, group, k_mode, v_mode)
    q, cache = _data(config, lens, hkv, ratio, seed)
    err = _error(q, cache, lens)
    assert err <= TOLERANCE, f"seed={seed} lens={lens} hkv={hkv} ratio={ratio} page={config.page_size}: {err:.2e}"


@pytest.mark.parametrize("bits", [4, 2])
@pytest.mark.parametrize("k_mode,v_mode", MODES)
def test_forced_splits_and_many_sequences(bits, k_mode, v_mode):
    # Many sequences over few persistent CTAs, every split count the merge must combine.
    seed, config, lens, hkv, ratio = _case(bits, 128, k_mode, v_mode, batch=9, ratio=4, max_len=700)
    q, cache = _data(config, lens, hkv, ratio, seed)
    for splits in (1, 2, 3):
        err = _error(q, cache, lens, num_splits=splits)
        assert err <= TOLERANCE, f"seed={seed} lens={lens} splits={splits}: {err:.2e}"


@pytest.mark.parametrize("bits", [4, 2])
@pytest.mark.parametrize("group", [32, 128])
@pytest.mark.parametrize("k_mode,v_mode", MODES)
def test_one_sm_runs_many_items_per_cta(bits, group, k_mode, v_mode):
    # Every CTA runs many items in turn (num_sms=1), some splits holding no token: what a CTA
    # carries from item to item (the ring's cursors, the K side's state) must line up in every
    # mode.
    seed, config, lens, hkv, ratio = _case(bits, group, k_mode, v_mode, batch=3, ratio=4, max_len=600)
    q, cache = _data(config, lens, hkv, ratio, seed)
    for splits in (1, 5):
        err = _error(q, cache, lens, num_splits=splits, num_sms=1)
        assert err <= TOLERANCE, f"seed={seed} lens={lens} hkv={hkv} splits={splits}: {err:.2e}"


@pytest.mark.parametrize("bits", [4, 2])
@pytest.mark.parametrize("v_mode", ["token", "channel"])
@pytest.mark.parametrize("heads", [1, 2])
def test_ctas_whose_first_items_hold_no_chunk(bits, v_mode, heads):
    # The first sequences are shorter than a group: their items hold no packed chunk (only the
    # BF16 tail), so each CTA's first chunk is a later item's. What the CTA loads for its first
    # item ahead of the item's length (the early page) must not stand in for that later item's
    # page; shuffled pages tell them apart.
    seed = RNG.randrange(1 << 30)
    config = QuantConfig(bits=bits, group_size=128, k_mode="channel", v_mode=v_mode, page_size=128)
    lens = [70, 100, 90, 600, 450, 300]
    q, cache = _data(config, lens, 2, 4, seed)
    err = _error(q, cache, lens, num_splits=1, num_sms=1, kv_heads_per_item=heads)
    assert err <= TOLERANCE, f"seed={seed} lens={lens}: {err:.2e}"


def test_many_splits_leave_merge_remainders():
    # The split merge loads 8 splits per step (the one-head kernels: float4, a warp per column,
    # two columns a warp at 8 columns; the paired ones: 4 splits of 8 columns): 13 and 17 splits
    # leave a remainder in each, and most splits of the shorter sequence hold no token. 102
    # packed chunks split into exactly 13 (of 8) and 17 (of 6).
    for bits, ratio, heads in ((4, 4, 1), (2, 8, 1), (2, 4, 2)):
        seed, config, _, _, _ = _case(bits, 128, "channel", "token", batch=2, ratio=ratio)
        lens = [102 * 64 + 70, 700]
        q, cache = _data(config, lens, 2, ratio, seed)
        for splits in (3, 13, 17):
            plan = kernels.resolve_plan(cache, q.shape[1], variant="fold", num_splits=splits, num_sms=132,
                                        ctas_per_sm=3)[1]
            assert plan.num_splits == splits, plan
            err = _error(q, cache, lens, num_splits=splits, kv_heads_per_item=heads)
            assert err <= TOLERANCE, f"seed={seed} bits={bits} heads={heads} splits={splits}: {err:.2e}"


def _check_one_and_planned_splits(bits, k_mode, v_mode, seed, q, k, v, lens, **kwargs):
    """Long sequences (float keys and values), group 128: one split, then the plan's."""
    config = QuantConfig(bits=bits, group_size=128, k_mode=k_mode, v_mode=v_mode, page_size=128)
    cache = foscar.quantize(k.to(torch.bfloat16), v.to(torch.bfloat16), lens, config, shuffle_pages=True, seed=seed)
    for splits in (1, None):
        err = _error(q, cache, lens, num_splits=splits, **kwargs)
        assert err <= TOLERANCE, f"seed={seed} splits={splits}: {err:.2e}"


@pytest.mark.parametrize("bits", [4, 2])
@pytest.mark.parametrize("k_mode,v_mode", MODES)
@pytest.mark.parametrize("ratio", [2, 4])
def test_paired_heads_match_reference(bits, k_mode, v_mode, ratio):
    # At 2 or 4 query heads per KV head an item holds two KV heads (kv_heads_per_item): their
    # queries share S's columns, their V products one accumulator. Four KV heads (two pairs),
    # several sequences with tails, the plan's splits and forced ones.
    assert emu.load().foscar_emu_kv_heads_per_item(4 * ratio, 4) == 2
    group = RNG.choice([32, 64, 128])
    seed, config, lens, _, _ = _case(bits, group, k_mode, v_mode, batch=2, ratio=ratio)
    q, cache = _data(config, lens, 4, ratio, seed)
    for splits in (None, 3):
        err = _error(q, cache, lens, num_splits=splits, kv_heads_per_item=2)
        assert err <= TOLERANCE, f"seed={seed} G={group} lens={lens} splits={splits}: {err:.2e}"


@pytest.mark.parametrize("bits", [4, 2])
@pytest.mark.parametrize("k_mode,v_mode", [("channel", "token"), ("token", "channel")])
def test_paired_heads_keep_their_own_maxima(bits, k_mode, v_mode):
    # The two heads of an item share each warp's vote on a new maximum: the second head's keys
    # grow along the sequence (its maximum rises chunk after chunk) while the first head's stay
    # flat and 8x larger, so a rescale of one head's columns must leave the other's alone.
    seed = RNG.randrange(1 << 30)
    gen = torch.Generator().manual_seed(seed)
    k = torch.randn(2, 3000, 2, 128, generator=gen)
    k[:, :, 0] *= 8.0
    k[:, :, 1] *= torch.linspace(0.25, 3.0, 3000)[None, :, None]
    v = torch.randn(2, 3000, 2, 128, generator=gen)
    v[:, :, 1] += 3.0  # distinct heads: a swap of the V blocks would show
    q = torch.randn(2, 8, 128, generator=gen).to(torch.bfloat16)
    _check_one_and_planned_splits(bits, k_mode, v_mode, seed, q, k, v, [3000, 900], kv_heads_per_item=2)


@pytest.mark.parametrize("bits", [4, 2])
@pytest.mark.parametrize("k_mode,v_mode", [("channel", "token"), ("token", "channel")])
def test_long_context_flushes_and_late_maxima(bits, k_mode, v_mode):
    # One split over 5000 tokens: the consumer runs past several folds of its accumulator into
    # the output, and keys that grow along the sequence keep raising the running maximum (past
    # the lazy threshold) after them.
    seed = RNG.randrange(1 << 30)
    gen = torch.Generator().manual_seed(seed)
    k = torch.randn(2, 5000, 1, 128, generator=gen) * torch.linspace(0.5, 2.0, 5000)[None, :, None, None]
    v = torch.randn(2, 5000, 1, 128, generator=gen)
    q = torch.randn(2, 4, 128, generator=gen).to(torch.bfloat16)
    _check_one_and_planned_splits(bits, k_mode, v_mode, seed, q, k, v, [5000, 1500])


@pytest.mark.parametrize("bits", [4, 2])
@pytest.mark.parametrize("group", [32, 128])
def test_dequant_ablation_matches_reference(bits, group):
    seed, config, lens, hkv, ratio = _case(bits, group, "channel", "token")
    q, cache = _data(config, lens, hkv, ratio, seed)
    err = _error(q, cache, lens, variant="dequant")
    assert err <= TOLERANCE, f"seed={seed}: {err:.2e}"


@pytest.mark.parametrize("k_mode,v_mode", MODES)
def test_constant_groups_fold_to_their_offset(k_mode, v_mode):
    # A constant group stores scale 1 with codes 0; the folds must give back the offset.
    config = QuantConfig(bits=4, group_size=128, k_mode=k_mode, v_mode=v_mode, page_size=128)
    seed = RNG.randrange(1 << 30)
    gen = torch.Generator().manual_seed(seed)
    k = torch.randn(1, 300, 1, 128, generator=gen).to(torch.bfloat16)
    v = torch.randn(1, 300, 1, 128, generator=gen).to(torch.bfloat16)
    k[:, :, :, :64] = 0.75  # channels constant over all tokens: channel-wise groups
    k[:, 7] = 0.25  # a constant token: a token-wise group
    v[:, :128] = -1.5
    v[:, 200] = 0.5
    q = torch.randn(1, 4, 128, generator=gen).to(torch.bfloat16)
    cache = foscar.quantize(k, v, [300], config)
    assert (cache.k_params[..., 0] == 1).any() and (cache.v_params[..., 0] == 1).any()
    err = _error(q, cache, [300])
    assert err <= TOLERANCE, f"seed={seed}: {err:.2e}"


@pytest.mark.parametrize("knobs", KNOBS)
def test_build_knobs_compute_the_same_function(knobs):
    # The lab's variants (ring depth: a ring of 2 stages makes the producer wait on every chunk;
    # CTAs per SM change the plan and the register split) must compute the same function, on
    # paired items where the build pairs (two KV heads at 4 query heads each).
    heads = 1 if "-DFOSCAR_PAIR_HEADS=0" in knobs else 2
    for bits in (4, 2):
        seed, config, lens, _, ratio = _case(bits, 128, RNG.choice(["channel", "token"]), "token", batch=2, ratio=4)
        q, cache = _data(config, lens, 2, ratio, seed)
        err = _error(q, cache, lens, defines=knobs, opt_level=LAB_OPT, kv_heads_per_item=heads)
        assert err <= TOLERANCE, f"seed={seed} bits={bits} knobs={knobs}: {err:.2e}"


def test_paired_merge_covers_every_column_and_split_count():
    # Paired items merge as the one-head kernels merge theirs ((m, l) pairs in registers, warp w
    # for columns w and w + 4 as float4), here over the 8 columns of two KV heads: a column left
    # out, or a split count that is not a multiple of the unroll (14 one-chunk splits are a
    # batch of 8 and a remainder of 6), shows as an error.
    for bits in (4, 2):
        seed, config, _, _, ratio = _case(bits, 128, "channel", "token", batch=2, ratio=4)
        lens = [899, 650]  # 14 and 10 chunks
        q, cache = _data(config, lens, 2, ratio, seed)
        for splits in (2, 5, 14):
            err = _error(q, cache, lens, kv_heads_per_item=2, num_splits=splits)
            assert err <= TOLERANCE, f"seed={seed} bits={bits} splits={splits}: {err:.2e}"


def test_split_counters_return_to_zero_between_launches():
    # Two launches share one workspace, as on the GPU (foscar.kernels keeps one per device): the
    # split merge's arrival counters must be back at zero after each, or the next launch's merge
    # never fires. One head and paired, 2 to 40 splits (empty splits: the sequences are shorter),
    # more items than CTAs (num_sms=1); both launches give the same output, within the gate.
    for bits, heads, splits in ((4, 1, 2), (2, 2, 17), (4, 2, 40)):
        seed, config, lens, _, ratio = _case(bits, 128, "channel", "token", batch=2, ratio=4, max_len=900)
        q, cache = _data(config, lens, 2, ratio, seed)
        n = 2 * q.shape[1] * splits
        # counters for (sequence, KV head), then as many sense words (FOSCAR_COOP_MERGE's)
        ws = (torch.empty(n * 128), torch.empty(n * 2),
              torch.zeros((1 + kernels.SENSE_STRIDE) * 2 * cache.num_kv_heads, dtype=torch.int32))
        runs = []
        for launch in range(2):
            runs.append(emu.decode(q, cache, num_splits=splits, kv_heads_per_item=heads, num_sms=1, workspace=ws))
            where = f"seed={seed} bits={bits} heads={heads} splits={splits} launch={launch}"
            assert not ws[2].any(), f"{where}: counters left at {ws[2].tolist()}"
        assert torch.equal(runs[0], runs[1]), where
        err = _error(q, cache, lens, num_splits=splits, kv_heads_per_item=heads, num_sms=1)
        assert err <= TOLERANCE, f"{where}: {err:.2e}"


def test_split_merge_with_ctas_at_once(monkeypatch):
    # FOSCAR_EMU_CONCURRENT_CTAS: three CTAs at once, so that the splits of a (sequence, KV head)
    # count and merge while the other CTAs run, as on a GPU (more items than CTAs: num_sms=1).
    monkeypatch.setenv("FOSCAR_EMU_CONCURRENT_CTAS", "3")
    for bits, heads, splits in ((4, 1, 3), (2, 2, 5)):
        seed, config, lens, _, ratio = _case(bits, 128, "channel", "token", batch=2, ratio=4, max_len=900)
        q, cache = _data(config, lens, 2, ratio, seed)
        err = _error(q, cache, lens, num_splits=splits, kv_heads_per_item=heads, num_sms=1)
        assert err <= TOLERANCE, f"seed={seed} bits={bits} heads={heads} splits={splits}: {err:.2e}"


def test_groups_of_32_on_paired_items():
    # Groups of 32 put two token groups in a chunk: channel-wise K runs one wgmma chain per group
    # into its own accumulator and each warp keeps its own group's; paired items do it per head.
    for bits, v_mode in ((4, "token"), (2, "channel")):
        seed, config, lens, _, ratio = _case(bits, 32, "channel", v_mode, batch=2, ratio=4, max_len=700)
        q, cache = _data(config, lens, 2, ratio, seed)
        err = _error(q, cache, lens, kv_heads_per_item=2)
        assert err <= TOLERANCE, f"seed={seed} bits={bits} v_mode={v_mode}: {err:.2e}"


def test_bad_input_is_one_clear_error():
    config = QuantConfig(bits=4, group_size=128, page_size=128)
    k = torch.randn(1, 100, 1, 128).to(torch.bfloat16)
    cache = foscar.quantize(k, k.clone(), [100], config)
    with pytest.raises(ValueError, match="bfloat16"):
        emu.decode(torch.randn(1, 4, 128), cache)
    with pytest.raises(ValueError, match="1 to 8"):
        emu.decode(torch.randn(1, 16, 128).to(torch.bfloat16), cache)


def test_ctas_per_sm_are_the_knobs_where_the_kernel_fits():
    # Each instance reports the CTAs per SM it is built for, which the planner sizes the grid by:
    # the knob (else the kernel's measured choice) where the instance's shared memory lets that
    # many share an SM, else fewer, never under three (DecodeTraits). Arguments: bits, group,
    # K channel, V channel, dequant, KV heads per item.
    from foscar import emu
    lib = emu.load()
    ctas, alt = lib.foscar_emu_ctas_per_sm, lib.foscar_emu_ctas_per_sm_alt
    # One head per item (batch 1-5), G = 128: three, and a second instance at four for K
    # channel-wise / V token-wise and INT2's token/token (v37), none for the others
    assert [ctas(b, 128, k, v, 0, 1) for b in (4, 2) for k, v in ((1, 0), (0, 0), (0, 1), (1, 1))] == [3] * 8
    assert [alt(4, 128, k, v, 0, 1) for k, v in ((1, 0), (0, 0), (0, 1), (1, 1))] == [4, 0, 0, 0]
    assert [alt(2, 128, k, v, 0, 1) for k, v in ((1, 0), (0, 0), (0, 1), (1, 1))] == [4, 4, 0, 0]
    assert alt(4, 128, 1, 0, 0, 2) == 0 and alt(4, 64, 1, 0, 0, 1) == 0 and alt(4, 128, 1, 0, 1, 1) == 0
    assert alt(3, 128, 1, 0, 0, 1) == -1  # not built
    # INT4 paired G = 128: four but channel/channel (v26 token/token, v27 one side channel-wise)
    assert [ctas(4, 128, k, v, 0, 2) for k, v in ((0, 0), (1, 0), (0, 1), (1, 1))] == [4, 4, 4, 3]
    assert ctas(4, 64, 1, 0, 0, 2) == 3 and ctas(4, 128, 1, 0, 1, 2) == 3  # G = 64, the ablation
    assert [ctas(2, 128, k, v, 0, 2) for k in (0, 1) for v in (0, 1)] == [4, 4, 4, 4]  # INT2 paired G = 128
    assert ctas(2, 128, 1, 0, 1, 1) == 3 and ctas(2, 64, 0, 0, 0, 2) == 3 and ctas(2, 128, 1, 0, 1, 2) == 3
    assert [ctas(2, 64, k, v, 0, 2) for k, v in ((1, 1), (1, 0), (0, 1))] == [4, 3, 3]  # G = 64: channel/channel only
    assert ctas(2, 64, 1, 1, 0, 1) == 3 and ctas(4, 64, 1, 1, 0, 2) == 3
    assert ctas(2, 128, 0, 0, 1, 1) == -1 and ctas(3, 128, 1, 0, 0, 1) == -1  # not built
    lab = emu.load(KNOBS[-1], LAB_OPT).foscar_emu_ctas_per_sm
    assert [lab(4, 128, 1, 0, 0, hp) for hp in (1, 2)] == [4, 4] and lab(4, 32, 1, 0, 0, 2) == 3
    assert lab(2, 32, 1, 0, 0, 1) == 4 and lab(2, 32, 1, 0, 0, 2) == 3  # four rings of groups of 32 do not fit


@pytest.mark.parametrize("bits,k_mode,v_mode", [(4, "channel", "token"), (2, "channel", "token"), (2, "token", "token")])
def test_second_instance_runs_where_splits_are_long(bits, k_mode, v_mode):
    # v37: batch 1's one-head kernels of these modes have a four-CTA instance beside their own,
    # launched where a split runs ALT_MIN_CHUNKS or more. One sequence of 1200 tokens on one SM:
    # 2 splits of 9 chunks take it (and its output matches the reference), 3 splits of 6 the
    # three-CTA kernel; a ctas_per_sm the kernel is not built for is refused by name.
    from foscar import kernels

    seed, config, _, _, _ = _case(bits, 128, k_mode, v_mode, batch=1, ratio=4)
    lens = [1200]  # 18 packed chunks and a 48-token tail (K channel-wise) or none
    q, cache = _data(config, lens, 1, 4, seed)
    lib = emu.load()
    common = dict(variant="fold", num_sms=1, ctas_per_sm=lib.foscar_emu_ctas_per_sm,
                  alt_ctas_per_sm=lib.foscar_emu_ctas_per_sm_alt)
    long = kernels.resolve_plan(cache, q.shape[1], num_splits=2, **common)[1]
    short = kernels.resolve_plan(cache, q.shape[1], num_splits=3, **common)[1]
    assert long.chunks_per_split >= kernels.ALT_MIN_CHUNKS > short.chunks_per_split
    assert (long.ctas_per_sm, short.ctas_per_sm) == (4, 0)
    for splits in (2, 3):
        err = _error(q, cache, lens, num_splits=splits, num_sms=1)
        assert err <= TOLERANCE, f"seed={seed} splits={splits}: {err:.2e}"
    # The GPU's policy (kernels.SECOND_INSTANCE_WIDTHS): an H100 keeps INT4 on its own instance.
    on_h100 = kernels.resolve_plan(cache, q.shape[1], num_splits=2, gpu_name="NVIDIA H100 80GB HBM3", **common)[1]
    assert on_h100.ctas_per_sm == (4 if bits == 2 else 0)
    assert kernels.resolve_plan(cache, q.shape[1], num_splits=2, gpu_name="NVIDIA H200", **common)[1].ctas_per_sm == 4
    with pytest.raises(ValueError, match="second_instance='no' is not a bool"):
        kernels.resolve_plan(cache, q.shape[1], num_splits=2, gpu_name="NVIDIA H100 80GB HBM3",
                             second_instance="no", **common)
    # second_instance=False: the same 2 splits on the kernel's own instance (kernel_lab --instances own)
    own = kernels.resolve_plan(cache, q.shape[1], num_splits=2, **{**common, "alt_ctas_per_sm": 0})[1]
    assert (own.num_splits, own.chunks_per_split, own.ctas_per_sm) == (long.num_splits, long.chunks_per_split, 0)
    err = _error(q, cache, lens, num_splits=2, num_sms=1, second_instance=False)
    assert err <= TOLERANCE, f"seed={seed} own instance: {err:.2e}"
    with pytest.raises(ValueError, match="second_instance='no' is not a bool"):
        emu.decode(q, cache, num_splits=2, num_sms=1, second_instance="no")
    args = kernels.launch_args(q, cache, torch.empty_like(q), sm_scale=None, num_splits=2,
                               workspace=lambda *n: [torch.zeros(max(x, 1)) for x in n], **common)
    assert args.ctas_per_sm == 4
    args.ctas_per_sm = 5
    assert lib.foscar_emu_decode(ctypes.byref(args)) == 2
    assert "ctas_per_sm 5 is not built for this kernel; pass 0 (its own) or 4" in lib.foscar_emu_last_error().decode()


def test_timeline_knob_stamps_each_ctas_phases():
    # Lab knob FOSCAR_TIMELINE: one thread per CTA stamps its items' phases. Two KV heads in 3
    # splits are 6 items; one SM's 3 CTAs take them (splits of 2 chunks: the kernel's own
    # instance, not its four-CTA one), so each runs a second item (k = 1). The
    # output is the kernels' as ever; each item's stamps come in order, and of each (sequence,
    # KV head) exactly the split that arrived last (CTAs run one after another here) merged.
    from foscar import kernels

    knob = TIMELINE
    seed, config, _, _, _ = _case(4, 128, "channel", "token", batch=1, ratio=4)
    lens = [450]  # 6 packed chunks (3 splits of 2) and a 66-token tail
    q, cache = _data(config, lens, 2, 4, seed)
    lib = emu.load(knob, LAB_OPT)
    splits, num_sms = 3, 1
    plan = kernels.resolve_plan(cache, q.shape[1], variant="fold", num_splits=splits, num_sms=num_sms,
                                ctas_per_sm=lib.foscar_emu_ctas_per_sm, alt_ctas_per_sm=lib.foscar_emu_ctas_per_sm_alt)[1]
    assert (plan.num_splits, plan.num_ctas, plan.ctas_per_sm) == (splits, 3, 0)
    stamps = torch.zeros(kernels.timeline_entries(plan.num_ctas), dtype=torch.int64)
    err = _error(q, cache, lens, num_splits=splits, num_sms=num_sms, defines=knob, opt_level=LAB_OPT, timeline=stamps)
    assert err <= TOLERANCE, f"seed={seed}: {err:.2e}"

    phases = {name: i for i, name in enumerate(kernels.TIMELINE_PHASES)}
    t = stamps.view(plan.num_ctas, kernels.TIMELINE_ITEMS, len(phases)).tolist()
    num_items, written = 2 * splits, {}
    for cta in range(plan.num_ctas):
        for k in range(kernels.TIMELINE_ITEMS):
            row, item = t[cta][k], cta + k * plan.num_ctas
            if item >= num_items:
                assert not any(row), (cta, k, row)
                continue
            at = {name: row[i] for name, i in phases.items()}
            assert (at["entry"] > 0) == (k == 0), (cta, k, at)
            done = ("item", "first_copy", "first_s", "last_trip", "folded", "scaled", "stored", "written", "counted")
            assert all(at[n] > 0 for n in done), (cta, k, at)
            merge = ("merge_fenced", "merge_weighted", "merged")
            consumer = [at[n] for n in (*done[:1], *done[2:], *merge) if at[n]]
            assert consumer == sorted(consumer), (cta, k, at)
            assert len({at[n] > 0 for n in merge}) == 1, (cta, k, at)  # the merge's stamps, all or none
            assert at["first_copy"] <= at["first_s"] and (k > 0 or at["entry"] <= min(at["item"], at["first_copy"]))
            written[item] = (at["written"], at["merged"])
    for head in range(2):  # items head * splits + split
        group = [written[head * splits + sp] for sp in range(splits)]
        assert [m > 0 for _, m in group] == [w == max(g for g, _ in group) for w, _ in group], (head, group)


def test_timeline_needs_the_knob_and_the_launchs_size():
    # 300 tokens, channel-wise: 4 packed chunks, so 2 splits of 2 on 2 CTAs (4 items x 16 phases each).
    seed, config, _, _, _ = _case(4, 128, "channel", "token", batch=1, ratio=4)
    q, cache = _data(config, [300], 1, 4, seed)
    with pytest.raises(RuntimeError, match="FOSCAR_TIMELINE=1"):  # the default build records none
        emu.decode(q, cache, num_splits=2, timeline=torch.zeros(128, dtype=torch.int64))
    with pytest.raises(ValueError, match=r"expected a contiguous torch.int64 tensor of 128 elements \(2 CTAs"):
        emu.decode(q, cache, num_splits=2, timeline=torch.zeros(128, dtype=torch.int32))


def test_the_reserved_fields_must_be_zero():
    # FoscarDecodeArgs' reserved0 and reserved1 (the retired stolen tail's, kept for the layout)
    # are 0 from launch_args; any other value is refused by name before a launch.
    from foscar import kernels

    seed, config, _, _, _ = _case(4, 128, "channel", "token", batch=1, ratio=4)
    q, cache = _data(config, [300], 1, 4, seed)
    lib = emu.load()
    args = kernels.launch_args(q, cache, torch.empty_like(q), sm_scale=None, variant="fold", num_splits=None,
                               num_sms=1, ctas_per_sm=lib.foscar_emu_ctas_per_sm,
                               workspace=lambda *n: [torch.zeros(max(x, 1)) for x in n])
    assert (args.reserved0, args.reserved1) == (0, 0)
    for field in ("reserved0", "reserved1"):
        setattr(args, field, 3)
        assert lib.foscar_emu_decode(ctypes.byref(args)) == 2
        assert f"{field} 3 is not 0" in lib.foscar_emu_last_error().decode()
        setattr(args, field, 0)


def test_a_group_size_the_build_leaves_out_is_refused_by_name():
    # A lab build with FOSCAR_ONLY_GROUP=128 holds groups of 128 alone: a launch at 32 is refused
    # by the planner (the instance reports no CTAs) and, past it, by the library, naming the knob.
    seed, config, lens, num_kv_heads, ratio = _case(4, 32, "channel", "token", batch=1, ratio=4)
    q, cache = _data(config, lens, num_kv_heads, ratio, seed)
    with pytest.raises(ValueError, match="the library builds no fold kernel for 4-bit codes, group_size=32"):
        emu.decode(q, cache, defines=TIMELINE, opt_level=LAB_OPT)
    lib = emu.load(TIMELINE, LAB_OPT)
    args = kernels.launch_args(q, cache, torch.empty_like(q), sm_scale=None, variant="fold", num_splits=None,
                               num_sms=1, ctas_per_sm=3, alt_ctas_per_sm=0, kv_heads_per_item=1,
                               workspace=lambda *n: [torch.zeros(max(x, 1)) for x in n])
    assert lib.foscar_emu_decode(ctypes.byref(args)) == 2
    assert lib.foscar_emu_last_error().decode() == (
        "group_size 32 is not built; expected 128 (this build has FOSCAR_ONLY_GROUP=128)")
    with pytest.raises(ValueError, match="opt_level=2 is not one the emulator builds with; expected 0 or 1"):
        emu.build(opt_level=2)
    # The optimization level is part of a build's key: an -O0 build is never loaded as -O1's.
    cxx, inc = emu.find_cxx(), emu.find_cuda_include()
    assert emu._key(cxx, inc, TIMELINE, emu._flags(0)) != emu._key(cxx, inc, TIMELINE, emu._flags(1))
    assert emu.build(TIMELINE, opt_level=LAB_OPT).parent.name == f"emu-{emu._key(cxx, inc, TIMELINE, emu._flags(LAB_OPT))}"


@pytest.mark.parametrize("bits,heads,splits", [(4, 1, 2), (2, 1, 7), (4, 2, 7), (2, 2, 40), (4, 1, 64)])
def test_cooperative_merge_shares_each_pairs_merge(bits, heads, splits):
    # Lab knob FOSCAR_COOP_MERGE: with no more items than CTAs (all of them at once, as a
    # cooperative launch runs them), every split's CTA waits for the last to count, then merges
    # its slice of the pair's output. Slices that cross a column (7 splits), that leave CTAs
    # without outputs (40 splits of 4 columns: 32 slices of 16) or hold 8 outputs (64); one head
    # and paired. Two launches on one workspace: the counters back at zero, each used sense word
    # flipped once a launch, the outputs equal; then items over CTAs (num_sms=1: the last CTA's
    # merge) in the same build.
    seed, config, _, _, ratio = _case(bits, 128, "channel", "token", batch=1, ratio=4)
    lens = [899]  # 14 packed chunks: 40 and 64 splits hold empty ones
    q, cache = _data(config, lens, 2, ratio, seed)
    where = f"seed={seed} bits={bits} heads={heads} splits={splits}"
    n = q.shape[1] * splits
    stride = kernels.SENSE_STRIDE
    ws = (torch.empty(n * 128), torch.empty(n * 2), torch.zeros((1 + stride) * 2, dtype=torch.int32))
    runs = []
    for launch in range(2):
        runs.append(emu.decode(q, cache, num_splits=splits, kv_heads_per_item=heads, workspace=ws,
                               defines=COOP, opt_level=LAB_OPT))
        assert not ws[2][:2].any(), f"{where} launch={launch}: counters left at {ws[2].tolist()}"
        flipped = [launch + 1] * 2 if heads == 1 else [launch + 1, 0]
        sense = ws[2][2:].view(2, stride)  # a word each, an L2 line apart; the rest untouched
        assert sense[:, 0].tolist() == [f % 2 for f in flipped], f"{where} launch={launch}: {sense.tolist()}"
        assert not sense[:, 1:].any(), where
    assert torch.equal(runs[0], runs[1]), where
    for num_sms in (132, 1):
        err = _error(q, cache, lens, num_splits=splits, kv_heads_per_item=heads, num_sms=num_sms,
                     defines=COOP, opt_level=LAB_OPT)
        assert err <= TOLERANCE, f"{where} num_sms={num_sms}: {err:.2e}"
