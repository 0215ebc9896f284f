"""A Llama-3-shaped decoder with seeded random BF16 weights, one decode step at a time.

Speed does not need real weights: the step does the work a real one does (RMSNorm, the QKV
projection, RoPE, the KV append and attention of the chosen backend, the output projection,
the gated MLP, the LM head and a greedy pick of the next token) on tensors of the real shapes.
The weights are scaled so activations stay in range over many layers (a residual branch's
output projection is divided by sqrt(2 x layers)), and the new tokens' K and V come out near
unit scale, like the random prefix the caches start from.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Callable

import torch
import torch.nn.functional as F

BF16 = torch.bfloat16


@dataclass(frozen=True)
class ModelShape:
    """The shapes of a Llama-3-style decoder (`num_layers` may be fewer than the model's, see `full_layers`)."""

    name: str
    num_layers: int
    hidden: int
    num_q_heads: int
    num_kv_heads: int
    head_dim: int
    mlp: int
    vocab: int
    rope_theta: float = 500000.0
    norm_eps: float = 1e-5
    full_layers: int = 0  # the model's own layer count (0: num_layers)

    @property
    def model_layers(self) -> int:
        return self.full_layers or self.num_layers

    @property
    def label(self) -> str:
        if self.num_layers == self.model_layers:
            return self.name
        return f"{self.name} ({self.num_layers} of {self.model_layers} layers)"

    def with_layers(self, n: int) -> "ModelShape":
        if not 1 <= n <= self.model_layers:
            raise ValueError(f"--layers {n} is out of range for {self.name}; expected 1 to {self.model_layers}.")
        return replace(self, num_layers=n, full_layers=self.model_layers)

    def layer_params(self) -> int:
        qkv = self.hidden * (self.num_q_heads + 2 * self.num_kv_heads) * self.head_dim
        out = self.num_q_heads * self.head_dim * self.hidden
        return qkv + out + 3 * self.hidden * self.mlp + 2 * self.hidden

    def params(self) -> int:
        """Parameters of the layers run, plus embedding, final norm and LM head."""
        return self.num_layers * self.layer_params() + 2 * self.vocab * self.hidden + self.hidden

    def weight_bytes(self) -> int:
        return 2 * self.params()

    def activation_bytes(self, batch: int) -> int:
        """A generous bound on one step's live activations (BF16 and the float32 norm/RoPE temporaries)."""
        per_token = 4 * (4 * self.hidden + 2 * (self.num_q_heads + 2 * self.num_kv_heads) * self.head_dim
                         + 3 * self.mlp + 2 * self.vocab)
        return batch * per_token


MODELS: dict[str, ModelShape] = {
    "llama3-8b": ModelShape("llama3-8b", 32, 4096, 32, 8, 128, 14336, 128256),
    "llama3-70b": ModelShape("llama3-70b", 80, 8192, 64, 8, 128, 28672, 128256),
    # For CPU tests: the kernels' head_dim (128) and a GQA group they take.
    "tiny": ModelShape("tiny", 2, 256, 2, 1, 128, 512, 512),
}


def model_shape(name: str) -> ModelShape:
    try:
        return MODELS[name]
    except KeyError:
        raise ValueError(f"--model {name!r} is not a model shape; expected one of {sorted(MODELS)}.") from None


@dataclass
class Layer:
    attn_norm: torch.Tensor  # [hidden]
    wqkv: torch.Tensor  # [(hq + 2 hkv) d, hidden]
    wo: torch.Tensor  # [hidden, hq d]
    mlp_norm: torch.Tensor
    w_gate_up: torch.Tensor  # [2 mlp, hidden]
    w_down: torch.Tensor  # [hidden, mlp]


class Weights:
    """Seeded random BF16 weights of `shape` on `device` (generated there, in place)."""

    def __init__(self, shape: ModelShape, device: torch.device | str, seed: int = 0):
        self.shape = shape
        device = torch.device(device)
        gen = torch.Generator(device=device).manual_seed(seed)

        def normal(*size: int, std: float) -> torch.Tensor:
            t = torch.randn(*size, generator=gen, device=device, dtype=BF16)
            return t.mul_(std)

        h, d, hq, hkv = shape.hidden, shape.head_dim, shape.num_q_heads, shape.num_kv_heads
        branch = 1.0 / math.sqrt(2 * shape.model_layers)
        self.embed = normal(shape.vocab, h, std=1.0)
        self.layers = [
            Layer(
                attn_norm=torch.ones(h, dtype=BF16, device=device),
                wqkv=normal((hq + 2 * hkv) * d, h, std=1 / math.sqrt(h)),
                wo=normal(h, hq * d, std=branch / math.sqrt(hq * d)),
                mlp_norm=torch.ones(h, dtype=BF16, device=device),
                w_gate_up=normal(2 * shape.mlp, h, std=1 / math.sqrt(h)),
                w_down=normal(h, shape.mlp, std=branch / math.sqrt(shape.mlp)),
            )
            for _ in range(shape.num_layers)
        ]
        self.final_norm = torch.ones(h, dtype=BF16, device=device)
        self.lm_head = normal(shape.vocab, h, std=1 / math.sqrt(h))
        half = torch.arange(0, d, 2, device=device, dtype=torch.float32) / d
        self.inv_freq = shape.rope_theta ** (-half)  # [d / 2]

    def nbytes(self) -> int:
        tensors = [self.embed, self.final_norm, self.lm_head]
        for layer in self.layers:
            tensors += [layer.attn_norm, layer.wqkv, layer.wo, layer.mlp_norm, layer.w_gate_up, layer.w_down]
        return sum(t.nbytes for t in tensors)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(BF16) * weight


def rope(x: torch.Tensor, positions: torch.Tensor, inv_freq: torch.Tensor) -> torch.Tensor:
    """Llama rotary embedding (rotate-half) of x [batch, heads, d] at positions [batch]."""
    angle = positions.float()[:, None, None] * inv_freq  # [batch, 1, d/2]
    cos, sin = torch.cos(angle), torch.sin(angle)
    x1, x2 = x.float().chunk(2, dim=-1)
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).to(BF16)


