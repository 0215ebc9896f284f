"""The bit layout of the packed 2/4-bit codes (docs/FORMAT.md): pack, unpack, extraction, radix factors.

This module is the only code that knows the layout; everything else asks it. K and V are packed
in blocks of their own size (`block_tokens`): K in 16-token tiles whose words are the A
fragments of a 16-row MMA (tokens on M, channels on K), V in 64-token blocks whose words are
the A fragments each warp of a warpgroup holds for O^T = V^T P^T (channels on M, tokens on K).
How the kernels read a word (`extraction_schedule`) is part of the layout: K reads as fp16
operands 1024 + f c, V as fp16 subnormals f c 2^-24 (no bias), and the radix factor f of each
position folds into the query (K) or into the output channel (V).
"""
from __future__ import annotations

import functools
from typing import NamedTuple

import torch

TILE_TOKENS = 16  # rows of one packed storage row (and of one K tile)
BLOCK_TOKENS = {"k": 16, "v": 64}
KINDS = ("k", "v")
HEAD_DIMS = (64, 128, 256)


class Operand(NamedTuple):
    """What a kind's codes become: values bias + unit f c of type dtype; bias_pair is the bias's
    bits in both halves of a word (OR-ed in by the extraction)."""
    dtype: str
    bias: float
    bias_pair: int
    unit: float


# V's operands are the masked bits alone: an fp16 whose exponent field is 0 or 1 is worth its bit
# pattern times 2^-24, and with no bias the Tensor Cores' cut toward zero has nothing of one sign
# to take (docs/PERFORMANCE.md, v23).
FP16_1024_PAIR = 0x64006400
FP16_PATTERN_UNIT = 2.0**-24
OPERANDS = {"k": Operand("fp16", 1024.0, FP16_1024_PAIR, 1.0), "v": Operand("fp16", 0.0, 0, FP16_PATTERN_UNIT)}

# INT2 V: per 16-bit half, positions k = 0..7 hold (channel block b, token offset o); each block's
# two positions read at the same radix factor, so the factor folds into the output channel.
_V2_SLOT = {3: (0, 0), 7: (0, 1), 1: (1, 0), 5: (1, 1), 4: (2, 0), 0: (2, 1), 2: (3, 0), 6: (3, 1)}
# The extraction's mark for "the two bytes of each 16-bit half swapped" (the kernels' one PRMT,
# kSwapHalves), in place of a shift.
SWAP_HALVES = 16


def block_tokens(kind: str) -> int:
    """Tokens in one packed block of `kind` ('k' or 'v'): the unit pack_tiles/unpack_tiles work on."""
    _check_kind(kind)
    return BLOCK_TOKENS[kind]


def words_per_tile(bits: int, head_dim: int) -> int:
    """int32 words of one 16-token storage row (the cache's code tensors are [..., page/16, this])."""
    return TILE_TOKENS * head_dim * bits // 32


def words_per_block(bits: int, kind: str, head_dim: int) -> int:
    """int32 words holding one packed block of `kind`."""
    return block_tokens(kind) * head_dim * bits // 32


def positions_per_half(bits: int) -> int:
    """Code positions k inside each 16-bit half of a word (P in FORMAT.md)."""
    return 16 // bits


def extraction_schedule(bits: int, kind: str) -> tuple[tuple[int, int], ...]:
    """(shift, mask) reading position k of a word, for k = 0 .. P-1: `((word >> shift) & mask)`
    (a negative shift shifts left; SWAP_HALVES swaps the two bytes of each half instead) OR-ed
    with the kind's bias pair is two operands bias + unit f_k c (OPERANDS)."""
    _check_bits(bits)
    _check_kind(kind)
    pair = 0x00010001
    if kind == "k":  # fp16, 10 mantissa bits: one right shift per word serves every position
        if bits == 4:
            return ((0, 0xF * pair), (0, 0xF0 * pair), (8, 0xF * pair), (8, 0xF0 * pair))
        return tuple((0, (3 << 2 * k) * pair) for k in range(5)) + tuple((10, (3 << 2 * k) * pair) for k in range(3))
    # V, fp16 subnormals (bits 0-10, no bias): INT4 as K; INT2 so that the two positions of one
    # channel block share a factor (see _V2_SLOT), every code at f >= 4: 1-4 in place at bits 2-9,
    # and 5, 6, 7, 0 at bits 2-9 of the word with each half's bytes swapped.
    if bits == 4:
        return ((0, 0xF * pair), (0, 0xF0 * pair), (8, 0xF * pair), (8, 0xF0 * pair))
    return ((SWAP_HALVES, 0x300 * pair), (0, 0xC * pair), (0, 0x30 * pair), (0, 0xC0 * pair),
            (0, 0x300 * pair), (SWAP_HALVES, 0xC * pair), (SWAP_HALVES, 0x30 * pair), (SWAP_HALVES, 0xC0 * pair))


