"""Pins the bit layout of docs/FORMAT.md: round trips, hand-checked bits, extraction schedules."""
from __future__ import annotations

import pytest
import torch

from foscar import packing
from foscar.config import QuantConfig

WIDTHS = (2, 4)
KINDS = ("k", "v")
HEAD_DIMS = (64, 128, 256)


def random_codes(rng, bits, n_blocks, head_dim, kind="k"):
    tokens = packing.block_tokens(kind)
    return torch.randint(0, 1 << bits, (n_blocks, tokens, head_dim), generator=rng, dtype=torch.uint8)


@pytest.mark.parametrize("head_dim", HEAD_DIMS)
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("bits", WIDTHS)
def test_round_trip(rng, bits, kind, head_dim):
    codes = random_codes(rng, bits, 7, head_dim, kind)
    words = packing.pack_tiles(codes, bits, kind)
    assert words.dtype == torch.int32
    assert words.shape == (7, packing.words_per_block(bits, kind, head_dim))
    assert packing.words_per_tile(bits, head_dim) == QuantConfig(bits=bits).words_per_tile(head_dim)
    assert packing.words_per_block(bits, kind, head_dim) % packing.words_per_tile(bits, head_dim) == 0
    assert torch.equal(packing.unpack_tiles(words, bits, kind, head_dim), codes)
    # int64 codes pack to the same words.
    assert torch.equal(packing.pack_tiles(codes.long(), bits, kind), words)


# (bits, kind, head_dim, lane, word w, half h, position k) -> worked out by hand from FORMAT.md.
# K: token/channel from the K table, storage index (w // V) * 32 * V + lane * V + w % V.
# V: warp 32-channel slice s, index s * 32 * W + (w // 4) * 128 + lane * 4 + w % 4. Bit 16h + bits*k.
HAND_CHECKED = [
    # INT4 K, d 128: W 8, V 4, P 4. r 1, t4 1; w // 4 = 1, w % 4 = 2.
    (4, "k", 128, 5, 6, 1, 3, dict(token=9, channel=91, index=150, bit=28)),
    # INT2 V, d 64, slice 1: W 4. g 7, t4 2; word 1 = k-step 1; position 5 = (block 1, offset 1):
    # token 16 + 4 + 0 + 8 = 28, channel 32 + 8 + 7 = 47; index 128 + 0 + 120 + 1 = 249.
    (2, "v", 64, 30, 1, 0, 5, dict(token=28, channel=47, index=249, bit=10, slice=1)),
    # INT2 K, d 256: W 8, V 4, P 8. r 7, t4 3; w // 4 = 1, w % 4 = 3: the very last code, bit 31's pair.
    (2, "k", 256, 31, 7, 1, 7, dict(token=15, channel=255, index=255, bit=30)),
    # INT4 V, d 256, slice 5: W 8. g 2, t4 1; word 7 = (k-step 3, offset 1), position 2 = block 2:
    # token 48 + 2 + 1 + 8 = 59, channel 160 + 16 + 2 = 178; index 5*256 + 128 + 36 + 3 = 1447.
    (4, "v", 256, 9, 7, 1, 2, dict(token=59, channel=178, index=1447, bit=24, slice=5)),
    # INT2 K, d 128: lane 0, word 0, half 0, position 0 is token 0, channel 0, bit 0.
    (2, "k", 128, 0, 0, 0, 0, dict(token=0, channel=0, index=0, bit=0)),
]


@pytest.mark.parametrize("bits, kind, head_dim, lane, word, half, k, where", HAND_CHECKED)
def test_hand_checked_bits(rng, bits, kind, head_dim, lane, word, half, k, where):
    positions = packing.tile_positions(bits, kind, head_dim)
    assert int(positions[where["index"], half, k]) == where["token"] * head_dim + where["channel"]
    codes = random_codes(rng, bits, 3, head_dim, kind)
    words = packing.pack_tiles(codes, bits, kind)
    field = (words[:, where["index"]].long() >> where["bit"]) & ((1 << bits) - 1)
    assert torch.equal(field, codes[:, where["token"], where["channel"]].long())
    # A lone code lands in exactly one word, at exactly that bit.
    lone = torch.zeros(1, packing.block_tokens(kind), head_dim, dtype=torch.uint8)
    lone[0, where["token"], where["channel"]] = (1 << bits) - 1
    expected = torch.zeros(1, packing.words_per_block(bits, kind, head_dim), dtype=torch.int64)
    expected[0, where["index"]] = ((1 << bits) - 1) << where["bit"]
    expected = torch.where(expected >= 1 << 31, expected - (1 << 32), expected)  # as int32 bits
    assert torch.equal(packing.pack_tiles(lone, bits, kind).long(), expected)


