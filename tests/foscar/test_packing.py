"""Pins the tile bit layout of docs/FORMAT.md: round trips, hand-checked bits, extraction schedule."""
from __future__ import annotations

import pytest
import torch

from foscar import packing
from foscar.config import QuantConfig

WIDTHS = (2, 4)
KINDS = ("k", "v")
HEAD_DIMS = (64, 128, 256)


def random_codes(rng, bits, n_tiles, head_dim):
    return torch.randint(0, 1 << bits, (n_tiles, 16, head_dim), generator=rng, dtype=torch.uint8)


@pytest.mark.parametrize("head_dim", HEAD_DIMS)
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("bits", WIDTHS)
def test_round_trip(rng, bits, kind, head_dim):
    codes = random_codes(rng, bits, 7, head_dim)
    words = packing.pack_tiles(codes, bits, kind)
    assert words.dtype == torch.int32
    assert words.shape == (7, packing.words_per_tile(bits, head_dim))
    assert packing.words_per_tile(bits, head_dim) == QuantConfig(bits=bits).words_per_tile(head_dim)
    assert torch.equal(packing.unpack_tiles(words, bits, kind, head_dim), codes)
    # int64 codes pack to the same words.
    assert torch.equal(packing.pack_tiles(codes.long(), bits, kind), words)


# (bits, kind, head_dim, lane, word w, half h, position k) -> worked out by hand from FORMAT.md:
# token/channel from the table, storage index (w // V) * 32 * V + lane * V + w % V, bit 16h + bits*k.
HAND_CHECKED = [
    # INT4 K, d 128: W 8, V 4, P 4. r 1, t4 1; w // 4 = 1, w % 4 = 2.
    (4, "k", 128, 5, 6, 1, 3, dict(token=9, channel=91, index=150, bit=28)),
    # INT2 V, d 64: W 2, V 2, P 8. r 7, t4 2; w // 1 = 1, w % 1 = 0.
    (2, "v", 64, 30, 1, 0, 5, dict(token=12, channel=47, index=61, bit=10)),
    # INT2 K, d 256: W 8, V 4, P 8. r 7, t4 3; w // 4 = 1, w % 4 = 3: the very last code, bit 31's pair.
    (2, "k", 256, 31, 7, 1, 7, dict(token=15, channel=255, index=255, bit=30)),
    # INT4 V, d 256: W 16, V 4, P 4. r 2, t4 1; w // 8 = 1, w % 8 = 3.
    (4, "v", 256, 9, 11, 0, 2, dict(token=10, channel=114, index=295, bit=8)),
    # INT2 K, d 128: lane 0, word 0, half 0, position 0 is token 0, channel 0, bit 0.
    (2, "k", 128, 0, 0, 0, 0, dict(token=0, channel=0, index=0, bit=0)),
]


@pytest.mark.parametrize("bits, kind, head_dim, lane, word, half, k, where", HAND_CHECKED)
def test_hand_checked_bits(rng, bits, kind, head_dim, lane, word, half, k, where):
    positions = packing.tile_positions(bits, kind, head_dim)
    assert int(positions[where["index"], half, k]) == where["token"] * head_dim + where["channel"]
    codes = random_codes(rng, bits, 3, head_dim)
    words = packing.pack_tiles(codes, bits, kind)
    field = (words[:, where["index"]].long() >> where["bit"]) & ((1 << bits) - 1)
    assert torch.equal(field, codes[:, where["token"], where["channel"]].long())
    # A lone code lands in exactly one word, at exactly that bit.
    lone = torch.zeros(1, 16, head_dim, dtype=torch.uint8)
    lone[0, where["token"], where["channel"]] = (1 << bits) - 1
    expected = torch.zeros(1, packing.words_per_tile(bits, head_dim), dtype=torch.int64)
    expected[0, where["index"]] = ((1 << bits) - 1) << where["bit"]
    expected = torch.where(expected >= 1 << 31, expected - (1 << 32), expected)  # as int32 bits
    assert torch.equal(packing.pack_tiles(lone, bits, kind).long(), expected)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("bits", WIDTHS)