def k8_schedule(bits: int) -> tuple[tuple[int, int], ...]:
    """(shift, mask) of int8 register i of a K word (v24, docs/FORMAT.md): `(word >> shift) &
    mask` holds one code per byte, worth f c with f = the mask's lowest set bit (1 or 4); the
    kernels' extract_k8."""
    _check_bits(bits)
    if bits == 4:
        return ((0, 0x0F0F0F0F), (4, 0x0F0F0F0F))
    return ((0, 0x03030303), (0, 0x0C0C0C0C), (4, 0x03030303), (4, 0x0C0C0C0C))


def k8_channels(bits: int, head_dim: int = 128) -> torch.Tensor:
    """The channel of each k-column of the int8 K operands, int64 [head_dim // 32 k-steps, 32]:
    k-step ks, column 16 hf + 4 t4 + b is byte b of register (2 ks + hf) % R of word (2 ks + hf)
    // R of lane (g, t4) (R registers per word), whose code sits at bit 8 b + shift + lsb(mask)."""
    sched = k8_schedule(bits)
    regs, per_half = len(sched), positions_per_half(bits)
    out = torch.empty(head_dim // 32, 32, dtype=torch.int64)
    for ks in range(head_dim // 32):
        for col in range(32):
            hf, t4, b = col // 16, (col % 16) // 4, col % 4
            q = 2 * ks + hf
            shift, mask = sched[q % regs]
            bit = 8 * b + shift + ((mask & -mask).bit_length() - 1)
            out[ks, col] = 2 * t4 + bit // 16 + 8 * (per_half * (q // regs) + (bit % 16) // bits)
    return out


def radix_factors(bits: int, kind: str) -> list[int]:
    """f_k: what a code at position k is worth once extracted."""
    return [mask & -mask for _, mask in extraction_schedule(bits, kind)]


def extract(words: torch.Tensor, bits: int, kind: str, k: int) -> torch.Tensor:
    """Position k of int32 words as the kernels read it (the operand's bits, bias included)."""
    shift, mask = extraction_schedule(bits, kind)[k]
    if shift == SWAP_HALVES:
        shifted = ((words >> 8) & 0x00FF00FF) | ((words << 8) & ~0x00FF00FF)  # int32: 0xFF00FF00
    else:
        shifted = words << -shift if shift < 0 else words >> shift
    return (shifted & mask) | OPERANDS[kind].bias_pair


def channel_positions(bits: int, kind: str, head_dim: int) -> torch.Tensor:
    """The first position k of every channel, int64 [head_dim] (V INT2 holds a channel at two
    positions with equal factors)."""
    return _layout(bits, kind, head_dim, torch.device("cpu")).channel_position.clone()


def channel_radix(bits: int, kind: str, head_dim: int) -> torch.Tensor:
    """Radix factor f of every channel, int64 [head_dim], to fold into Q (K) or the output (V)."""
    factors = torch.tensor(radix_factors(bits, kind), dtype=torch.int64)
    return factors[channel_positions(bits, kind, head_dim)]


def tile_positions(bits: int, kind: str, head_dim: int) -> torch.Tensor:
    """Where each code of a block goes: int64 [words_per_block, 2 halves, P positions] -> token*head_dim + channel.

    Indexed by the word's storage index inside the block, so words[i] half h position k holds the
    code of (token, channel) = divmod(tile_positions[i, h, k], head_dim).
    """
    return _layout(bits, kind, head_dim, torch.device("cpu")).positions.clone()


def pack_tiles(codes: torch.Tensor, bits: int, kind: str) -> torch.Tensor:
    """Pack codes [n, block_tokens(kind), head_dim] (token, channel), each < 2^bits, into int32
    [n, words_per_block]."""
    _check_kind(kind)
    blk = block_tokens(kind)
    if codes.dim() != 3 or codes.shape[1] != blk:
        raise ValueError(
            f"codes of shape {tuple(codes.shape)} are not {kind.upper()} blocks; expected "
            f"[n_blocks, {blk}, head_dim]."
        )
    n_blocks, _, head_dim = codes.shape
    layout = _layout(bits, kind, head_dim, codes.device)
    per_half = positions_per_half(bits)
    # Gather every code to its (word, half, position) slot, then OR the positions into 16-bit halves.
    slots = codes.reshape(n_blocks, -1)[:, layout.positions.view(-1)].to(torch.int32)
    slots = slots.view(n_blocks, -1, 2, per_half)
    shifts = torch.arange(per_half, device=codes.device, dtype=torch.int32) * bits
    halves = (slots << shifts).sum(dim=-1, dtype=torch.int32)  # each half < 2^16: no overflow
    low, high = halves[..., 0], halves[..., 1]
    # Make the high half a signed 16-bit value so high * 2^16 + low stays inside int32.
    high = high - ((high >> 15) << 16)
    return high * 65536 + low


def unpack_tiles(words: torch.Tensor, bits: int, kind: str, head_dim: int) -> torch.Tensor:
    """Inverse of pack_tiles: int32 [n, words_per_block] -> uint8 codes [n, block_tokens(kind), head_dim]."""
    _check_kind(kind)
    expected = words_per_block(bits, kind, head_dim)
    if words.dim() != 2 or words.shape[1] != expected or words.dtype != torch.int32:
        raise ValueError(
            f"words of shape {tuple(words.shape)} and dtype {words.dtype} are not packed {kind.upper()} "
            f"blocks; expected int32 [n_blocks, {expected}] for bits={bits}, head_dim={head_dim}."
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
    return codes.view(words.shape[0], block_tokens(kind), head_dim)


class _Layout:
    """Index maps of one (bits, kind, head_dim) on one device."""

    def __init__(self, positions: torch.Tensor, head_dim: int, factors: list[int]) -> None:
        self.positions = positions  # [words, 2, P] -> token * head_dim + channel
        self.inverse = torch.argsort(positions.view(-1))  # token * head_dim + channel -> slot
        channel = (positions % head_dim).reshape(-1)
        per_half = positions.shape[-1]
        position_k = torch.arange(per_half, device=positions.device).expand_as(positions).reshape(-1)
        first = torch.full((head_dim,), per_half, dtype=torch.int64, device=positions.device)
        self.channel_position = first.scatter_reduce(0, channel, position_k, reduce="amin")
        # The radix fold needs one factor per channel, whatever the token.
        f = torch.tensor(factors, device=positions.device)[position_k]
        f_first = f.new_zeros(head_dim).scatter_reduce(0, channel, f, reduce="amax")
        assert bool((f == f_first[channel]).all()), "a channel is read at two radix factors"


@functools.lru_cache(maxsize=None)
def _layout(bits: int, kind: str, head_dim: int, device: torch.device) -> _Layout:
    return _Layout(_positions(bits, kind, head_dim).to(device), head_dim, radix_factors(bits, kind))


def _positions(bits: int, kind: str, head_dim: int) -> torch.Tensor:
    """The FORMAT.md formulas, evaluated for every (lane, word, half, position) of a block."""
    _check_bits(bits)
    _check_kind(kind)
    if head_dim not in HEAD_DIMS:
        raise ValueError(f"head_dim={head_dim} is not supported; expected 64, 128 or 256.")
    positions = _k_positions(bits, head_dim) if kind == "k" else _v_positions(bits, head_dim)
    n = positions.numel()
    assert torch.equal(positions.view(-1).sort().values, torch.arange(n))
    return positions


def _k_positions(bits: int, head_dim: int) -> torch.Tensor:
    """K tile (16 tokens): lane (r, t4) word w half h position k -> token r + 8 (w // (W/2)),
    channel 2 t4 + h + 8 (P (w % (W/2)) + k); stored [W/V][32 lanes][V]."""
    n_words = words_per_tile(bits, head_dim)
    per_lane = n_words // 32  # W
    per_half = positions_per_half(bits)  # P
    half_w = per_lane // 2
    lane = torch.arange(32).view(32, 1, 1, 1)
    word = torch.arange(per_lane).view(1, per_lane, 1, 1)
    half = torch.arange(2).view(1, 1, 2, 1)
    k = torch.arange(per_half).view(1, 1, 1, per_half)
    r, t4 = lane // 4, lane % 4
    token = r + 8 * (word // half_w)
    channel = 2 * t4 + half + 8 * (per_half * (word % half_w) + k)
    flat = (token * head_dim + channel).expand(32, per_lane, 2, per_half)
    vec = min(4, per_lane)  # words per 16-byte vector load
    storage = (word // vec) * 32 * vec + lane * vec + word % vec
    positions = torch.empty(n_words, 2, per_half, dtype=torch.int64)
    positions[storage.expand(32, per_lane, 1, 1).reshape(32, per_lane)] = flat
    return positions


def _v_positions(bits: int, head_dim: int) -> torch.Tensor:
    """V block (64 tokens): warp w of the warpgroup owns channels 32 w .. 32 w + 31; lane (g, t4)
    word i half h position k -> channel 32 w + 8 b + g and token 16 kt + 2 t4 + h + 8 o, where
    INT4: i = 2 kt + o, b = k; INT2: i = kt, (b, o) = _V2_SLOT[k]. Stored [warp][W/4][32 lanes][4]."""
    warps = head_dim // 32
    per_lane = 2 * bits  # words per lane per block: 64 tokens x 32 channels x bits / 32 / 32
    per_half = positions_per_half(bits)
    positions = torch.empty(warps * 32 * per_lane, 2, per_half, dtype=torch.int64)
    for w in range(warps):
        for lane in range(32):
            g, t4 = lane // 4, lane % 4
            for i in range(per_lane):
                index = w * 32 * per_lane + (i // 4) * 128 + lane * 4 + i % 4
                for h in range(2):
                    for k in range(per_half):
                        if bits == 4:
                            kt, o, b = i // 2, i % 2, k
                        else:
                            kt, (b, o) = i, _V2_SLOT[k]
                        token = 16 * kt + 2 * t4 + h + 8 * o
                        positions[index, h, k] = token * head_dim + 32 * w + 8 * b + g
    return positions


def _check_bits(bits: int) -> None:
    if bits not in (2, 4):
        raise ValueError(f"bits={bits!r} is not supported; expected 2 or 4.")


def _check_kind(kind: str) -> None:
    if kind not in KINDS:
        raise ValueError(f"kind={kind!r} is not a tensor kind; expected 'k' or 'v'.")
