"""Building blocks of the Cosmos3 Mixture-of-Transformers, with parameters named like the checkpoint keys.

Mirrors diffusers 0.42.1 ``transformer_cosmos3.py`` (``RMSNorm`` / ``Cosmos3NemotronRMSNorm``,
``Cosmos3VLTextMLP``, ``Cosmos3PackedMoTAttention``, ``Cosmos3VLTextMoTDecoderLayer``, ``DomainAwareLinear``) and
``embeddings.Timesteps`` / ``TimestepEmbedding``. Only parameters live here; the two ways of running a layer
(text prefill, generation step) are in ``transformer.py``.

Precision rules kept from the reference (they decide bf16 results):

* Qwen RMSNorm (silu models): variance and ``x·rsqrt(var+eps)`` in fp32, cast to the weight's half dtype, then
  multiplied by the weight. Nemotron RMSNorm (relu2 models): ``weight.float() · x̂`` in fp32, cast last.
* The timestep embedder is kept in fp32 (``KEEP_FP32``) and its output cast to the model dtype.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from ..config import Cosmos3Config
from ..kernels.gemv import gemv
from ..kernels.packed import LayerWeights
from .fp8 import run_linear
from .precision import StepPrecision

_NO_WEIGHTS = LayerWeights()

# Modules whose weights stay fp32 whatever the model dtype (diffusers `_keep_in_fp32_modules`).
KEEP_FP32 = ("time_embedder",)


class RMSNorm(nn.Module):
    """Per-vector RMSNorm with the rounding point of the reference chosen by ``kind`` ("qwen" | "nemotron")."""

    def __init__(self, dim: int, eps: float, kind: str):
        super().__init__()
        self.eps = eps
        self.kind = kind
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        variance = x.float().pow(2).mean(-1, keepdim=True)
        if self.kind == "nemotron":
            return (self.weight.float() * (x.float() * torch.rsqrt(variance + self.eps))).to(x.dtype)
        y = x * torch.rsqrt(variance + self.eps)  # promotes to fp32
        if self.weight.dtype in (torch.float16, torch.bfloat16):
            y = y.to(self.weight.dtype)
        return y * self.weight


def transformers_rms_norm(norm: RMSNorm, x: torch.Tensor) -> torch.Tensor:
    """``norm`` applied with transformers' rounding (``Qwen3VLTextRMSNorm`` / ``LlamaRMSNorm``, which the reasoner
    mirrors): fp32 statistics, cast back to the input dtype, then × weight. Equal to ``RMSNorm`` in fp32; in bf16 it
    differs from diffusers' Nemotron rounding (Edge), so the reasoner and the generator each keep their reference's."""
    x32 = x.float()
    y = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + norm.eps)
    return norm.weight * y.to(x.dtype)


def module_rms_norm(norm: RMSNorm, x: torch.Tensor) -> torch.Tensor:
    """``norm`` with the generator's (diffusers') rounding: the module itself."""
    return norm(x)


class MLP(nn.Module):
    """SwiGLU ``down(silu(gate(x))·up(x))`` (silu) or ``down(relu(up(x))²)`` (relu2); no biases."""

    def __init__(self, config: Cosmos3Config, linear: type[nn.Linear]):
        super().__init__()
        d, f = config.hidden_size, config.intermediate_size
        self.act = config.hidden_act
        if self.act == "silu":
            self.gate_proj = linear(d, f, bias=False)
        self.up_proj = linear(d, f, bias=False)
        self.down_proj = linear(f, d, bias=False)

    def forward(self, x: torch.Tensor, weights: LayerWeights | None = None, precision: StepPrecision | None = None
                ) -> torch.Tensor:
        """``weights`` (a one-row decode step, packed.py): ``gate_up`` (``gate_proj`` and ``up_proj`` packed as one
        matrix), ``up`` and ``down`` read by one GEMV each (gemv.py); a None entry runs its module. ``precision``:
        the step's FP8 modes (``fp8.run_linear``)."""
        w = weights or _NO_WEIGHTS
        if self.act == "relu2":
            up = torch.relu(project(self.up_proj, x, w.up, w.route, precision)).square()
            return project(self.down_proj, up, w.down, w.route, precision)
        if w.gate_up is None:
            gate, up = run_linear(self.gate_proj, x, precision), run_linear(self.up_proj, x, precision)
        else:
            gate, up = gemv(x, w.gate_up, w.route).chunk(2, dim=-1)
        return project(self.down_proj, F.silu(gate) * up, w.down, w.route, precision)


def project(module: nn.Module, x: torch.Tensor, weight: torch.Tensor | None, route: str = "auto",
            precision: StepPrecision | None = None) -> torch.Tensor:
    """``module(x)`` (in the step's FP8 mode, ``fp8.run_linear``), or one GEMV over ``weight`` (the module's own
    plain weight, packed.py) on ``route`` where one is given."""
    return run_linear(module, x, precision) if weight is None else gemv(x, weight, route)


