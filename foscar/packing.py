"""The bit layout of one 16-token tile of 2/4-bit codes (docs/FORMAT.md): pack, unpack, radix factors.

This module is the only code that knows the layout; everything else asks it.
"""
from __future__ import annotations

import functools

import torch

TILE_TOKENS = 16
KINDS = ("k", "v")
HEAD_DIMS = (64, 128, 256)
BF16_128_PAIR = 0x43004300  # bf16 128.0 in both 16-bit halves of a word


def block_tokens(kind: str) -> int:
    """Tokens in one packed block of `kind` ('k' or 'v'): the unit pack_tiles/unpack_tiles work on."""
    if kind not in KINDS:
        raise ValueError(f"kind={kind!r} is not a tensor kind; expected 'k' or 'v'.")
    return TILE_TOKENS


def words_per_tile(bits: int, head_dim: int) -> int:
    """int32 words holding one 16-token x head_dim tile of codes."""
    return TILE_TOKENS * head_dim * bits // 32


def positions_per_half(bits: int) -> int:
    """Code positions k inside each 16-bit half of a word (P in FORMAT.md)."""
    return 16 // bits


def extraction_schedule(bits: int) -> tuple[tuple[int, int], ...]:
    """(right shift, mask) reading position k of a word, for k = 0 .. P-1 (FORMAT.md).

    `((word >> shift) & mask) | 0x43004300` is then two bf16 values 128 + f_k * c.
    """
    _check_bits(bits)
    if bits == 4:
        return tuple((4 * k, 0x000F000F) for k in range(4))
    # INT2: three positions read in place, at radix 1, 4 and 16, from each of x, x >> 6, x >> 12.
    in_place = (0x00030003, 0x000C000C, 0x00300030)
    return tuple((6 * (k // 3), in_place[k % 3]) for k in range(8))


def radix_factors(bits: int) -> list[int]:
    """f_k: what a code at position k is worth once extracted (INT4: all 1; INT2: 1, 4, 16, ...)."""
    return [mask & -mask for _, mask in extraction_schedule(bits)]


def channel_positions(bits: int, kind: str, head_dim: int) -> torch.Tensor:
    """Position k of every channel, int64 [head_dim]: K channel d (or V channel d) is worth f_k."""
    return _layout(bits, kind, head_dim, torch.device("cpu")).channel_position.clone()


def channel_radix(bits: int, kind: str, head_dim: int) -> torch.Tensor:
    """Radix factor f of every channel, int64 [head_dim], to fold into Q (K) or the output (V)."""
    factors = torch.tensor(radix_factors(bits), dtype=torch.int64)
    return factors[channel_positions(bits, kind, head_dim)]


def tile_positions(bits: int, kind: str, head_dim: int) -> torch.Tensor:
    """Where each code of a tile goes: int64 [words_per_tile, 2 halves, P positions] -> token*head_dim + channel.

    Indexed by the word's storage index inside the tile, so words[i] half h position k holds the
    code of (token, channel) = divmod(tile_positions[i, h, k], head_dim).
    """
    return _layout(bits, kind, head_dim, torch.device("cpu")).positions.clone()


def pack_tiles(codes: torch.Tensor, bits: int, kind: str) -> torch.Tensor:
    """Pack codes [n_tiles, 16, head_dim] (token, channel), each < 2^bits, into int32 [n_tiles, words_per_tile]."""
    if codes.dim() != 3 or codes.shape[1] != TILE_TOKENS:
        raise ValueError(
            f"codes of shape {tuple(codes.shape)} are not tiles; expected [n_tiles, 16, head_dim]."
        )
    n_tiles, _, head_dim = codes.shape
    layout = _layout(bits, kind, head_dim, codes.device)
    per_half = positions_per_half(bits)
    # Gather every code to its (word, half, position) slot, then OR the positions into 16-bit halves.
    slots = codes.reshape(n_tiles, -1)[:, layout.positions.view(-1)].to(torch.int32)
    slots = slots.view(n_tiles, -1, 2, per_half)
    shifts = torch.arange(per_half, device=codes.device, dtype=torch.int32) * bits
    halves = (slots << shifts).sum(dim=-1, dtype=torch.int32)  # each half < 2^16: no overflow
    low, high = halves[..., 0], halves[..., 1]
    # Make the high half a signed 16-bit value so high * 2^16 + low stays inside int32.
    high = high - ((high >> 15) << 16)
    return high * 65536 + low


def unpack_tiles(words: torch.Tensor, bits: int, kind: str, head_dim: int) -> torch.Tensor:
    """Inverse of pack_tiles: int32 [n_tiles, words_per_tile] -> uint8 codes [n_tiles, 16, head_dim]."""
    expected = words_per_tile(bits, head_dim)
    if words.dim() != 2 or words.shape[1] != expected or words.dtype != torch.int32:
        raise ValueError(
            f"words of shape {tuple(words.shape)} and dtype {words.dtype} are not packed tiles; "
            f"expected int32 [n_tiles, {expected}] for bits={bits}, head_dim={head_dim}."
        )
    layout = _layout(bits, kind, head_dim, words.device)
    per_half = positions_per_half(bits)
    shifts = (
        torch.arange(2, device=words.device, dtype=torch.int32)[:, None] * 16
        + torch.arange(per_half, device=words.device, dtype=torch.int32) * bits
    )
    # An arithmetic shift drags sign bits in from the top, but the mask keeps only the code's bits.
    slots = (words[:, :, None, None] >> shifts) & ((1 << bits) - 1)
    codes = slots.view(words.shape[0], -1)[:, layout.inverse].to(torch.uint8)
    return codes.view(words.shape[0], TILE_TOKENS, head_dim)


class _Layout:
    """Index maps of one (bits, kind, head_dim) on one device."""

    def __init__(self, positions: torch.Tensor, head_dim: int) -> None:
        self.positions = positions  # [words, 2, P] -> token * head_dim + channel
        self.inverse = torch.argsort(positions.view(-1))  # token * head_dim + channel -> slot
        channel = positions % head_dim
        per_half = positions.shape[-1]
        position_k = torch.arange(per_half, device=positions.device).expand_as(positions)
        self.channel_position = torch.zeros(head_dim, dtype=torch.int64, device=positions.device)
        self.channel_position[channel.reshape(-1)] = position_k.reshape(-1)
        # The radix fold needs one position per channel, whatever the token.
        seen = torch.zeros(head_dim, per_half, dtype=torch.bool, device=positions.device)
        seen[channel.reshape(-1), position_k.reshape(-1)] = True
        assert bool((seen.sum(dim=1) == 1).all()), "a channel sits at two positions"


@functools.lru_cache(maxsize=None)
def _layout(bits: int, kind: str, head_dim: int, device: torch.device) -> _Layout:
    return _Layout(_positions(bits, kind, head_dim).to(device), head_dim)


def _positions(bits: int, kind: str, head_dim: int) -> torch.Tensor:
    """The FORMAT.md formulas, evaluated for every (lane, word, half, position) of a tile."""
    _check_bits(bits)
    if kind not in KINDS:
        raise ValueError(f"kind={kind!r} is not a tensor kind; expected 'k' or 'v'.")
    if head_dim not in HEAD_DIMS:
        raise ValueError(f"head_dim={head_dim} is not supported; expected 64, 128 or 256.")
    n_words = words_per_tile(bits, head_dim)
    per_lane = n_words // 32  # W
    per_half = positions_per_half(bits)  # P
    half_w = per_lane // 2
    lane = torch.arange(32).view(32, 1, 1, 1)
    word = torch.arange(per_lane).view(1, per_lane, 1, 1)
    half = torch.arange(2).view(1, 1, 2, 1)
    k = torch.arange(per_half).view(1, 1, 1, per_half)
    r, t4 = lane // 4, lane % 4
    # The A operand of m16n8k16: 8*(...) steps between the operand's 8x8 blocks.
    outer = 8 * (per_half * (word % half_w) + k)
    if kind == "k":  # tokens on M, channels on K
        token, channel = r + 8 * (word // half_w), 2 * t4 + half + outer
    else:  # channels on M, tokens on K
        token, channel = 2 * t4 + half + 8 * (word // half_w), r + outer
    flat = (token * head_dim + channel).expand(32, per_lane, 2, per_half)
    vec = min(4, per_lane)  # words per 16-byte vector load
    storage = (word // vec) * 32 * vec + lane * vec + word % vec
    positions = torch.empty(n_words, 2, per_half, dtype=torch.int64)
    positions[storage.expand(32, per_lane, 1, 1).reshape(32, per_lane)] = flat
    assert torch.equal(positions.view(-1).sort().values, torch.arange(n_words * 2 * per_half))
    return positions


def _check_bits(bits: int) -> None:
    if bits not in (2, 4):
        raise ValueError(f"bits={bits!r} is not supported; expected 2 or 4.")