@pytest.mark.parametrize("bits", WIDTHS)
def test_every_k_position_follows_the_formula(bits):
    """All of the K tile's positions against the FORMAT.md table, lane by lane in plain Python."""
    head_dim = 128
    per_lane = packing.words_per_tile(bits, head_dim) // 32
    per_half, vec, half_w = 16 // bits, min(4, per_lane), per_lane // 2
    positions = packing.tile_positions(bits, "k", head_dim).tolist()
    for lane in range(32):
        r, t4 = lane // 4, lane % 4
        for w in range(per_lane):
            index = (w // vec) * 32 * vec + lane * vec + w % vec
            for h in range(2):
                for k in range(per_half):
                    token, channel = r + 8 * (w // half_w), 2 * t4 + h + 8 * (per_half * (w % half_w) + k)
                    assert positions[index][h][k] == token * head_dim + channel


V2_BLOCK_OFFSET = {3: (0, 0), 7: (0, 1), 1: (1, 0), 5: (1, 1), 4: (2, 0), 0: (2, 1), 2: (3, 0), 6: (3, 1)}


@pytest.mark.parametrize("bits", WIDTHS)
def test_every_v_position_follows_the_formula(bits):
    """All of the V block's positions against the FORMAT.md table: each word is the A fragment
    of one warp of O^T = V^T P^T over a 16-token k-step (rows = channels, columns = tokens)."""
    head_dim = 128
    per_lane = 2 * bits
    positions = packing.tile_positions(bits, "v", head_dim).tolist()
    for w in range(head_dim // 32):
        for lane in range(32):
            g, t4 = lane // 4, lane % 4
            for i in range(per_lane):
                index = w * 32 * per_lane + (i // 4) * 128 + lane * 4 + i % 4
                for h in range(2):
                    for k in range(16 // bits):
                        kt, o, b = (i // 2, i % 2, k) if bits == 4 else (i, V2_BLOCK_OFFSET[k][1], V2_BLOCK_OFFSET[k][0])
                        token, channel = 16 * kt + 2 * t4 + h + 8 * o, 32 * w + 8 * b + g
                        assert positions[index][h][k] == token * head_dim + channel


def test_radix_factors():
    assert packing.radix_factors(4, "k") == [1, 16, 1, 16]
    assert packing.radix_factors(2, "k") == [1, 4, 16, 64, 256, 1, 4, 16]
    assert packing.radix_factors(4, "v") == [1, 16, 1, 16]
    assert packing.radix_factors(2, "v") == [256, 4, 16, 64, 256, 4, 16, 64]
    assert packing.extraction_schedule(4, "v") == packing.extraction_schedule(4, "k")
    assert packing.extraction_schedule(2, "v")[0] == (packing.SWAP_HALVES, 0x03000300)
    assert packing.extraction_schedule(4, "k") == ((0, 0x000F000F), (0, 0x00F000F0), (8, 0x000F000F), (8, 0x00F000F0))


@pytest.mark.parametrize("head_dim", HEAD_DIMS)
@pytest.mark.parametrize("bits", WIDTHS)
def test_channel_radix(bits, head_dim):
    """K: channel d at position (d // 8) % P, whatever the token. V: channel 32 w + 8 b + g is
    worth the factor of its block b (INT2: 64, 4, 256, 16; INT4: 1, 16, 1, 16)."""
    per_half = 16 // bits
    channels = torch.arange(head_dim)
    assert torch.equal(packing.channel_positions(bits, "k", head_dim), (channels // 8) % per_half)
    factors = torch.tensor(packing.radix_factors(bits, "k"))
    assert torch.equal(packing.channel_radix(bits, "k", head_dim), factors[(channels // 8) % per_half])
    block = (channels % 32) // 8
    v_factor = torch.tensor([64, 4, 256, 16] if bits == 2 else [1, 16, 1, 16])[block]
    assert torch.equal(packing.channel_radix(bits, "v", head_dim), v_factor)


@pytest.mark.parametrize("head_dim", HEAD_DIMS)
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("bits", WIDTHS)
def test_extraction_gives_bias_plus_f_times_code(rng, bits, kind, head_dim):
    """extract() read as two fp16 values is bias + unit f_k c of the right codes (K: 1024 + f_k c,
    V: the fp16 subnormal f_k c 2^-24)."""
    codes = random_codes(rng, bits, 2, head_dim, kind)
    words = packing.pack_tiles(codes, bits, kind)
    positions = packing.tile_positions(bits, kind, head_dim)
    flat = codes.view(2, -1).double()
    dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}[packing.OPERANDS[kind].dtype]
    bias, unit = packing.OPERANDS[kind].bias, packing.OPERANDS[kind].unit
    for k in range(16 // bits):
        made = packing.extract(words, bits, kind, k)
        values = made.view(torch.int16).view(dtype).double().view(2, -1, 2)
        f = packing.radix_factors(bits, kind)[k]
        expected = bias + unit * f * flat[:, positions[:, :, k]]  # [2, words, 2 halves]
        assert torch.equal(values, expected)


def test_bad_inputs():
    with pytest.raises(ValueError, match="expected 2 or 4"):
        packing.radix_factors(3, "k")
    with pytest.raises(ValueError, match="expected 'k' or 'v'"):
        packing.pack_tiles(torch.zeros(1, 16, 64, dtype=torch.uint8), 4, "q")
    with pytest.raises(ValueError, match="expected 64, 128 or 256"):
        packing.pack_tiles(torch.zeros(1, 16, 96, dtype=torch.uint8), 4, "k")
    with pytest.raises(ValueError, match=r"expected \[n_blocks, 16, head_dim\]"):
        packing.pack_tiles(torch.zeros(1, 8, 64, dtype=torch.uint8), 4, "k")
    with pytest.raises(ValueError, match="expected int32"):
        packing.unpack_tiles(torch.zeros(1, 128, dtype=torch.int32), 4, "k", 128)


@pytest.mark.parametrize("bits", WIDTHS)
def test_int8_k_operands_hold_one_token_per_register_and_a_channel_per_column(rng, bits):
    """The int8 K read (v24): masking a lane's words as packing.k8_schedule says gives, in byte
    b of each register, f times the code of the register's one token at the channel
    packing.k8_channels names, every channel exactly once per tile."""
    head_dim = 128
    codes = random_codes(rng, bits, 3, head_dim)
    words = packing.pack_tiles(codes, bits, "k")
    per_lane = packing.words_per_tile(bits, head_dim) // 32
    vec = min(4, per_lane)
    chans = packing.k8_channels(bits, head_dim)
    assert sorted(chans.flatten().tolist()) == list(range(head_dim))
    sched = packing.k8_schedule(bits)
    for lane in range(32):
        g, t4 = lane // 4, lane % 4
        mine = [words[:, (w // vec) * 32 * vec + lane * vec + w % vec].long() & 0xFFFFFFFF for w in range(per_lane)]
        for ks in range(head_dim // 32):
            for hf in range(2):
                q = 2 * ks + hf
                shift, mask = sched[q % len(sched)]
                for o in range(2):  # rows g and g + 8: the first and second half of the lane's words
                    reg = (mine[o * per_lane // 2 + q // len(sched)] >> shift) & mask
                    for b in range(4):
                        got = (reg >> (8 * b)) & 0xFF
                        want = (mask & -mask) * codes[:, g + 8 * o, chans[ks, 16 * hf + 4 * t4 + b]].long()
                        assert torch.equal(got, want), (lane, ks, hf, o, b)