class MoTAttention(nn.Module):
    """Projections and per-head norms of both towers (``self_attn``); the attention itself is in transformer.py.

    Understanding (text) tower: ``to_q/to_k/to_v/to_out`` + ``norm_q/norm_k`` (absent when ``qk_norm_for_text`` is
    false) + ``k_norm_und_for_gen`` (Edge: normalises the text keys the generation tower reads).
    Generation tower: ``add_q_proj/add_k_proj/add_v_proj/to_add_out`` + ``norm_added_q/norm_added_k``.
    """

    def __init__(self, config: Cosmos3Config, linear: type[nn.Linear]):
        super().__init__()
        d, hd, bias = config.hidden_size, config.head_dim, config.attention_bias
        kind, eps = config.norm_kind, config.rms_norm_eps
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = hd
        self.to_q = linear(d, config.q_width, bias=bias)
        self.to_k = linear(d, config.kv_width, bias=bias)
        self.to_v = linear(d, config.kv_width, bias=bias)
        self.to_out = linear(config.q_width, d, bias=bias)
        self.norm_q = RMSNorm(hd, eps, kind) if config.qk_norm_for_text else None
        self.norm_k = RMSNorm(hd, eps, kind) if config.qk_norm_for_text else None
        wants_gen_k_norm = config.use_und_k_norm_for_gen and not config.qk_norm_for_text
        self.k_norm_und_for_gen = RMSNorm(hd, eps, kind) if wants_gen_k_norm else None
        self.add_q_proj = linear(d, config.q_width, bias=bias)
        self.add_k_proj = linear(d, config.kv_width, bias=bias)
        self.add_v_proj = linear(d, config.kv_width, bias=bias)
        self.to_add_out = linear(config.q_width, d, bias=bias)
        self.norm_added_q = RMSNorm(hd, eps, kind)
        self.norm_added_k = RMSNorm(hd, eps, kind)


class DecoderLayer(nn.Module):
    """One MoT layer: shared attention, separate norms/MLPs per tower (``*_moe_gen`` = generation tower)."""

    def __init__(self, config: Cosmos3Config, linear: type[nn.Linear]):
        super().__init__()
        d, eps, kind = config.hidden_size, config.rms_norm_eps, config.norm_kind
        self.self_attn = MoTAttention(config, linear)
        self.mlp = MLP(config, linear)
        self.mlp_moe_gen = MLP(config, linear)
        self.input_layernorm = RMSNorm(d, eps, kind)
        self.post_attention_layernorm = RMSNorm(d, eps, kind)
        self.input_layernorm_moe_gen = RMSNorm(d, eps, kind)
        self.post_attention_layernorm_moe_gen = RMSNorm(d, eps, kind)


def sinusoidal_timestep(timesteps: torch.Tensor, dim: int = 256, max_period: float = 10000.0) -> torch.Tensor:
    """``[N] -> [N, dim]`` as diffusers ``Timesteps(dim, flip_sin_to_cos=True, downscale_freq_shift=0)``: [cos, sin]."""
    half = dim // 2
    exponent = -math.log(max_period) * torch.arange(half, dtype=torch.float32, device=timesteps.device) / half
    angles = timesteps[:, None].float() * torch.exp(exponent)[None, :]
    return torch.cat([torch.cos(angles), torch.sin(angles)], dim=-1)


class TimestepEmbedder(nn.Module):
    """``linear_2(silu(linear_1(sinusoid(t))))``, kept fp32 (``time_embedder``)."""

    def __init__(self, hidden_size: int, linear: type[nn.Linear], in_channels: int = 256):
        super().__init__()
        self.in_channels = in_channels
        self.linear_1 = linear(in_channels, hidden_size, bias=True)
        self.linear_2 = linear(hidden_size, hidden_size, bias=True)

    def forward(self, scaled_timesteps: torch.Tensor) -> torch.Tensor:
        x = sinusoidal_timestep(scaled_timesteps, self.in_channels).to(self.linear_1.weight.dtype)
        return self.linear_2(F.silu(self.linear_1(x)))


class DomainAwareLinear(nn.Module):
    """Per-embodiment linear map ``y = x @ W[d] + b[d]`` with ``W[d]`` stored flat as ``[in·out]`` (layout [in,
    out])."""

    def __init__(self, in_features: int, out_features: int, num_domains: int):
        super().__init__()
        self.in_features = in_features
        self.out_features = out_features
        self.fc = nn.Embedding(num_domains, in_features * out_features)
        self.bias = nn.Embedding(num_domains, out_features)

    def forward(self, x: torch.Tensor, domain_id: torch.Tensor) -> torch.Tensor:
        """``x`` ``[..., in]``, ``domain_id`` a one-element long tensor (one embodiment per request)."""
        weight = self.fc(domain_id.reshape(1)).view(self.in_features, self.out_features)
        return x @ weight + self.bias(domain_id.reshape(1)).view(self.out_features)