# What a step does for attention: the backend's kernel, nothing (the no-op of the same shapes
# that leaves the output as it is, for the attention share), or a caller's function.
Attention = Callable[[int, torch.Tensor, torch.Tensor], None]


class Decoder:
    """One batch decoding over a GrowingKV: static buffers, so a step can be captured in a CUDA graph.

    tokens [batch] (the last token of each sequence) and positions [batch] (its position, the
    cache length before the step) advance in place each step; logits [batch, vocab] hold the
    last step's output.
    """

    def __init__(self, weights: Weights, kv, first_tokens: torch.Tensor):
        self.w, self.kv, self.shape = weights, kv, weights.shape
        s = self.shape
        if kv.num_layers != s.num_layers or kv.num_kv_heads != s.num_kv_heads or kv.head_dim != s.head_dim:
            raise ValueError(
                f"the KV cache has {kv.num_layers} layers of {kv.num_kv_heads}x{kv.head_dim} but the model "
                f"{s.label} has {s.num_layers} layers of {s.num_kv_heads}x{s.head_dim}.")
        device = weights.embed.device
        self.batch = kv.batch
        self.tokens = first_tokens.to(device=device, dtype=torch.long).clone()
        self.positions = kv.host_lens.to(device=device, dtype=torch.long).clone()
        self.logits = torch.zeros(self.batch, s.vocab, dtype=BF16, device=device)
        self.attn_out = torch.zeros(self.batch, s.num_q_heads, s.head_dim, dtype=BF16, device=device)

    def step(self, flush: bool, attention: str | Attention = "backend") -> None:
        """One decode step (device work only unless `attention` is a host function)."""
        s, w, kv = self.shape, self.w, self.kv
        hq, hkv, d = s.num_q_heads, s.num_kv_heads, s.head_dim
        x = w.embed[self.tokens]
        kv.begin_step(flush)
        for i, layer in enumerate(w.layers):
            h = rms_norm(x, layer.attn_norm, s.norm_eps)
            qkv = F.linear(h, layer.wqkv)
            q = rope(qkv[:, : hq * d].view(self.batch, hq, d), self.positions, w.inv_freq)
            k = rope(qkv[:, hq * d: (hq + hkv) * d].view(self.batch, hkv, d), self.positions, w.inv_freq)
            v = qkv[:, (hq + hkv) * d:].reshape(self.batch, hkv, d)
            kv.append(i, k, v, flush)
            if attention == "backend":
                kv.attend(i, q, self.attn_out)
            elif callable(attention):
                attention(i, q, self.attn_out)
            elif attention != "none":
                raise ValueError(f"attention={attention!r}; expected 'backend', 'none' or a function.")
            x = x + F.linear(self.attn_out.view(self.batch, hq * d), layer.wo)
            h = rms_norm(x, layer.mlp_norm, s.norm_eps)
            gate, up = F.linear(h, layer.w_gate_up).chunk(2, dim=-1)
            x = x + F.linear(F.silu(gate) * up, layer.w_down)
        self.logits.copy_(F.linear(rms_norm(x, w.final_norm, s.norm_eps), w.lm_head))
        self.tokens.copy_(self.logits.argmax(dim=-1))
        self.positions += 1

    def run_step(self, attention: str | Attention = "backend") -> bool:
        """One eager step with the host work around it; returns whether it flushed."""
        flush = self.kv.flush_due()
        if attention == "backend":
            self.kv.plan()
        self.step(flush, attention)
        self.kv.stepped()
        return flush