def test_every_position_follows_the_formula(bits, kind):
    """All of tile_positions against the FORMAT.md table, evaluated lane by lane in plain Python."""
    head_dim = 128
    per_lane = packing.words_per_tile(bits, head_dim) // 32
    per_half, vec, half_w = 16 // bits, min(4, per_lane), per_lane // 2
    positions = packing.tile_positions(bits, kind, head_dim).tolist()
    for lane in range(32):
        r, t4 = lane // 4, lane % 4
        for w in range(per_lane):
            index = (w // vec) * 32 * vec + lane * vec + w % vec
            for h in range(2):
                for k in range(per_half):
                    outer = 8 * (per_half * (w % half_w) + k)
                    if kind == "k":
                        token, channel = r + 8 * (w // half_w), 2 * t4 + h + outer
                    else:
                        token, channel = 2 * t4 + h + 8 * (w // half_w), r + outer
                    assert positions[index][h][k] == token * head_dim + channel


def test_radix_factors():
    assert packing.radix_factors(4) == [1, 1, 1, 1]
    assert packing.radix_factors(2) == [1, 4, 16, 1, 4, 16, 1, 4]
    assert packing.extraction_schedule(4) == tuple((4 * k, 0x000F000F) for k in range(4))
    masks = (0x00030003, 0x000C000C, 0x00300030)
    assert packing.extraction_schedule(2) == tuple((s, m) for s in (0, 6, 12) for m in masks)[:8]


@pytest.mark.parametrize("head_dim", HEAD_DIMS)
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("bits", WIDTHS)
def test_channel_positions(bits, kind, head_dim):
    """Channel d sits at position (d // 8) % P in K and in V, whatever the token."""
    per_half = 16 // bits
    channels = torch.arange(head_dim)
    assert torch.equal(packing.channel_positions(bits, kind, head_dim), (channels // 8) % per_half)
    factors = torch.tensor(packing.radix_factors(bits))
    assert torch.equal(packing.channel_radix(bits, kind, head_dim), factors[(channels // 8) % per_half])


@pytest.mark.parametrize("head_dim", HEAD_DIMS)
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("bits", WIDTHS)
def test_extraction_gives_128_plus_f_times_code(rng, bits, kind, head_dim):
    """((w >> shift) & mask) | 0x43004300, read as two bf16, is 128 + f_k * c of the right codes."""
    codes = random_codes(rng, bits, 2, head_dim)
    words = packing.pack_tiles(codes, bits, kind)
    positions = packing.tile_positions(bits, kind, head_dim)
    flat = codes.view(2, -1).double()
    for k, (shift, mask) in enumerate(packing.extraction_schedule(bits)):
        made = ((words >> shift) & mask) | packing.BF16_128_PAIR
        values = made.view(torch.int16).view(torch.bfloat16).double().view(2, -1, 2)
        f = packing.radix_factors(bits)[k]
        expected = 128 + f * flat[:, positions[:, :, k]]  # [2, words, 2 halves]
        assert torch.equal(values, expected)


def test_bad_inputs():
    with pytest.raises(ValueError, match="expected 2 or 4"):
        packing.radix_factors(3)
    with pytest.raises(ValueError, match="expected 'k' or 'v'"):
        packing.pack_tiles(torch.zeros(1, 16, 64, dtype=torch.uint8), 4, "q")
    with pytest.raises(ValueError, match="expected 64, 128 or 256"):
        packing.pack_tiles(torch.zeros(1, 16, 96, dtype=torch.uint8), 4, "k")
    with pytest.raises(ValueError, match=r"expected \[n_tiles, 16, head_dim\]"):
        packing.pack_tiles(torch.zeros(1, 8, 64, dtype=torch.uint8), 4, "k")
    with pytest.raises(ValueError, match="expected int32"):
        packing.unpack_tiles(torch.zeros(1, 128, dtype=torch.int32), 4, "k", 128)
